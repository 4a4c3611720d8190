"""Typed errors of the contract (SPEC §7).

Every error carries a :class:`RuntimeErrorCode` and the ids it concerns as attributes
(``group_key``, ``replay_key``, ``position``, ``rank``…). Messages name ids only, never
payload bytes, so an error can be logged without leaking what a child computed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class RuntimeErrorCode(StrEnum):
    """One code per error class, stable across releases (logs and metrics key on it)."""

    EFFECT_GROUP_UNSUPPORTED = "effect_group_unsupported"
    EMPTY_GROUP = "empty_group"
    GROUP_SHAPE_ERROR = "group_shape_error"
    GROUP_SHAPE_MISMATCH = "group_shape_mismatch"
    MEMBERSHIP_UNSUPPORTED = "membership_unsupported"
    MEMBERSHIP_CONFLICT = "membership_conflict"
    DUPLICATE_REPLAY_KEY = "duplicate_replay_key"
    INVALID_ENVELOPE = "invalid_envelope"
    MALFORMED_HANDLE = "malformed_handle"
    HANDLE_MISMATCH = "handle_mismatch"
    UNKNOWN_GROUP = "unknown_group"
    GROUP_CLOSED = "group_closed"
    CURSOR_EXHAUSTED = "cursor_exhausted"
    DISPOSITION_WIDENED = "disposition_widened"
    REPLAY_MISMATCH = "replay_mismatch"
    NO_EXECUTOR = "no_executor"
    EXECUTOR_CONSUMED = "executor_consumed"
    LEASE_LOST = "lease_lost"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    PAYLOAD_MISSING = "payload_missing"
    SEALED_PAYLOAD_UNREADABLE = "sealed_payload_unreadable"
    PAYLOAD_SHREDDED = "payload_shredded"
    EFFECT_FAILED = "effect_failed"
    ALL_EFFECTS_FAILED = "all_effects_failed"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    STORE_REFUSED = "store_refused"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    NOT_IN_CHILD = "not_in_child"


class EffectHostError(Exception):
    """Base of every error this library raises on purpose.

    Attributes:
        code: the :class:`RuntimeErrorCode` of the concrete class.
        message: the text without the ``[code]`` prefix.
        group_key, replay_key, position, rank: the ids the error concerns, or ``None``.
    """

    code: RuntimeErrorCode

    def __init__(
        self,
        message: str,
        *,
        group_key: str | None = None,
        replay_key: str | None = None,
        position: int | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(f"[{self.code.value}] {message}")
        self.message = message
        self.group_key = group_key
        self.replay_key = replay_key
        self.position = position
        self.rank = rank

    def ids(self) -> dict[str, Any]:
        """The ids this error carries, for structured logs and equality in tests."""
        return {
            "code": self.code.value,
            "group_key": self.group_key,
            "replay_key": self.replay_key,
            "position": self.position,
            "rank": self.rank,
        }


class EffectGroupUnsupported(EffectHostError):
    """No ``GroupExecutors`` resolver is registered on this controller (G-07)."""

    code = RuntimeErrorCode.EFFECT_GROUP_UNSUPPORTED


class EmptyGroup(EffectHostError):
    """A group with no children: it could never be a durable fact (G-04)."""

    code = RuntimeErrorCode.EMPTY_GROUP


class GroupShapeError(EffectHostError):
    """A first open found a child the resolver cannot run; nothing was recorded (G-10)."""

    code = RuntimeErrorCode.GROUP_SHAPE_ERROR


class GroupShapeMismatch(EffectHostError):
    """A reopen whose child count, wake or disposition differs from the record (G-13)."""

    code = RuntimeErrorCode.GROUP_SHAPE_MISMATCH


class MembershipUnsupported(EffectHostError):
    """A grouped child reached a dispatch path with no slot for its membership (G-06)."""

    code = RuntimeErrorCode.MEMBERSHIP_UNSUPPORTED


class MembershipConflict(EffectHostError):
    """A child's membership disagrees with the group it is constructed into (G-03)."""

    code = RuntimeErrorCode.MEMBERSHIP_CONFLICT


class DuplicateReplayKey(EffectHostError):
    """Two children of one group share a replay key."""

    code = RuntimeErrorCode.DUPLICATE_REPLAY_KEY


