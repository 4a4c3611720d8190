"""How a host records an outcome: inline or by reference, sealed or not (G-47…G-50).

Every host calls :func:`encode_outcome` before it records a settlement and
:func:`decode_outcome` before it serves one; what it records is the
:class:`StoredOutcome`, never the plaintext of a sealed outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from effecthost.contract import (
    EffectHostError,
    Outcome,
    PayloadMissing,
    canonical_json,
)

from ._sealing import SealedEnvelope, Sealer, looks_sealed, unreadable
from ._store import PayloadRef, PayloadStore

M = TypeVar("M", bound=BaseModel)

DEFAULT_INLINE_THRESHOLD = 4 * 1024
"""Outcomes whose canonical JSON is larger than this many bytes go by reference."""


@dataclass(frozen=True)
class PayloadPolicy:
    """A host's payload settings.

    Attributes:
        store: where outcomes above ``inline_threshold`` go; ``None`` keeps every outcome
            inline.
        inline_threshold: the largest canonical-JSON outcome (plaintext bytes) recorded
            inline.
        sealer: seals every outcome (inline or by reference) when set; a reader without
            one refuses sealed outcomes.

    Raises:
        ValueError: a negative ``inline_threshold``.
    """

    store: PayloadStore | None = None
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    sealer: Sealer | None = None

    def __post_init__(self) -> None:
        if self.inline_threshold < 0:
            raise ValueError("inline_threshold must be >= 0")


class StoredOutcome(BaseModel):
    """What a rank record holds for an outcome. Exactly one form:

    - ``inline``: ``outcome`` is the plaintext outcome;
    - ``sealed``: ``envelope`` is the sealed outcome, inline;
    - ``ref``: ``ref`` names the stored bytes, an envelope when ``sealed`` is true.

    Serialise it with ``model_dump_json`` and read it back with ``model_validate_json``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    form: Literal["inline", "sealed", "ref"]
    outcome: Outcome | None = None
    envelope: SealedEnvelope | None = None
    ref: PayloadRef | None = None
    sealed: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> StoredOutcome:
        present = {
            "inline": self.outcome is not None,
            "sealed": self.envelope is not None,
            "ref": self.ref is not None,
        }
        if [name for name, there in present.items() if there] != [self.form]:
            raise ValueError(f"a {self.form} stored outcome carries exactly its own field")
        if (self.form == "sealed" and not self.sealed) or (self.form == "inline" and self.sealed):
            raise ValueError("a sealed form is marked sealed, an inline one is not")
        return self


def _plain_bytes(outcome: Outcome) -> bytes:
    return canonical_json(outcome.model_dump(mode="json"))


def encode_outcome_inline(
    policy: PayloadPolicy, group_key: str, replay_key: str, outcome: Outcome
) -> StoredOutcome:
    """Encode ``outcome`` without the store (sealed when the policy seals): for a host's
    synchronous paths, whose outcomes are small (a cancellation).

    Raises:
        InvalidEnvelope: the outcome is not strict JSON.
        MissingExtra: sealing is configured but ``cryptography`` is missing.
    """
    plain = _plain_bytes(outcome)
    if policy.sealer is None:
        return StoredOutcome(form="inline", outcome=outcome)
    envelope = policy.sealer.seal(group_key, replay_key, plain)
    return StoredOutcome(form="sealed", envelope=envelope, sealed=True)


async def encode_outcome(
    policy: PayloadPolicy, group_key: str, replay_key: str, outcome: Outcome
) -> StoredOutcome:
    """Encode the outcome of slot (``group_key``, ``replay_key``) for recording.

    Above ``policy.inline_threshold`` (canonical JSON of the plaintext) and with a store,
    the bytes go to the store and the record carries the reference (G-47). With a sealer
    the outcome is sealed for its slot first, so the store only ever sees the envelope
    (G-48). Nothing here depends on the rank.

    Raises:
        InvalidEnvelope: the outcome is not strict JSON.
        OSError: the store could not write (nothing is recorded; the caller retries).
    """
    plain = _plain_bytes(outcome)
    by_ref = policy.store is not None and len(plain) > policy.inline_threshold
    if not by_ref:
        return encode_outcome_inline(policy, group_key, replay_key, outcome)
    assert policy.store is not None
    if policy.sealer is None:
        ref = await policy.store.put(group_key, replay_key, plain)
        return StoredOutcome(form="ref", ref=ref)
    envelope = policy.sealer.seal(group_key, replay_key, plain)
    data = canonical_json(envelope.model_dump(mode="json"))
    ref = await policy.store.put(group_key, replay_key, data)
    return StoredOutcome(form="ref", ref=ref, sealed=True)


