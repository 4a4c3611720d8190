"""How a host records an outcome: inline or by reference, sealed or not (G-47…G-50).

Every host calls :func:`encode_outcome` before it records a settlement and
:func:`decode_outcome` before it serves one; what it records is the
:class:`StoredOutcome`, never the plaintext of a sealed outcome.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from effecthost.contract import (
    EffectHostError,
    InvalidEnvelope,
    Outcome,
    PayloadMissing,
    canonical_json,
    normalize_json,
)
from effecthost.contract.limits import MAX_NAME_BYTES, check_key

from ._sealing import FORMAT_PREFIX, SealedEnvelope, Sealer, looks_sealed, unreadable
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
        accept_plaintext: with a ``sealer``, also read unsealed outcomes (a *mixed*
            deployment: records written before sealing was turned on, by a host without
            the sealer, or derived by an engine that holds no keys). Off by default: a
            sealing host never records plaintext, so an unsealed record in its slots is
            forged or misconfigured and is refused (``SealedPayloadUnreadable``).

    Raises:
        ValueError: a negative ``inline_threshold``.
    """

    store: PayloadStore | None = None
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    sealer: Sealer | None = None
    accept_plaintext: bool = False

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


SHAPE_REFUSED = "SealedShapeRefused"
"""The error type recorded for an outcome that already holds a sealed envelope's shape."""

Recorded = StoredOutcome | str | bytes | Mapping[str, Any]
"""What a host read from its records: the model, its JSON text or bytes, or the parsed
document (a plain outcome's document is read as the inline form)."""


def event_value(group_key: str, name: str, payload: Any) -> Any:
    """The strict-JSON value of an event payload for ``deliver_event`` on every tier.

    A sealed value is minted by a host's sealer, never by a caller, so a payload carrying a
    sealed envelope's shape anywhere is refused before anything is recorded (ADR 0130 D6);
    relay foreign ciphertext as a string.

    Raises:
        InvalidEnvelope: the group key or the name is outside the contract's key limits
            (R-8: empty, too long, a NUL or a lone surrogate), the payload is not strict
            JSON, or it carries the shape.
    """
    check_key(group_key, what="the group key of an event")
    check_key(name, what="an event name", limit=MAX_NAME_BYTES, group_key=group_key)
    value = normalize_json(payload)
    if looks_sealed(value):
        raise InvalidEnvelope(
            f"the payload of event {name!r} for group {group_key!r} holds a value shaped "
            "like a sealed envelope; relay foreign ciphertext as a string",
            group_key=group_key,
        )
    return value


def _plain_bytes(outcome: Outcome) -> bytes:
    return canonical_json(outcome.model_dump(mode="json"))


def _carries_envelope(outcome: Outcome) -> bool:
    return looks_sealed(outcome.value) or (
        outcome.error is not None and looks_sealed(outcome.error.data)
    )


def _guarded(group_key: str, replay_key: str, outcome: Outcome) -> Outcome:
    """An outcome holding a sealed envelope's shape is recorded as a typed failure: every
    reader would refuse it (ADR 0130 D2), so recording it would poison its rank."""
    if not _carries_envelope(outcome):
        return outcome
    return Outcome.failure(
        SHAPE_REFUSED,
        f"the outcome of child {replay_key!r} in group {group_key!r} holds a value shaped "
        "like a sealed envelope; relay foreign ciphertext as a string",
    )


def encode_outcome_inline(
    policy: PayloadPolicy, group_key: str, replay_key: str, outcome: Outcome, *, position: int
) -> StoredOutcome:
    """Encode ``outcome`` without the store (sealed when the policy seals): for a host's
    synchronous paths, whose outcomes are small (a cancellation).

    Raises:
        InvalidEnvelope: the outcome is not strict JSON.
        MissingExtra: sealing is configured but ``cryptography`` is missing.
    """
    outcome = _guarded(group_key, replay_key, outcome)
    if policy.sealer is None:
        return StoredOutcome(form="inline", outcome=outcome)
    plain = _plain_bytes(outcome)
    envelope = policy.sealer.seal(group_key, replay_key, plain, position=position)
    return StoredOutcome(form="sealed", envelope=envelope, sealed=True)