class InvalidEnvelope(EffectHostError):
    """Bad input: an envelope, group or outcome field that is not strict JSON (NaN, a set,
    an object…), is empty, has the wrong type, or is over the limits (R-8); also a close
    disposition that is not a ``LoserPolicy`` value."""

    code = RuntimeErrorCode.INVALID_ENVELOPE


class MalformedHandle(EffectHostError):
    """A serialised handle could not be decoded or has impossible values."""

    code = RuntimeErrorCode.MALFORMED_HANDLE


class HandleMismatch(EffectHostError):
    """A handle's child count, wake or disposition disagrees with the recorded group (G-20)."""

    code = RuntimeErrorCode.HANDLE_MISMATCH


class UnknownGroup(EffectHostError):
    """The handle names a group key this host has no record of."""

    code = RuntimeErrorCode.UNKNOWN_GROUP


class GroupClosed(EffectHostError):
    """The group was closed: its ranks are no longer served and it cannot be reopened."""

    code = RuntimeErrorCode.GROUP_CLOSED


class CursorExhausted(EffectHostError):
    """The handle has consumed every child; advancing further is refused (G-20)."""

    code = RuntimeErrorCode.CURSOR_EXHAUSTED


class DispositionWidened(EffectHostError):
    """A close tried to widen ``CANCEL`` to ``RUN_TO_COMPLETION`` (G-26)."""

    code = RuntimeErrorCode.DISPOSITION_WIDENED


class ReplayMismatch(EffectHostError):
    """A recorded child's envelope hash differs from the one replayed (G-02)."""

    code = RuntimeErrorCode.REPLAY_MISMATCH


class NoExecutor(EffectHostError):
    """A drain report entry: this deployment cannot run the child (G-11, G-12).

    Not raised at a caller: a drain pass lists these so the group stays visible.
    """

    code = RuntimeErrorCode.NO_EXECUTOR


class ExecutorConsumed(EffectHostError):
    """An executor was asked to run twice; executors are single-use (G-09)."""

    code = RuntimeErrorCode.EXECUTOR_CONSUMED


class NotInChild(EffectHostError):
    """:func:`current_child` was called outside a running child's tool."""

    code = RuntimeErrorCode.NOT_IN_CHILD


class LeaseLost(EffectHostError):
    """A driver's lease on a child moved on; its writes are fenced off (G-33)."""

    code = RuntimeErrorCode.LEASE_LOST


class PayloadTooLarge(InvalidEnvelope):
    """An input, key or outcome over a size limit (R-8, or a host's lower configured
    limit). An :class:`InvalidEnvelope` with its own code."""

    code = RuntimeErrorCode.PAYLOAD_TOO_LARGE


class PayloadMissing(EffectHostError):
    """A settlement refers to a stored payload that is gone (G-47)."""

    code = RuntimeErrorCode.PAYLOAD_MISSING


class SealedPayloadUnreadable(EffectHostError):
    """A sealed settlement cannot be opened here (no key, unknown cipher, wrong slot)."""

    code = RuntimeErrorCode.SEALED_PAYLOAD_UNREADABLE


class PayloadShredded(EffectHostError):
    """The key of the payload's scope was destroyed (crypto-erasure, G-50)."""

    code = RuntimeErrorCode.PAYLOAD_SHREDDED


class StoreRefused(EffectHostError):
    """A host refused to open its storage (a file or schema it does not own, another
    schema version, a locked or unreadable database) before writing anything to it."""

    code = RuntimeErrorCode.STORE_REFUSED


class EngineUnavailable(EffectHostError):
    """An open, close or ``deliver_event`` could not reach its engine, worker, endpoint or
    database within the bound the host is configured with (R-12).

    The call may or may not have committed before the outage: retrying it is safe (an
    open is fenced as a reopen, a close as a no-op). Awaits never raise this: they wait.

    Attributes:
        tried_for: seconds spent retrying before giving up.
        operation: ``"open"``, ``"close"``, ``"deliver_event"`` or another call's name.
    """

    code = RuntimeErrorCode.ENGINE_UNAVAILABLE

    def __init__(
        self,
        message: str,
        *,
        operation: str | None = None,
        tried_for: float = 0.0,
        **ids: Any,
    ) -> None:
        super().__init__(message, **ids)
        self.operation = operation
        self.tried_for = tried_for
