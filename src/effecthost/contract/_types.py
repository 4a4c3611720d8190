"""The contract's data types: envelopes, groups, handles, outcomes, settlements."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._errors import (
    DuplicateReplayKey,
    EmptyGroup,
    InvalidEnvelope,
    MalformedHandle,
    MembershipConflict,
)

JsonValue = Any
"""A value that round-trips through strict JSON (no NaN, no infinities, string keys)."""


class WakePolicy(StrEnum):
    """When a waiter is woken; part of group identity (G-23). Exactly three variants."""

    FIRST = "first"
    FIRST_SUCCESS = "first_success"
    ALL = "all"


class LoserPolicy(StrEnum):
    """What happens to children still running once the caller is done (G-25)."""

    RUN_TO_COMPLETION = "run_to_completion"
    CANCEL = "cancel"


class EffectKind:
    """The child kinds every tier ships (G-51). The kind field is open: others may exist."""

    TOOL_CALL = "tool_call"
    SLEEP = "sleep"
    AWAIT_EVENT = "await_event"


def _reject_non_string_keys(value: JsonValue) -> None:
    if not isinstance(value, dict | list | tuple):
        return
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if any(not isinstance(key, str) for key in item):
                raise InvalidEnvelope("value is not strict JSON: an object key is not a string")
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def canonical_json(value: JsonValue) -> bytes:
    """Strict canonical JSON: sorted keys, no whitespace, UTF-8, no NaN.

    Raises:
        InvalidEnvelope: the value is not strict JSON (a set, bytes, NaN, a non-string key,
            text that is not valid Unicode).
    """
    _reject_non_string_keys(value)
    return _encode_canonical(value)


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _encode_canonical(value: JsonValue) -> bytes:
    """:func:`canonical_json` of a value whose object keys are known to be strings."""
    try:
        return _CANONICAL.encode(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidEnvelope(f"value is not strict JSON: {type(exc).__name__}") from None


def normalize_json(value: JsonValue) -> JsonValue:
    """Round-trip ``value`` through canonical JSON (tuples become lists, keys sorted).

    Raises:
        InvalidEnvelope: the value is not strict JSON.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return value  # its own round trip; the common tool result skips the encoder
    if kind is str and _encodable(value):
        return value
    return json.loads(canonical_json(value))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_FROZEN = ConfigDict(frozen=True, extra="forbid")


class GroupMembership(BaseModel):
    """Which group a child belongs to and under which rules (G-02, G-03)."""

    model_config = _FROZEN

    group_key: str = Field(min_length=1)
    position: int = Field(ge=0)
    wake: WakePolicy
    disposition: LoserPolicy