async def encode_outcome(
    policy: PayloadPolicy, group_key: str, replay_key: str, outcome: Outcome, *, position: int
) -> StoredOutcome:
    """Encode the outcome of slot (``group_key``, ``replay_key``, ``position``) for
    recording.

    Above ``policy.inline_threshold`` (canonical JSON of the plaintext) and with a store,
    the bytes go to the store and the record carries the reference (G-47). With a sealer
    the outcome is sealed for its slot first, so the store only ever sees the envelope
    (G-48, R-10). Nothing here depends on the rank. An outcome that already holds a sealed
    envelope's shape is encoded as a ``SealedShapeRefused`` failure instead.

    Raises:
        InvalidEnvelope: the outcome is not strict JSON.
        OSError: the store could not write (nothing is recorded; the caller retries).
    """
    outcome = _guarded(group_key, replay_key, outcome)
    plain = _plain_bytes(outcome)
    by_ref = policy.store is not None and len(plain) > policy.inline_threshold
    if not by_ref:
        return encode_outcome_inline(policy, group_key, replay_key, outcome, position=position)
    assert policy.store is not None
    if policy.sealer is None:
        ref = await policy.store.put(group_key, replay_key, plain)
        return StoredOutcome(form="ref", ref=ref)
    envelope = policy.sealer.seal(group_key, replay_key, plain, position=position)
    data = canonical_json(envelope.model_dump(mode="json"))
    ref = await policy.store.put(group_key, replay_key, data)
    return StoredOutcome(form="ref", ref=ref, sealed=True)


async def decode_outcome(
    policy: PayloadPolicy | None,
    group_key: str,
    replay_key: str,
    recorded: Recorded,
    *,
    position: int,
    rank: int | None = None,
) -> Outcome:
    """The outcome recorded as ``recorded`` in slot (``group_key``, ``replay_key``,
    ``position``).

    Never returns an envelope as if it were the value (ADR 0130 D2: a sealed envelope's
    shape anywhere in the outcome is refused) and changes nothing: a host calls it before
    it advances a handle, so a refusal leaves the cursor where it was (G-49). ``rank`` is
    carried by the errors. Every failure is one of the three typed errors below, with ids
    only and no chained exception: never a JSON, Unicode, pydantic or recursion error.

    Raises:
        PayloadMissing: a referenced payload is not in the store (or the policy has no
            store), its bytes are not what the reference names, or the reference names
            another slot; an unsealed record that is malformed. Names group key, replay
            key and rank.
        SealedPayloadUnreadable: the outcome is sealed and this policy has no sealer; the
            format or cipher id is unknown; the key is not in this key store;
            authentication failed (wrong key, tampered bytes, a value sealed for another
            slot, position or group); the record is malformed and the policy seals (or it
            names the sealed format); an unsealed record where the policy seals and does
            not ``accept_plaintext``; or the outcome holds a sealed envelope's shape. Ids
            only.
        PayloadShredded: the key of the outcome's scope was destroyed in this key store.
    """
    try:
        stored = _load(policy, group_key, replay_key, position, recorded)
        return await _decode(policy, group_key, replay_key, position, stored)
    except EffectHostError as exc:
        if rank is not None and exc.rank is None:
            exc.rank = rank
        if exc.position is None:
            exc.position = position
        raise


def _load(
    policy: PayloadPolicy | None, group_key: str, replay_key: str, position: int, recorded: Recorded
) -> StoredOutcome:
    """The :class:`StoredOutcome` a record holds; a malformed one is refused typed."""
    if isinstance(recorded, StoredOutcome):
        return recorded
    hint = False  # the record names the sealed format: refuse it as sealed
    document: Any = recorded
    if isinstance(recorded, bytes):
        hint = FORMAT_PREFIX.encode() in recorded or b'"sealed":true' in recorded
        document = _utf8_or_none(recorded)
    if isinstance(document, str):
        hint = hint or FORMAT_PREFIX in document or '"sealed":true' in document
        document = _json_or_none(document)
    if isinstance(document, Mapping):
        hint = hint or document.get("sealed") is True or looks_sealed(dict(document))
        if "form" in document:
            stored = _model_or_none(StoredOutcome, document)
        else:
            outcome = _model_or_none(Outcome, document)
            stored = None if outcome is None else StoredOutcome(form="inline", outcome=outcome)
        if stored is not None:
            return stored
    why = "the recorded outcome is malformed"
    if hint or (policy is not None and policy.sealer is not None):
        raise unreadable(group_key, replay_key, why, position=position)
    raise PayloadMissing(
        f"the outcome of child {replay_key!r} at position {position} in group {group_key!r} "
        "cannot be read: the record is malformed",
        group_key=group_key,
        replay_key=replay_key,
        position=position,
    )


