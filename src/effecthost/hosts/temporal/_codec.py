"""The Temporal tier's payload codec: the shared AES-256-GCM sealing over every payload
Temporal records (G-50).

:class:`SealingCodec` seals each payload (workflow and activity inputs and results, update
and query arguments and results, memos, failures' details; with
:func:`sealed_data_converter` also failure messages and stack traces) with the same
:class:`~effecthost.payloads.AesGcmSealer` the hosts use for settlements, under one key
scope (:data:`CODEC_SCOPE`) of the configured :class:`~effecthost.payloads.KeyStore`.
Workflow ids (group keys), search attributes and visibility stay plaintext: put no secret
in a group key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from effecthost.contract import SealedPayloadUnreadable, canonical_json
from effecthost.hosts import require
from effecthost.payloads import AesGcmSealer, KeyStore, SealedEnvelope

require("temporal", "temporal", "temporalio")

from pydantic import ValidationError  # noqa: E402
from temporalio.api.common.v1 import Payload  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.converter import (  # noqa: E402
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)

CODEC_ENCODING = b"binary/effecthost-sealed"
"""The ``encoding`` metadata of a sealed payload (the only plaintext metadata it keeps)."""

CODEC_SCOPE = "effecthost.temporal.codec"
"""The key scope the codec seals under. Destroying it makes every sealed history of the
deployment unreadable (the workflows too): per-group erasure is the settlement sealing's
job (scope of the group key), not the codec's."""

_SLOT = ("effecthost.temporal.payload", "payload")
"""The fixed slot (associated data) of codec-sealed payloads. A codec sees a payload and
nothing of where it sits (no workflow id, event id, group key, replay key or position), so
it binds only this fixed slot and no position: a codec-sealed payload moved to another
place in the same deployment's history still opens. Settlement outcomes are additionally
sealed per slot and position by the worker's payload policy (G-48, R-10)."""


class SealingCodec(PayloadCodec):
    """AES-256-GCM over whole payloads (metadata and data), keys from ``keys``.

    ``decode`` passes through payloads it did not seal (a plaintext payload of a process
    without the codec) and raises :class:`~effecthost.contract.SealedPayloadUnreadable`
    (ids only) or :class:`~effecthost.contract.PayloadShredded` for a sealed payload it
    cannot open. In a worker that fails the workflow or activity task (retried); in a
    caller the controller turns it into the typed error of the read.
    """

    def __init__(self, keys: KeyStore, *, scope: str = CODEC_SCOPE) -> None:
        self.keys = keys
        self.scope = scope
        self._sealer = AesGcmSealer(keys, scope_of=lambda _group_key: scope)

    def __repr__(self) -> str:
        return f"SealingCodec(scope={self.scope!r})"

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        sealed = []
        for payload in payloads:
            envelope = self._sealer.seal(*_SLOT, payload.SerializeToString(), position=None)
            sealed.append(
                Payload(
                    metadata={"encoding": CODEC_ENCODING},
                    data=canonical_json(envelope.model_dump(mode="json")),
                )
            )
        return sealed

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        opened = []
        for payload in payloads:
            if payload.metadata.get("encoding") != CODEC_ENCODING:
                opened.append(payload)
                continue
            envelope = _envelope_or_none(payload.data)
            if envelope is None:
                raise _malformed()
            opened.append(Payload.FromString(self._sealer.open(*_SLOT, envelope, position=None)))
        return opened


def _envelope_or_none(data: bytes) -> SealedEnvelope | None:
    try:
        return SealedEnvelope.model_validate(json.loads(data))
    except (ValueError, ValidationError):
        return None


def _malformed() -> SealedPayloadUnreadable:
    return SealedPayloadUnreadable(
        "a sealed Temporal payload is malformed", group_key=_SLOT[0], replay_key=_SLOT[1]
    )


def is_sealed_payload_error(exc: BaseException) -> bool:
    """True for the error a converter *without* the codec raises on a sealed payload."""
    return isinstance(exc, KeyError) and CODEC_ENCODING.decode() in str(exc)


def sealed_data_converter(keys: KeyStore, *, scope: str = CODEC_SCOPE) -> DataConverter:
    """The default data converter with :class:`SealingCodec` and failure messages and
    stack traces moved into (sealed) payloads."""
    return dataclasses.replace(
        DataConverter.default,
        payload_codec=SealingCodec(keys, scope=scope),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def sealed_client(client: Client, keys: KeyStore, *, scope: str = CODEC_SCOPE) -> Client:
    """The client helper: ``client`` (same connection and namespace) with the sealing
    data converter. Use it for the worker and for every caller of the deployment."""
    config: Any = client.config()
    config["data_converter"] = sealed_data_converter(keys, scope=scope)
    return Client(**config)


async def connect_sealed(
    address: str, keys: KeyStore | None, *, namespace: str = "default", **options: Any
) -> Client:
    """``Client.connect`` with the sealing data converter when ``keys`` is given."""
    if keys is not None:
        options["data_converter"] = sealed_data_converter(keys)
    return await Client.connect(address, namespace=namespace, **options)
