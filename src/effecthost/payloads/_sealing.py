"""AES-256-GCM sealing bound to a slot (G-48, G-49, G-50).

A sealed value is a :class:`SealedEnvelope`: format tag, cipher id, scope, key id, a fresh
random 96-bit nonce and the ciphertext (with its tag). The associated data binds it to its
slot: format tag, cipher id, scope, key id, group key, replay key and the child's position
(R-10; never the rank, which is assigned after sealing). A sealed value moved to another
slot, position or group therefore fails to open.

``cryptography`` is imported when an :class:`AesGcmSealer` is built, so this module (and
``effecthost.payloads``) imports without the ``sealing`` extra.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from effecthost.contract import PayloadShredded, SealedPayloadUnreadable, canonical_json

from ._keys import KeyStore

SEALED_FORMAT: Final = "effecthost.sealed/2"
"""The format tag of a sealed envelope; part of the associated data. Format ``/1`` (before
the position was bound, R-10) is refused by name, never opened."""

FORMAT_PREFIX: Final = "effecthost.sealed/"
"""What every format tag starts with: the shape guard recognises any version."""

ID_CHARS = 48
"""The longest id (cipher, key id, scope, format) an error quotes from an envelope, which
may be forged: a longer field is named by its length only, so it cannot carry ciphertext
into a message."""

AES_256_GCM = "aes-256-gcm"
"""The one cipher id this release seals with."""

NONCE_BYTES = 12


def default_scope(group_key: str) -> str:
    """The scope id of a group key (the part before ``:group:``), or the whole key when
    it was not built by :func:`effecthost.contract.group_key`."""
    scope, found, _ = group_key.rpartition(":group:")
    return scope if found and scope else group_key


class SealedEnvelope(BaseModel):
    """What a sealed value is stored as. Every field but ``ciphertext`` is an id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = SEALED_FORMAT
    cipher: str = Field(min_length=1)
    scope: str
    key_id: str = Field(min_length=1)
    nonce: str
    ciphertext: str

    def __repr__(self) -> str:  # never print ciphertext
        return (
            f"SealedEnvelope(cipher={self.cipher!r}, scope={self.scope!r}, "
            f"key_id={self.key_id!r}, bytes={len(self.ciphertext)})"
        )

    __str__ = __repr__


def associated_data(
    envelope_ids: tuple[str, str, str], group_key: str, replay_key: str, position: int | None
) -> bytes:
    """The associated data for ``(cipher, scope, key_id)`` in slot (group key, replay key,
    position). ``position`` is ``None`` only for a value that has no child position (the
    Temporal payload codec's fixed slot)."""
    cipher, scope, key_id = envelope_ids
    return canonical_json([SEALED_FORMAT, cipher, scope, key_id, group_key, replay_key, position])


def _tagged(value: dict[Any, Any]) -> bool:
    tag = value.get("format")
    return isinstance(tag, str) and tag.startswith(FORMAT_PREFIX) and len(tag) > len(FORMAT_PREFIX)