async def decode_outcome(
    policy: PayloadPolicy | None,
    group_key: str,
    replay_key: str,
    stored: StoredOutcome,
    *,
    rank: int | None = None,
) -> Outcome:
    """The outcome recorded as ``stored`` in slot (``group_key``, ``replay_key``).

    Never returns an envelope as if it were the value (ADR 0130 D2) and changes nothing:
    a host calls it before it advances a handle, so a refusal leaves the cursor where it
    was (G-49). ``rank``, when given, is carried by the errors.

    Raises:
        PayloadMissing: a referenced payload is not in the store (or the policy has no
            store), or its bytes are not what the reference names; names group key,
            replay key and rank.
        SealedPayloadUnreadable: the outcome is sealed and this policy has no sealer; the
            cipher id is unknown; the key is not in this key store; authentication failed
            (wrong key, tampered bytes, a value sealed for another slot or group); or the
            opened or stored bytes are not an outcome. Ids only.
        PayloadShredded: the key of the outcome's scope was destroyed in this key store.
    """
    try:
        return await _decode(policy, group_key, replay_key, stored)
    except EffectHostError as exc:
        if rank is not None and exc.rank is None:
            exc.rank = rank
        raise


async def _decode(
    policy: PayloadPolicy | None, group_key: str, replay_key: str, stored: StoredOutcome
) -> Outcome:
    if stored.form == "inline":
        assert stored.outcome is not None
        if looks_sealed(stored.outcome.value):
            raise unreadable(group_key, replay_key, "a sealed envelope sits in a plaintext slot")
        return stored.outcome
    if stored.form == "sealed":
        assert stored.envelope is not None
        return _open(policy, group_key, replay_key, stored.envelope)
    assert stored.ref is not None
    if stored.sealed and (policy is None or policy.sealer is None):
        raise unreadable(group_key, replay_key, "no key store is configured (stored by reference)")
    if policy is None or policy.store is None:
        raise PayloadMissing(
            f"the outcome of child {replay_key!r} in group {group_key!r} is stored by "
            "reference and no payload store is configured here",
            group_key=group_key,
            replay_key=replay_key,
        )
    data = await policy.store.get(stored.ref)
    parsed = _json_or_none(data)
    if stored.sealed or looks_sealed(parsed):
        envelope = _model_or_none(SealedEnvelope, parsed)
        if envelope is None:
            raise unreadable(group_key, replay_key, "the stored envelope is malformed")
        return _open(policy, group_key, replay_key, envelope)
    outcome = _model_or_none(Outcome, parsed)
    if outcome is None:
        raise PayloadMissing(
            f"the stored payload of child {replay_key!r} in group {group_key!r} is not an outcome",
            group_key=group_key,
            replay_key=replay_key,
        )
    return outcome


def _open(
    policy: PayloadPolicy | None, group_key: str, replay_key: str, envelope: SealedEnvelope
) -> Outcome:
    if policy is None or policy.sealer is None:
        raise unreadable(
            group_key,
            replay_key,
            f"no key store is configured (cipher {envelope.cipher!r}, key {envelope.key_id!r})",
        )
    plain = policy.sealer.open(group_key, replay_key, envelope)
    outcome = _model_or_none(Outcome, _json_or_none(plain))
    if outcome is None:
        raise unreadable(group_key, replay_key, "the opened bytes are not an outcome")
    return outcome


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _model_or_none(model: type[M], value: Any) -> M | None:
    """Validate without letting a validation error (which quotes its input) escape."""
    if value is None:
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None