class EffectEnvelope(BaseModel):
    """One effect as the journal records it.

    ``membership`` is optional and *omitted* from the canonical encoding when absent, so an
    ungrouped envelope hashes exactly as it did before groups existed (G-01); when present
    it carries wake and disposition into every child's hash (G-02).

    Raises:
        InvalidEnvelope: ``input`` is not strict JSON, or ``replay_key``/``kind``/``name``
            is empty.
    """

    model_config = _FROZEN

    replay_key: str
    kind: str
    name: str
    input: JsonValue = None
    membership: GroupMembership | None = None

    @model_validator(mode="before")
    @classmethod
    def _normalize(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for field in ("replay_key", "kind", "name"):
                value = data.get(field)
                if not isinstance(value, str) or not value or not _encodable(value):
                    raise InvalidEnvelope(
                        f"envelope {field} must be a non-empty string",
                        replay_key=data.get("replay_key")
                        if isinstance(data.get("replay_key"), str)
                        and _encodable(data["replay_key"])
                        else None,
                    )
            try:
                data = {**data, "input": normalize_json(data.get("input"))}
            except InvalidEnvelope as exc:
                raise InvalidEnvelope(
                    f"input of envelope {data['replay_key']!r} is not strict JSON",
                    replay_key=data["replay_key"],
                ) from exc
        return data

    def canonical_dict(self) -> dict[str, JsonValue]:
        """The dict whose canonical JSON is :meth:`canonical_bytes`."""
        doc: dict[str, JsonValue] = {
            "input": self.input,
            "kind": self.kind,
            "name": self.name,
            "replay_key": self.replay_key,
        }
        m = self.membership
        if m is not None:
            doc["membership"] = {
                "disposition": m.disposition.value,
                "group_key": m.group_key,
                "position": m.position,
                "wake": m.wake.value,
            }
        return doc

    def canonical_bytes(self) -> bytes:
        """Canonical encoding; membership omitted when absent (G-01)."""
        # the input was normalised at construction (string keys), the rest is ours
        return _encode_canonical(self.canonical_dict())

    def envelope_hash(self) -> str:
        """``sha256`` hex of :meth:`canonical_bytes`: the replay fence (G-01, G-02)."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    def with_membership(self, membership: GroupMembership | None) -> EffectEnvelope:
        """A copy with ``membership`` replaced."""
        return self.model_copy(update={"membership": membership})


class EffectGroup(BaseModel):
    """N child envelopes opened together. This is the one constructor (G-03).

    Children without membership are stamped from their index; a child whose membership
    names another group key, position, wake or disposition is refused. Hosts read group
    identity from the group, never from ``children[0]``.

    Raises:
        EmptyGroup: no children (G-04).
        MembershipConflict: a child's membership disagrees with the group (G-03).
        DuplicateReplayKey: two children share a replay key.
        InvalidEnvelope: the key is empty or a child is not a valid envelope.
    """

    model_config = _FROZEN

    key: str
    wake: WakePolicy
    disposition: LoserPolicy
    children: tuple[EffectEnvelope, ...]

    @model_validator(mode="before")
    @classmethod
    def _stamp(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        key = data.get("key")
        if not isinstance(key, str) or not key or not _encodable(key):
            raise InvalidEnvelope("group key must be a non-empty UTF-8 string")
        try:
            wake = WakePolicy(data.get("wake"))  # type: ignore[arg-type]
            disposition = LoserPolicy(data.get("disposition"))  # type: ignore[arg-type]
        except ValueError:
            raise InvalidEnvelope(
                f"group {key!r} needs a wake policy and a loser policy", group_key=key
            ) from None
        raw = data.get("children") or ()
        if len(raw) == 0:
            raise EmptyGroup(f"group {key!r} has no children", group_key=key)
        stamped: list[EffectEnvelope] = []
        seen: set[str] = set()
        for index, child in enumerate(raw):
            envelope = child if isinstance(child, EffectEnvelope) else EffectEnvelope(**child)
            expected = GroupMembership(
                group_key=key, position=index, wake=wake, disposition=disposition
            )
            if envelope.membership is None:
                envelope = envelope.with_membership(expected)
            elif envelope.membership != expected:
                got = envelope.membership
                fields = [
                    name
                    for name in ("group_key", "position", "wake", "disposition")
                    if getattr(got, name) != getattr(expected, name)
                ]
                raise MembershipConflict(
                    f"child {envelope.replay_key!r} at position {index} of group {key!r} "
                    f"disagrees on {', '.join(fields)}",
                    group_key=key,
                    replay_key=envelope.replay_key,
                    position=index,
                )
            if envelope.replay_key in seen:
                raise DuplicateReplayKey(
                    f"replay key {envelope.replay_key!r} appears twice in group {key!r}",
                    group_key=key,
                    replay_key=envelope.replay_key,
                    position=index,
                )
            seen.add(envelope.replay_key)
            stamped.append(envelope)
        return {**data, "wake": wake, "disposition": disposition, "children": tuple(stamped)}

    @property
    def child_count(self) -> int:
        return len(self.children)

    def handle(self) -> GroupHandle:
        """A fresh cursor (``consumed = 0``) whose child count comes from this group (G-20)."""
        return GroupHandle(
            group_key=self.key,
            child_count=self.child_count,
            consumed=0,
            wake=self.wake,
            disposition=self.disposition,
        )


class GroupHandle(BaseModel):
    """The caller's cursor over one group; the only cursor of record (G-18).

    Mutable on purpose: :meth:`EffectController.await_next_settlement` advances
    ``consumed`` by exactly one on each settlement it returns, and by nothing when it
    raises or is cancelled. Save it with :meth:`to_json` in the caller's continuation.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    group_key: str = Field(min_length=1)
    child_count: int = Field(ge=1)
    consumed: int = Field(ge=0)
    wake: WakePolicy
    disposition: LoserPolicy

    @model_validator(mode="after")
    def _consumed_in_range(self) -> GroupHandle:
        if self.consumed > self.child_count:
            raise ValueError("consumed exceeds child_count")
        return self

    @property
    def remaining(self) -> int:
        return self.child_count - self.consumed

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.child_count

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> GroupHandle:
        """Decode a saved handle.

        Raises:
            MalformedHandle: not a handle, or impossible values (consumed > child_count).
        """
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise MalformedHandle(
                f"cannot decode group handle: {exc.error_count()} error(s)"
            ) from None

    def copy_cursor(self) -> GroupHandle:
        """An independent copy (what a restored continuation holds)."""
        return self.model_copy()


class ErrorInfo(BaseModel):
    """A child's failure as recorded: type, message, optional JSON data and code."""

    model_config = _FROZEN

    type: str
    message: str
    data: JsonValue = None
    code: int | None = None


class Outcome(BaseModel):
    """How a child ended: a success value, an error, or cancelled."""

    model_config = _FROZEN

    status: Literal["success", "error", "cancelled"]
    value: JsonValue = None
    error: ErrorInfo | None = None

    @classmethod
    def success(cls, value: JsonValue = None) -> Outcome:
        """Raises: InvalidEnvelope when ``value`` is not strict JSON."""
        return cls(status="success", value=normalize_json(value))

    @classmethod
    def failure(
        cls, type: str, message: str, data: JsonValue = None, code: int | None = None
    ) -> Outcome:
        return cls(
            status="error",
            error=ErrorInfo(type=type, message=message, data=normalize_json(data), code=code),
        )

    @classmethod
    def cancelled(cls) -> Outcome:
        return cls(status="cancelled")

    @property
    def ok(self) -> bool:
        return self.status == "success"


class Settlement(BaseModel):
    """Rank ``rank`` of a group: which child settled ``rank``-th and how (G-15)."""

    model_config = _FROZEN

    rank: int = Field(ge=1)
    position: int = Field(ge=0)
    replay_key: str
    outcome: Outcome
