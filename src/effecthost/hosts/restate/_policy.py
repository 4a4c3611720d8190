"""The payload policy both sides of a deployment share: the endpoint (which encodes each
outcome before it settles) and every caller-side controller (which decodes it)."""

from __future__ import annotations

import os

from effecthost.payloads import (
    DEFAULT_INLINE_THRESHOLD,
    AesGcmSealer,
    FileKeyStore,
    FilesystemPayloadStore,
    PayloadPolicy,
)


def file_payload_policy(
    payload_dir: str | os.PathLike[str],
    key_dir: str | os.PathLike[str] | None = None,
    *,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
) -> PayloadPolicy:
    """A :class:`~effecthost.payloads.PayloadPolicy` over directories: outcomes above
    ``inline_threshold`` bytes in a :class:`~effecthost.payloads.FilesystemPayloadStore`
    at ``payload_dir``; with ``key_dir``, every outcome sealed (AES-256-GCM) with keys of a
    :class:`~effecthost.payloads.FileKeyStore` there.

    Give the endpoint and every controller the same two directories (a shared volume):
    a controller without ``key_dir`` refuses sealed outcomes with
    ``SealedPayloadUnreadable``, one with another key directory too.

    Raises:
        MissingExtra: ``key_dir`` is given but ``cryptography`` is not installed.
        ValueError: a negative ``inline_threshold``.
    """
    sealer = AesGcmSealer(FileKeyStore(key_dir)) if key_dir is not None else None
    return PayloadPolicy(
        store=FilesystemPayloadStore(payload_dir),
        inline_threshold=inline_threshold,
        sealer=sealer,
    )