def looks_sealed(value: Any) -> bool:
    """True if ``value`` holds, at any depth of its dicts and lists, a mapping whose
    ``format`` is a sealed format tag (any version): the shape guard of ADR 0130 D2. Such a
    value is never handed to a caller as if it were plaintext; relay foreign ciphertext as
    a string. The walk is iterative, so depth cannot exhaust the stack."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if _tagged(item):
                return True
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False


def _short(text: str) -> str:
    return text if len(text) <= ID_CHARS else f"<{len(text)} characters>"


class Sealer:
    """Seals and opens bytes for a slot. Subclasses choose the cipher."""

    cipher: str = ""

    def seal(
        self, group_key: str, replay_key: str, plaintext: bytes, *, position: int | None
    ) -> SealedEnvelope:
        """Seal ``plaintext`` for slot (``group_key``, ``replay_key``, ``position``)."""
        raise NotImplementedError

    def open(
        self, group_key: str, replay_key: str, envelope: SealedEnvelope, *, position: int | None
    ) -> bytes:
        """Open ``envelope`` read from slot (``group_key``, ``replay_key``, ``position``).

        Raises:
            SealedPayloadUnreadable: see the concrete sealer.
            PayloadShredded: see the concrete sealer.
        """
        raise NotImplementedError


class AesGcmSealer(Sealer):
    """AES-256-GCM with keys from a :class:`KeyStore`; a fresh random nonce per seal.

    Args:
        keys: where keys come from; new seals use the scope's newest key.
        scope_of: maps a group key to the key scope (the unit of erasure); default
            :func:`default_scope`.

    Raises:
        MissingExtra: ``cryptography`` is not installed (``effecthost[sealing]``).
    """

    cipher = AES_256_GCM

    def __init__(self, keys: KeyStore, *, scope_of: Callable[[str], str] = default_scope) -> None:
        from effecthost.hosts import require

        aead, exceptions = require(
            "sealing",
            "sealing",
            "cryptography.hazmat.primitives.ciphers.aead",
            "cryptography.exceptions",
        )
        self._aesgcm: Any = aead.AESGCM
        self._invalid_tag: type[Exception] = exceptions.InvalidTag
        self.keys = keys
        self.scope_of = scope_of

    def __repr__(self) -> str:
        return f"AesGcmSealer(keys={self.keys!r})"

    def seal(
        self, group_key: str, replay_key: str, plaintext: bytes, *, position: int | None
    ) -> SealedEnvelope:
        scope = self.scope_of(group_key)
        key_id, material = self.keys.current(scope)
        nonce = secrets.token_bytes(NONCE_BYTES)
        aad = associated_data((self.cipher, scope, key_id), group_key, replay_key, position)
        ciphertext = self._aesgcm(material).encrypt(nonce, plaintext, aad)
        return SealedEnvelope(
            cipher=self.cipher,
            scope=scope,
            key_id=key_id,
            nonce=base64.b64encode(nonce).decode("ascii"),
            ciphertext=base64.b64encode(ciphertext).decode("ascii"),
        )

    def open(
        self, group_key: str, replay_key: str, envelope: SealedEnvelope, *, position: int | None
    ) -> bytes:
        """Open a sealed value read from slot (``group_key``, ``replay_key``, ``position``).

        Raises:
            SealedPayloadUnreadable: the format is not this release's (``/1`` predates the
                position binding); the cipher id is not AES-256-GCM; this key store has
                no key with the envelope's key id in its scope (and did not destroy one);
                the nonce or ciphertext is not valid base64 or has the wrong length; or
                authentication failed (a wrong key, tampered bytes, or the value was
                sealed for another slot, position or group). Ids only in the message.
            PayloadShredded: this key store destroyed the envelope's key (crypto-erasure).
        """
        ids = (
            f"(cipher {_short(envelope.cipher)!r}, key {_short(envelope.key_id)!r}, "
            f"scope {_short(envelope.scope)!r})"
        )
        if envelope.format != SEALED_FORMAT:
            raise unreadable(
                group_key,
                replay_key,
                f"it is sealed in format {_short(envelope.format)!r}; this release opens "
                f"{SEALED_FORMAT!r} only {ids}",
                position=position,
            )
        if envelope.cipher != self.cipher:
            raise unreadable(
                group_key, replay_key, f"it uses an unknown cipher id {ids}", position=position
            )
        material = self.keys.lookup(envelope.scope, envelope.key_id)
        if material is None:
            if self.keys.destroyed(envelope.scope, envelope.key_id):
                raise PayloadShredded(
                    f"the key of the sealed outcome of child {replay_key!r} in group "
                    f"{group_key!r} was destroyed {ids}",
                    group_key=group_key,
                    replay_key=replay_key,
                    position=position,
                )
            raise unreadable(
                group_key, replay_key, f"this key store has no such key {ids}", position=position
            )
        nonce = _b64(envelope.nonce)
        ciphertext = _b64(envelope.ciphertext)
        if nonce is None or ciphertext is None or len(nonce) != NONCE_BYTES:
            raise unreadable(
                group_key, replay_key, f"the envelope is malformed {ids}", position=position
            )
        aad = associated_data(
            (envelope.cipher, envelope.scope, envelope.key_id), group_key, replay_key, position
        )
        plaintext: bytes | None = None
        try:
            plaintext = self._aesgcm(material).decrypt(nonce, ciphertext, aad)
        except self._invalid_tag:
            pass
        if plaintext is None:  # raised outside the handler: no chained context
            raise unreadable(
                group_key,
                replay_key,
                "authentication failed: wrong key, tampered, or sealed for another slot "
                f"or position {ids}",
                position=position,
            )
        return bytes(plaintext)


def unreadable(
    group_key: str,
    replay_key: str,
    why: str,
    rank: int | None = None,
    *,
    position: int | None = None,
) -> SealedPayloadUnreadable:
    """A :class:`SealedPayloadUnreadable` for a slot, with ids only."""
    at = "" if position is None else f" at position {position}"
    return SealedPayloadUnreadable(
        f"the sealed outcome of child {replay_key!r}{at} in group {group_key!r} cannot be "
        f"opened here: {why}",
        group_key=group_key,
        replay_key=replay_key,
        position=position,
        rank=rank,
    )


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