def _refuse_plaintext(
    policy: PayloadPolicy | None, group_key: str, replay_key: str, position: int, form: str
) -> None:
    if policy is not None and policy.sealer is not None and not policy.accept_plaintext:
        raise unreadable(
            group_key,
            replay_key,
            f"an unsealed outcome ({form}) is recorded where this host seals every outcome "
            "(a mixed deployment declares PayloadPolicy(accept_plaintext=True))",
            position=position,
        )


def _shape_guard(group_key: str, replay_key: str, position: int, outcome: Outcome) -> Outcome:
    if _carries_envelope(outcome):
        raise unreadable(
            group_key,
            replay_key,
            "the outcome holds a value shaped like a sealed envelope",
            position=position,
        )
    return outcome


async def _decode(
    policy: PayloadPolicy | None,
    group_key: str,
    replay_key: str,
    position: int,
    stored: StoredOutcome,
) -> Outcome:
    if stored.form == "inline":
        assert stored.outcome is not None
        _refuse_plaintext(policy, group_key, replay_key, position, "inline")
        return _shape_guard(group_key, replay_key, position, stored.outcome)
    if stored.form == "sealed":
        assert stored.envelope is not None
        opened = _open(policy, group_key, replay_key, position, stored.envelope)
        return _shape_guard(group_key, replay_key, position, opened)
    assert stored.ref is not None
    ref = stored.ref
    sealing = policy is not None and policy.sealer is not None
    if (ref.group_key, ref.replay_key) != (group_key, replay_key):
        why = "its payload reference names another slot"
        if stored.sealed or sealing:
            raise unreadable(group_key, replay_key, why, position=position)
        raise PayloadMissing(
            f"the outcome of child {replay_key!r} at position {position} in group "
            f"{group_key!r} cannot be read: {why}",
            group_key=group_key,
            replay_key=replay_key,
            position=position,
        )
    if stored.sealed and not sealing:
        raise unreadable(
            group_key,
            replay_key,
            "no key store is configured (stored by reference)",
            position=position,
        )
    if not stored.sealed:
        _refuse_plaintext(policy, group_key, replay_key, position, "by reference")
    if policy is None or policy.store is None:
        raise PayloadMissing(
            f"the outcome of child {replay_key!r} in group {group_key!r} is stored by "
            "reference and no payload store is configured here",
            group_key=group_key,
            replay_key=replay_key,
        )
    data = await policy.store.get(ref)
    parsed = _json_or_none(_utf8_or_none(data))
    if stored.sealed or looks_sealed(parsed):
        envelope = _model_or_none(SealedEnvelope, parsed)
        if envelope is None:
            raise unreadable(
                group_key, replay_key, "the stored envelope is malformed", position=position
            )
        opened = _open(policy, group_key, replay_key, position, envelope)
        return _shape_guard(group_key, replay_key, position, opened)
    outcome = _model_or_none(Outcome, parsed)
    if outcome is None:
        raise PayloadMissing(
            f"the stored payload of child {replay_key!r} in group {group_key!r} is not an outcome",
            group_key=group_key,
            replay_key=replay_key,
        )
    return _shape_guard(group_key, replay_key, position, outcome)


def _open(
    policy: PayloadPolicy | None,
    group_key: str,
    replay_key: str,
    position: int,
    envelope: SealedEnvelope,
) -> Outcome:
    if policy is None or policy.sealer is None:
        raise unreadable(
            group_key,
            replay_key,
            "no key store is configured",
            position=position,
        )
    plain = policy.sealer.open(group_key, replay_key, envelope, position=position)
    outcome = _model_or_none(Outcome, _json_or_none(_utf8_or_none(plain)))
    if outcome is None:
        raise unreadable(
            group_key, replay_key, "the opened bytes are not an outcome", position=position
        )
    return outcome


def _utf8_or_none(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _json_or_none(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _model_or_none(model: type[M], value: Any) -> M | None:
    """Validate without letting a validation error (which quotes its input) escape."""
    if value is None:
        return None
    try:
        return model.model_validate(value)
    except (EffectHostError, ValueError, TypeError, RecursionError):
        return None
