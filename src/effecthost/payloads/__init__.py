"""Payload references and sealed settlements (SPEC §6, G-47…G-50).

- :class:`PayloadStore` (:class:`MemoryPayloadStore`, :class:`FilesystemPayloadStore`,
  :class:`PostgresPayloadStore`): outcomes above an inline threshold are stored by
  reference.
- :class:`AesGcmSealer` with a :class:`KeyStore` (:class:`InMemoryKeyStore`,
  :class:`FileKeyStore`): AES-256-GCM bound to the slot (format tag, group key, replay key, position).
- :class:`PayloadPolicy` with :func:`encode_outcome` / :func:`decode_outcome`: what every
  host calls before recording and before serving a settlement.

Imports only the standard library, pydantic and the contract; ``cryptography`` is loaded
when a sealer is built (extra ``sealing``), asyncpg when a :class:`PostgresPayloadStore`
is first used (extra ``postgres``).
"""

from ._keys import KEY_BYTES, FileKeyStore, InMemoryKeyStore, KeyStore, new_key_id
from ._policy import (
    DEFAULT_INLINE_THRESHOLD,
    SHAPE_REFUSED,
    PayloadPolicy,
    Recorded,
    StoredOutcome,
    decode_outcome,
    encode_outcome,
    encode_outcome_inline,
    event_value,
)
from ._postgres import PostgresPayloadStore
from ._sealing import (
    AES_256_GCM,
    FORMAT_PREFIX,
    SEALED_FORMAT,
    AesGcmSealer,
    SealedEnvelope,
    Sealer,
    associated_data,
    default_scope,
    looks_sealed,
)
from ._store import (
    FilesystemPayloadStore,
    MemoryPayloadStore,
    PayloadRef,
    PayloadStore,
    group_directory_name,
)

__all__ = [
    "AES_256_GCM",
    "DEFAULT_INLINE_THRESHOLD",
    "FORMAT_PREFIX",
    "KEY_BYTES",
    "SEALED_FORMAT",
    "SHAPE_REFUSED",
    "AesGcmSealer",
    "FileKeyStore",
    "FilesystemPayloadStore",
    "InMemoryKeyStore",
    "KeyStore",
    "MemoryPayloadStore",
    "PayloadPolicy",
    "PayloadRef",
    "PayloadStore",
    "PostgresPayloadStore",
    "Recorded",
    "SealedEnvelope",
    "Sealer",
    "StoredOutcome",
    "associated_data",
    "decode_outcome",
    "default_scope",
    "encode_outcome",
    "encode_outcome_inline",
    "event_value",
    "group_directory_name",
    "looks_sealed",
    "new_key_id",
]
