"""Broken memory hosts: each breaks one rule of docs/spec.md, the way a host author would.

Every class is a small subclass of the reference host that changes one thing; its
docstring names the id it breaks and the mistake. ``@mutant(id, harness=…)`` registers it
in the catalog (``catalog.py``).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from catalog import mutant
from routing import RoutingMemoryHost

from effecthost.contract import (
    CursorExhausted,
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectKind,
    GroupClosed,
    GroupDrain,
    GroupHandle,
    GroupShapeError,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    Outcome,
    PayloadShredded,
    ReplayMismatch,
    SealedPayloadUnreadable,
    Settlement,
    ToolError,
    UnknownGroup,
    WakePolicy,
    is_host_kind,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.memory._host import _Child, _Group, _MemoryDrain
from effecthost.payloads import decode_outcome, encode_outcome_inline

# -- identity and capability ------------------------------------------------------------------


def _retold(exc: ReplayMismatch | GroupShapeError, message: str) -> Exception:
    """``exc`` with the same ids and another message."""
    return type(exc)(
        message, group_key=exc.group_key, replay_key=exc.replay_key, position=exc.position
    )


@mutant("G-02")
class ReplayKeysOnlyFenceHost(MemoryEffectHost):
    """G-02: a reopen compares each child's replay key, not its envelope hash, so a
    replay whose child changed is accepted."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        _shape_fence(record, group)
        for child, envelope in zip(record.children, group.children, strict=True):
            if child.replay_key != envelope.replay_key:
                raise ReplayMismatch("replay key differs", group_key=group.key)


@mutant("G-02")
class FirstChildHashFenceHost(MemoryEffectHost):
    """G-02: a reopen checks the hash of ``children[0]`` only, as if the first child
    stood for the group."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        _shape_fence(record, group)
        if record.children[0].hash != group.children[0].envelope_hash():
            raise ReplayMismatch("child 0 differs", group_key=group.key, position=0)


@mutant("G-02")
class LeakyReplayMismatchHost(MemoryEffectHost):
    """G-02 (errors carry ids only): the ``ReplayMismatch`` of a reopen quotes the offered
    child's input to help debugging, so a refusal carries payload bytes."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        try:
            super()._fence_reopen(record, group)
        except ReplayMismatch as exc:
            offered = group.children[exc.position or 0]
            raise _retold(exc, f"{exc} (offered input {offered.input!r})") from None


@mutant("G-06")
class StripsMembershipHost(MemoryEffectHost):
    """G-06: ``execute_effect`` drops a grouped envelope's membership and runs it."""

    async def execute_effect(self, envelope: EffectEnvelope, executor: EffectExecutor) -> Outcome:
        return await super().execute_effect(envelope.with_membership(None), executor)


@mutant("G-53")
class StripsTimerMembershipHost(MemoryEffectHost):
    """G-53: ``execute_effect`` refuses grouped tool calls but strips the membership of
    ``sleep`` and ``await_event`` children, whose native primitive has no slot for it."""

    async def execute_effect(self, envelope: EffectEnvelope, executor: EffectExecutor) -> Outcome:
        if is_host_kind(envelope):
            envelope = envelope.with_membership(None)
        return await super().execute_effect(envelope, executor)


@mutant("G-07")
class AlwaysSupportsGroupsHost(MemoryEffectHost):
    """G-07: ``supports_effect_groups()`` is a constant of the tier, true with no resolver."""

    def supports_effect_groups(self) -> bool:
        return True


@mutant("G-07")
class UnwiredAwaitLooksUpFirstHost(MemoryEffectHost):
    """G-07 (R-2): an unwired await looks the group up before checking the wiring, so it
    says ``UnknownGroup`` instead of ``EffectGroupUnsupported``."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        self._lookup(handle)
        return await super().await_next_settlement(handle)


@mutant("G-07")
class UnwiredCloseIsNoOpHost(MemoryEffectHost):
    """G-07: a close on a host with no resolver is treated as a harmless no-op."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        if self._resolver is None:
            return
        await super().close_effect_group(handle, disposition)


# -- open -------------------------------------------------------------------------------------


@mutant("G-08", select="G-08")
class OpenWaitsForASettlementHost(MemoryEffectHost):
    """G-08: open returns once the first child has settled, not once the group is
    recorded (so a race becomes coupled to its fastest child)."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        handle = await super().open_effect_group(group)
        record = self._groups[group.key]
        while not record.settled:
            await record.changed.wait()
        return handle


@mutant("G-30")
class ListsOnlyActiveGroupsHost(MemoryEffectHost):
    """G-30: ``open_group_keys`` lists groups that still have an unsettled child, so a
    group whose children all settled but which nobody closed is not counted."""

    async def open_group_keys(self) -> list[str]:
        keys = await super().open_group_keys()
        return [k for k in keys if len(self._groups[k].settled) < self._groups[k].child_count]


@mutant("G-30")
class ListsClosedGroupsHost(MemoryEffectHost):
    """G-30: ``open_group_keys`` lists every group not yet retired, closed ones included."""

    async def open_group_keys(self) -> list[str]:
        return sorted(self._groups)


@mutant("G-09", select="G-09")
class CachedExecutorHost(MemoryEffectHost):
    """G-09: executors are cached per tool name, so the second child of a group is handed
    the executor the first one consumed."""

    def _resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        cache: dict[str, EffectExecutor | None] = self.__dict__.setdefault("_cache", {})
        if is_host_kind(envelope):
            return super()._resolve(envelope)
        if envelope.name not in cache:
            cache[envelope.name] = super()._resolve(envelope)
        return cache[envelope.name]


@mutant("G-10")
class RecordsRefusedOpenHost(MemoryEffectHost):
    """G-10: the first open writes the group record before resolving the children, so a
    refused open leaves the group recorded and the same open repeated is accepted."""

    def _resolve_all(self, group: EffectGroup) -> list[EffectExecutor]:
        self._record_group(group)
        return super()._resolve_all(group)


@mutant("G-10")
class OneBasedRefusalHost(MemoryEffectHost):
    """G-10: the ``GroupShapeError`` names the unresolvable child's position counted from
    one, as a log line would."""

    def _resolve_all(self, group: EffectGroup) -> list[EffectExecutor]:
        try:
            return super()._resolve_all(group)
        except GroupShapeError as exc:
            assert exc.position is not None
            raise GroupShapeError(
                str(exc),
                group_key=exc.group_key,
                replay_key=exc.replay_key,
                position=exc.position + 1,
            ) from None


@mutant("G-10")
class LeakyShapeErrorHost(MemoryEffectHost):
    """G-10 (errors carry ids only): the ``GroupShapeError`` quotes the unresolvable
    child's input."""

    def _resolve_all(self, group: EffectGroup) -> list[EffectExecutor]:
        try:
            return super()._resolve_all(group)
        except GroupShapeError as exc:
            child = group.children[exc.position or 0]
            raise _retold(exc, f"{exc}; input {child.input!r}") from None


@mutant("G-11")
class ReopenRefusesAMissHost(MemoryEffectHost):
    """G-11: a reopen resolves every child again, as a first open does, and refuses the
    reopen when the resolver misses one."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        super()._fence_reopen(record, group)
        self._resolve_all(group)


@mutant("G-11", harness="durable")
class DrainSkipsMissesHost(MemoryEffectHost):
    """G-11: the drain passes over a child the resolver cannot run without reporting it,
    so the queue looks empty while the child can never settle."""

    def drain(self) -> _MemoryDrain:
        return _SilentMissDrain(self)


class _SilentMissDrain(_MemoryDrain):
    async def run_pass(self) -> Any:
        report = await super().run_pass()
        if self._host._resolver is None:
            return report
        return type(report)(resumed=report.resumed, cancelled=report.cancelled)


@mutant("G-12", harness="durable")
class EmptyUnwiredDrainHost(MemoryEffectHost):
    """G-12: a host with no resolver hands out the base class's drain, whose passes are
    always empty."""

    def drain(self) -> Any:
        if self._resolver is None:
            return super(MemoryEffectHost, self).drain()
        return super().drain()


@mutant("G-13")
class CountOnlyShapeFenceHost(MemoryEffectHost):
    """G-13: the reopen's shape fence compares the child count only; another wake or
    disposition then surfaces as a per-child ``ReplayMismatch``, not ``GroupShapeMismatch``."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        if record.child_count != group.child_count:
            raise GroupShapeMismatch("child count differs", group_key=group.key)
        for child, envelope in zip(record.children, group.children, strict=True):
            if child.hash != envelope.envelope_hash():
                raise ReplayMismatch("hash differs", group_key=group.key)


@mutant("G-13")
class PrefixReopenHost(MemoryEffectHost):
    """G-13: a reopen with fewer children is taken for a prefix of the recorded group and
    accepted (the hashes of the children it names match)."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        if group.child_count < record.child_count and (record.wake, record.declared) == (
            group.wake,
            group.disposition,
        ):
            for child, envelope in zip(record.children, group.children, strict=False):
                if child.hash != envelope.envelope_hash():
                    raise ReplayMismatch("differs", group_key=group.key)
            return
        super()._fence_reopen(record, group)


# -- settlement and the cursor ------------------------------------------------------------------


@mutant("G-15")
class ReracesOnReopenHost(MemoryEffectHost):
    """G-15: a reopen clears the recorded ranks and races the children again, re-deriving
    rank ``n`` from live children."""

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        super()._fence_reopen(record, group)
        for child in record.settled:
            child.state, child.seq, child.outcome = "pending", None, None
        record.settled.clear()
        record.counter = 0


@mutant("G-15", harness="durable")
class WriteBehindRanksHost(MemoryEffectHost):
    """G-15: settlements are written back lazily, when first served; a restart loses the
    settled-but-unconsumed ranks and their children run and rank again."""

    def _after_restart(self) -> None:
        for record in self._groups.values():
            served = getattr(record, "served", 0)
            for child in record.settled[served:]:
                child.state, child.seq, child.outcome = "running", None, None
            del record.settled[served:]
            record.counter = served

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        settlement = await super().await_next_settlement(handle)
        record = self._groups.get(handle.group_key)
        if record is not None:
            record.served = max(getattr(record, "served", 0), settlement.rank)  # type: ignore[attr-defined]
        return settlement


@mutant("G-16", select="G-15 or G-16")
class GlobalSequenceHost(MemoryEffectHost):
    """G-16: sequences come from one generator shared by every group (like a database
    sequence), so a group's sequences have gaps, yet rank ``n`` is looked up as sequence
    ``n``."""

    def _next_sequence(self, record: _Group) -> int:
        numbers = self.__dict__.setdefault("_numbers", itertools.count(1))
        return next(numbers)

    def _settled_at_rank(self, record: _Group, rank: int) -> _Child | None:
        return next((c for c in record.settled if c.seq == rank), None)


@mutant("G-17")
class InsertsByPositionHost(MemoryEffectHost):
    """G-17: the settled list is kept in position order, so a late settlement of a lower
    position is inserted below ranks already consumed."""

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        done = super()._finalize(record, child, fence, outcome)
        record.settled.sort(key=lambda c: c.position)
        return done


@mutant("G-18")
class ServerSideCursorHost(MemoryEffectHost):
    """G-18: the host remembers how far the group was read and serves the next rank from
    there, whatever the handle says (the "next journal entry")."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        record = self._groups.get(handle.group_key)
        read = getattr(record, "read", 0)
        if record is not None and read < handle.child_count:
            handle.consumed = read
        settlement = await super().await_next_settlement(handle)
        if record is not None:
            record.read = settlement.rank  # type: ignore[attr-defined]
        return settlement


@mutant("G-18")
class ReopenRestoresCursorHost(MemoryEffectHost):
    """G-18: a reopen hands back a handle that has consumed what has settled so far."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        recorded = self._groups.get(group.key)
        handle = await super().open_effect_group(group)
        if recorded is not None:
            handle.consumed = len(recorded.settled)
        return handle


@mutant("G-18", select="G-18")
class HandleNotAdvancedHost(MemoryEffectHost):
    """G-18: the await returns the settlement but leaves the caller's handle where it was
    (the host advanced a copy)."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        return await super().await_next_settlement(handle.copy_cursor())


@mutant("G-19")
class ReservesRankBeforeWaitHost(MemoryEffectHost):
    """G-19: the await reserves its rank by advancing the handle before it waits; a
    cancelled await leaves the handle advanced."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        cursor = handle.copy_cursor()
        if handle.consumed < handle.child_count:
            handle.consumed += 1
        try:
            return await super().await_next_settlement(cursor)
        except Exception:
            handle.consumed = cursor.consumed
            raise


@mutant("G-19")
class CancellationAsErrorHost(MemoryEffectHost):
    """G-19: a cancelled await is reported as an error of the host ("waiting request
    cancelled") instead of the caller's own ``CancelledError``, as an engine client that
    wraps every failed request would."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except asyncio.CancelledError:
            raise RuntimeError("waiting request cancelled") from None


@mutant("G-19")
class CancelledAwaitCancelsChildrenHost(MemoryEffectHost):
    """G-19: a cancelled await is taken for an abandoned group and cancels its children."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except asyncio.CancelledError:
            record = self._groups.get(handle.group_key)
            if record is not None:
                for child in record.children:
                    if child.state != "settled":
                        self._request_cancel(record, child)
            raise


@mutant("G-20")
class ClampingCursorHost(MemoryEffectHost):
    """G-20: an exhausted handle is clamped back to the last rank and served it again."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        record = self._groups.get(handle.group_key)
        if record is not None and handle.consumed >= record.child_count:
            handle.consumed = record.child_count - 1
        return await super().await_next_settlement(handle)


def _lenient_lookup(self: MemoryEffectHost, handle: GroupHandle, skip: str) -> _Group:
    """``_lookup`` with one of the handle's fields trusted instead of fenced."""
    record = self._groups.get(handle.group_key)
    if record is not None:
        value = {
            "child_count": record.child_count,
            "wake": record.wake,
            "disposition": record.declared,
        }[skip]
        handle = handle.model_copy(update={skip: value, "consumed": 0})
    return MemoryEffectHost._lookup(self, handle)


@mutant("G-20")
class NoChildCountFenceHost(MemoryEffectHost):
    """G-20: the handle's child count is trusted; only wake and disposition are compared."""

    def _lookup(self, handle: GroupHandle) -> _Group:
        return _lenient_lookup(self, handle, "child_count")


@mutant("G-20")
class NoWakeFenceHost(MemoryEffectHost):
    """G-20: a handle whose wake disagrees with the record is accepted, on await and on
    close (only the child count and disposition are compared)."""

    def _lookup(self, handle: GroupHandle) -> _Group:
        return _lenient_lookup(self, handle, "wake")


@mutant("G-20")
class NoDispositionFenceHost(MemoryEffectHost):
    """G-20: a handle whose disposition disagrees with the record is accepted, on await
    and on close."""

    def _lookup(self, handle: GroupHandle) -> _Group:
        return _lenient_lookup(self, handle, "disposition")


@mutant("G-20")
class CloseTrustsTheHandleHost(MemoryEffectHost):
    """G-20: the await fences the handle, but the close finds the group by key alone."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        record = self._groups.get(handle.group_key)
        if record is not None:
            handle = handle.model_copy(
                update={
                    "child_count": record.child_count,
                    "wake": record.wake,
                    "disposition": record.declared,
                    "consumed": 0,
                }
            )
        await super().close_effect_group(handle, disposition)


@mutant("R-2")
class ExhaustedBeforeMismatchHost(MemoryEffectHost):
    """R-2: the await checks the cursor against the handle's own child count before
    comparing the handle with the record, so a lying handle at its end is
    ``CursorExhausted`` rather than ``HandleMismatch``."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        if handle.consumed >= handle.child_count and handle.group_key in self._groups:
            raise CursorExhausted("exhausted", group_key=handle.group_key)
        return await super().await_next_settlement(handle)


@mutant("R-2")
class MismatchBeforeClosedHost(MemoryEffectHost):
    """R-2: the await compares the handle with the record before looking at whether the
    group is closed, so a closed group read with a mismatched handle says
    ``HandleMismatch``, not ``GroupClosed``."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        if handle.group_key in self._groups:
            self._lookup(handle)
        return await super().await_next_settlement(handle)


@mutant("G-21", select="G-21 or G-16")
class RanksByPositionHost(MemoryEffectHost):
    """G-21: rank ``n`` is the child at position ``n - 1`` once it settled, so a waiter
    sleeps until the first-positioned child settles."""

    def _settled_at_rank(self, record: _Group, rank: int) -> _Child | None:
        child = record.children[rank - 1]
        return child if child.state == "settled" else None


@mutant("G-21", select="G-21")
class WakesOnCompletionHost(MemoryEffectHost):
    """G-21: waiters are woken when the group completes, not when a rank appears."""

    def _notify(self, record: _Group) -> None:
        if len(record.settled) == record.child_count or record.closed:
            super()._notify(record)


@mutant("G-22")
class SortedSettlementOrderHost(MemoryEffectHost):
    """G-22: ``settlement_order`` returns the settled positions sorted, not in rank order."""

    async def settlement_order(self, group_key: str) -> list[int]:
        return sorted(await super().settlement_order(group_key))


# -- wake policies and combinators -------------------------------------------------------------


@mutant("G-23")
class CancelsOnRejectionHost(MemoryEffectHost):
    """G-23: in an ``ALL`` group a failed child cancels its siblings (fail-fast), though
    ``all`` stopping at a rejection is the caller's decision and losers run on."""

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        done = super()._finalize(record, child, fence, outcome)
        if done and record.wake is WakePolicy.ALL and outcome.status == "error":
            for sibling in record.children:
                if sibling.state != "settled":
                    self._request_cancel(record, sibling)
        return done


@mutant("G-24")
class LossyErrorTypeHost(MemoryEffectHost):
    """G-24: failures are recorded under one generic type, losing the child's error type."""

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        if outcome.error is not None:
            outcome = Outcome.failure("ToolError", outcome.error.message, outcome.error.data)
        await super()._deliver(record, child, fence, outcome)


@mutant("G-24", select="all_settled_and_all")
class DropsTheFailureCodeHost(MemoryEffectHost):
    """G-24: a failure is recorded with its type, message and data but not its code, as a
    host whose failure column set predates ``code`` would."""

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        if outcome.error is not None:
            error = outcome.error
            outcome = Outcome.failure(error.type, error.message, error.data)
        await super()._deliver(record, child, fence, outcome)


@mutant("G-24", select="all_settled_and_all")
class FlattensFailureDataHost(MemoryEffectHost):
    """G-24: a failure's data is recorded as its text (a host storing it in a string
    column), so ``allSettled`` returns data the tool never raised."""

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        if outcome.error is not None:
            error = outcome.error
            outcome = Outcome.failure(error.type, error.message, str(error.data), error.code)
        await super()._deliver(record, child, fence, outcome)


@mutant("G-25")
class DefaultDispositionHandleHost(MemoryEffectHost):
    """G-25: the handle an open returns says ``RUN_TO_COMPLETION`` whatever the group
    declared."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        handle = await super().open_effect_group(group)
        return handle.model_copy(update={"disposition": LoserPolicy.RUN_TO_COMPLETION})


# -- close, losers, drain ---------------------------------------------------------------------


@mutant("G-26")
class WidensCancelHost(MemoryEffectHost):
    """G-26: a ``RUN_TO_COMPLETION`` close of a ``CANCEL`` group is accepted."""

    def _check_narrowing(
        self, group_key: str, current: LoserPolicy, requested: LoserPolicy | None
    ) -> LoserPolicy:
        return requested or current


@mutant("G-26")
class SecondCloseRaisesHost(MemoryEffectHost):
    """G-26: a close of a group already closed raises ``GroupClosed``."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        record = self._groups.get(handle.group_key)
        if handle.group_key in self._retired or (record is not None and record.closed):
            raise GroupClosed("already closed", group_key=handle.group_key)
        await super().close_effect_group(handle, disposition)


@mutant("G-26")
class EffectiveDispositionHandleFenceHost(MemoryEffectHost):
    """G-26 (G-20's edge): the handle is compared with the disposition in force, not the
    declared one, so a close replayed from a handle saved before a narrowing close is
    refused with ``HandleMismatch``."""

    def _lookup(self, handle: GroupHandle) -> _Group:
        record = super()._lookup(handle)
        if handle.disposition is not record.effective:
            raise HandleMismatch("disposition differs", group_key=handle.group_key)
        return record


@mutant("R-3")
class NoneMeansRunToCompletionHost(MemoryEffectHost):
    """R-3: ``close(handle, None)`` is read as the default policy, ``RUN_TO_COMPLETION``,
    instead of the disposition in force."""

    def _check_narrowing(
        self, group_key: str, current: LoserPolicy, requested: LoserPolicy | None
    ) -> LoserPolicy:
        if requested is None:
            return LoserPolicy.RUN_TO_COMPLETION
        return super()._check_narrowing(group_key, current, requested)


@mutant("R-4")
class ReopensClosedHost(MemoryEffectHost):
    """R-4: a reopen of a closed group that has not retired yet returns a handle."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        record = self._groups.get(group.key)
        if record is not None and record.closed:
            self._fence_reopen(record, group)
            return group.handle()
        return await super().open_effect_group(group)


@mutant("R-4")
class ServesClosedGroupHost(MemoryEffectHost):
    """R-4: a closed group that has not retired is still served: its settled ranks are
    read as before the close."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        record = self._groups.get(handle.group_key)
        if record is None or not record.closed:
            return await super().await_next_settlement(handle)
        record.closed = False
        try:
            return await super().await_next_settlement(handle)
        finally:
            record.closed = True


@mutant("R-4")
class ForgetsTombstoneHost(MemoryEffectHost):
    """R-4: retirement deletes everything about the group, tombstone included, so the key
    opens afresh and its children run again."""

    def _maybe_retire(self, record: _Group) -> None:
        super()._maybe_retire(record)
        self._retired.pop(record.key, None)


@mutant("R-4")
class ClosedGroupCloseNarrowsHost(MemoryEffectHost):
    """R-4: a close of a closed or retired group is judged like the first close: a
    widening one is refused with ``DispositionWidened`` and a late ``CANCEL`` one cancels
    the losers still running, instead of being a no-op."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        if handle.group_key in self._retired:
            self._check_narrowing(handle.group_key, self._retired[handle.group_key], disposition)
            return
        record = self._groups.get(handle.group_key)
        if record is None or not record.closed:
            await super().close_effect_group(handle, disposition)
            return
        target = self._check_narrowing(record.key, record.effective, disposition)
        if target is LoserPolicy.CANCEL:
            for child in record.children:
                if child.state != "settled":
                    self._request_cancel(record, child)


@mutant("R-4", select="G-26 or G-17 or G-21")
class ClosedWaiterSleepsHost(MemoryEffectHost):
    """R-4: a close does not wake the waiters parked on the group, so an await in flight
    when the group closes never returns."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        self.__dict__["_closing"] = True
        try:
            await super().close_effect_group(handle, disposition)
        finally:
            self.__dict__["_closing"] = False

    def _notify(self, record: _Group) -> None:
        if not self.__dict__.get("_closing"):
            super()._notify(record)


@mutant("G-27", select="G-27")
class CloseWaitsForLosersHost(MemoryEffectHost):
    """G-27: a ``CANCEL`` close waits until every cancelled loser has stopped."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        record = self._groups.get(handle.group_key)
        children = record.children if record is not None else []
        tasks = [self._tasks[c] for c in children if c in self._tasks]
        await super().close_effect_group(handle, disposition)
        await asyncio.gather(*tasks, return_exceptions=True)


@mutant("G-27")
class CancelledLosersDoNotRankHost(MemoryEffectHost):
    """G-27: a loser cancelled by a close is stopped but its terminal is never recorded,
    so the group's ranks never complete and it never retires."""

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        if outcome.status == "cancelled" and record.closed:
            child.state = "cancelled-unrecorded"
            return False
        return super()._finalize(record, child, fence, outcome)


@mutant("G-27")
class UnstartedLosersNeverSettleHost(MemoryEffectHost):
    """G-27: a ``CANCEL`` close cancels each child's task, but a task cancelled before its
    first step never records its cancelled terminal, so a close straight after the open
    leaves the children unranked and the group never retires."""

    def _cancel_ended(
        self, record: _Group, child: _Child, fence: int, task: asyncio.Task[None]
    ) -> None:
        self._forget(child, task)


@mutant("G-52")
class SparesHostRunLosersHost(MemoryEffectHost):
    """G-52 (G-27): a ``CANCEL`` close cancels the losing tool calls but not the ``sleep``
    or ``await_event`` children the host runs itself."""

    def _request_cancel(self, record: _Group, child: _Child) -> None:
        if not is_host_kind(child.envelope):
            super()._request_cancel(record, child)


@mutant("G-52", select="G-52")
class WaitsOutHostRunLosersHost(MemoryEffectHost):
    """G-52 (G-27): a ``CANCEL`` close lets a losing ``sleep`` the host runs itself reach
    its due time before it returns, as a host whose timers cannot be interrupted would;
    the close is only as prompt as the longest sleep."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        record = self._groups.get(handle.group_key)
        if record is not None and not record.closed:
            sleeps = [
                self._tasks[c]
                for c in record.children
                if c in self._tasks and c.envelope.kind == EffectKind.SLEEP
            ]
            if sleeps and record.effective is LoserPolicy.CANCEL:
                await asyncio.wait(sleeps)
        await super().close_effect_group(handle, disposition)


@mutant("G-20")
class AnonymousUnknownGroupHost(MemoryEffectHost):
    """G-20 (errors carry ids): an await of a key no group was recorded under is
    ``UnknownGroup``, whose message names the key but whose ``group_key`` is unset."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except UnknownGroup as exc:
            raise UnknownGroup(exc.message) from None


@mutant("G-22")
class SortsAClosedGroupsOrderHost(MemoryEffectHost):
    """G-22: once a group is closed, ``settlement_order`` lists its settled positions in
    position order rather than rank order (the projection is "only for operators")."""

    async def settlement_order(self, group_key: str) -> list[int]:
        order = await super().settlement_order(group_key)
        record = self._groups.get(group_key)
        return sorted(order) if record is not None and record.closed else order


@mutant("G-22")
class DropsAClosedGroupsOrderHost(MemoryEffectHost):
    """G-22: a closed group's ``settlement_order`` is ``UnknownGroup`` at once, before the
    group retired (its ranks are "only for operators")."""

    async def settlement_order(self, group_key: str) -> list[int]:
        record = self._groups.get(group_key)
        if record is not None and record.closed:
            raise UnknownGroup(f"group {group_key!r} is closed", group_key=group_key)
        return await super().settlement_order(group_key)


@mutant("G-22")
class AnswersARetiredGroupsOrderHost(MemoryEffectHost):
    """G-22: a retired group's ``settlement_order`` keeps answering its final order (as a
    finished engine run that still answers queries would) instead of ``UnknownGroup``."""

    def _maybe_retire(self, record: Any) -> None:
        final = [child.position for child in record.settled]
        super()._maybe_retire(record)
        if record.key in self._retired:
            self.__dict__.setdefault("final_orders", {})[record.key] = final

    async def settlement_order(self, group_key: str) -> list[int]:
        final = self.__dict__.get("final_orders", {})
        if group_key in final:
            return list(final[group_key])
        return await super().settlement_order(group_key)


@mutant("G-28")
class CloseCancelsEveryLoserHost(MemoryEffectHost):
    """G-28: every close cancels the losers, whatever the disposition in force."""

    def _check_narrowing(
        self, group_key: str, current: LoserPolicy, requested: LoserPolicy | None
    ) -> LoserPolicy:
        super()._check_narrowing(group_key, current, requested)
        return LoserPolicy.CANCEL


@mutant("G-28")
class ClosedGroupDropsSettlementsHost(MemoryEffectHost):
    """G-28: once the caller closed, a loser's settlement is dropped instead of taking a
    rank, so the group never completes its ranks and never retires."""

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        if record.closed and outcome.status != "cancelled":
            return False
        return super()._finalize(record, child, fence, outcome)


class _BrokenDrainHost(MemoryEffectHost):
    """A host whose drain does ``before_pass`` (the broken rule) before each honest pass."""

    def before_pass(self) -> None:
        raise NotImplementedError

    def drain(self) -> _MemoryDrain:
        host = self

        class Drain(_MemoryDrain):
            async def run_pass(self) -> Any:
                host.before_pass()
                return await super().run_pass()

        return Drain(host)


@mutant("G-28", harness="durable")
class DrainCancelsOrphansHost(_BrokenDrainHost):
    """G-28: the drain cancels every orphaned child, ``RUN_TO_COMPLETION`` losers of a
    gone caller included."""

    def before_pass(self) -> None:
        for record in self._groups.values():
            record.effective = LoserPolicy.CANCEL


@mutant("G-29", harness="durable")
class DrainRunsEverythingHost(_BrokenDrainHost):
    """G-29: the drain invents a disposition: it resumes every orphaned child, so a
    ``CANCEL`` group whose caller crashed before closing runs its losers on."""

    def before_pass(self) -> None:
        for record in self._groups.values():
            record.effective = LoserPolicy.RUN_TO_COMPLETION


@mutant("R-1", harness="durable")
class DrainTakesLiveHostKindsHost(_BrokenDrainHost):
    """R-1: the drain knows the live owner's tool-call tasks but not its timers and event
    waits, and cancels those of a live ``CANCEL`` group as orphans."""

    def before_pass(self) -> None:
        for record in list(self._groups.values()):
            if record.effective is not LoserPolicy.CANCEL:
                continue
            for child in record.children:
                if child.state != "settled" and is_host_kind(child.envelope):
                    self._request_cancel(record, child)


@mutant("G-52", harness="durable", select="cancelled_select_arm")
class DrainFiresOrphanedTimersHost(MemoryEffectHost):
    """G-52 (G-29): the drain finishes an orphaned ``sleep`` of a ``CANCEL`` group as a
    fired timer (``success(null)``), not as cancelled: the author takes a timer whose
    process died for one that went off. It still drains in position order, so a select's
    event arm is cancelled first and takes rank 1."""

    _draining = False

    def drain(self) -> _MemoryDrain:
        host = self

        class Drain(_MemoryDrain):
            async def run_pass(self) -> Any:
                host._draining = True
                try:
                    return await super().run_pass()
                finally:
                    host._draining = False

        return Drain(host)

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        if self._draining and child.envelope.kind == EffectKind.SLEEP:
            outcome = Outcome.success(None)
        return super()._finalize(record, child, fence, outcome)


# -- child kinds ---------------------------------------------------------------------------------


@mutant("R-5")
class SleepReturnsItsDurationHost(MemoryEffectHost):
    """R-5: a ``sleep`` child settles with the seconds it slept, not ``null``."""

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        if child.envelope.kind == EffectKind.SLEEP and outcome.ok:
            outcome = Outcome.success(child.envelope.input)
        await super()._deliver(record, child, fence, outcome)


@mutant("G-51")
class EventWrapsPayloadHost(MemoryEffectHost):
    """G-51: an ``await_event`` child settles with the whole event (name and payload)
    rather than its payload."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        return await super().deliver_event(group_key, name, {"name": name, "payload": payload})


@mutant("R-5")
class EventCountsEveryNamesakeHost(MemoryEffectHost):
    """R-5: ``deliver_event`` returns how many children of that name the group has, settled
    ones included, not how many it settled."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        await super().deliver_event(group_key, name, payload)
        record = self._groups.get(group_key)
        if record is None:
            return 0
        return sum(
            c.envelope.kind == EffectKind.AWAIT_EVENT and c.envelope.name == name
            for c in record.children
        )


@mutant("R-5")
class EventsAreGlobalHost(MemoryEffectHost):
    """R-5: an event settles every open group's ``await_event`` children of that name (the
    event bus has one namespace), not only the group it was delivered to."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        reached = await super().deliver_event(group_key, name, payload)
        for other in list(self._groups):
            if other != group_key:
                await super().deliver_event(other, name, payload)
        return reached


@mutant("R-5")
class UnknownEventTargetIsZeroHost(MemoryEffectHost):
    """R-5: an event for a key that was never recorded returns 0 instead of
    ``UnknownGroup``, so a typo in the key looks like a late delivery."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        if group_key not in self._groups:
            return 0
        return await super().deliver_event(group_key, name, payload)


@mutant("G-51", harness="durable", select="G-51")
class SleepRestartsFromZeroHost(MemoryEffectHost):
    """G-51: a ``sleep`` child's due time is computed when it is dispatched, so after a
    restart it sleeps its whole duration again."""

    def _dispatch(self, record: _Group, child: _Child, executor: EffectExecutor) -> None:
        child.due_at = None
        super()._dispatch(record, child, executor)


@mutant("G-51", harness="durable")
class EventNeedsALiveWaiterHost(MemoryEffectHost):
    """G-51 (R-5): an event reaches only ``await_event`` children whose waiter is running
    in this process; delivered while the caller is down, it is lost."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        record = self._groups.get(group_key)
        hidden = []
        if record is not None:
            hidden = [c for c in record.children if c not in self._tasks and c.event is None]
        for child in hidden:
            child.event = (None,)
        try:
            return await super().deliver_event(group_key, name, payload)
        finally:
            for child in hidden:
                child.event = None


@mutant("G-52", harness="durable")
class EventWaitsResumeOnlyWithTheirEventHost(MemoryEffectHost):
    """G-52 (G-51): a restarted process settles the ``await_event`` children whose event
    arrived while it was down, but does not arm a waiter for the others, so an event
    delivered after the reopen decides nothing: a select reopened after a restart is
    never decided by its signal."""

    def _dispatch(self, record: _Group, child: _Child, executor: EffectExecutor) -> None:
        if child.envelope.kind == EffectKind.AWAIT_EVENT and child.fence and child.event is None:
            return
        super()._dispatch(record, child, executor)


# -- engine routing (G-14), on the routed harness -------------------------------------------------


@mutant("G-14", harness="routed")
class EngineFailureLosesItsCodeHost(RoutingMemoryHost):
    """G-14: a routed child's engine failure is recorded as a plain error (the exception's
    name and message), so the engine's 404 for an unbound target loses its code."""

    async def _call(self, target: str, envelope: EffectEnvelope) -> Any:
        return await self.engine.call(target, envelope)


@mutant("G-14", harness="routed")
class RetriesUnboundTargetsHost(RoutingMemoryHost):
    """G-14: every engine failure is taken for a transient one and the call retried with
    a backoff, so a child addressed to a target no deployment binds never settles."""

    async def _call(self, target: str, envelope: EffectEnvelope) -> Any:
        delay = 0.01
        while True:
            try:
                return await super()._call(target, envelope)
            except ToolError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.2)


# -- R-6, R-7 --------------------------------------------------------------------------------------


@mutant("R-6")
class ReplayKeysPerGroupHost(MemoryEffectHost):
    """R-6: replay keys are checked for uniqueness within a group only; a second group may
    record a child under a replay key another group holds."""

    def _check_replay_keys(self, group: EffectGroup) -> None:
        return None


@mutant("R-7")
class RacyFirstOpenHost(MemoryEffectHost):
    """R-7: the first open yields between finding no record and writing one (an async
    resolver), so two concurrent first opens both record the group and start its
    children twice."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        if group.key not in self._groups and self._resolver is not None:
            await asyncio.sleep(0)
            self._groups.pop(group.key, None)
        return await super().open_effect_group(group)


# -- payloads and sealing ---------------------------------------------------------------------


@mutant("G-47", harness="sealed")
class InlinesEverythingHost(MemoryEffectHost):
    """G-47: every outcome is recorded inline in the rank record, however large."""

    async def _encode(
        self, policy: Any, record: _Group, child: _Child, fence: int, outcome: Outcome
    ) -> None:
        self._encoded[(record.key, child.replay_key, fence)] = encode_outcome_inline(
            policy, record.key, child.replay_key, outcome, position=child.position
        )


@mutant("G-48", harness="sealed")
class TriesSiblingSlotsHost(MemoryEffectHost):
    """G-48: a sealed outcome that does not open in its slot is tried in the other slots of
    its group (a "lenient" reader after a migration), so a value moved within the group
    reads as genuine."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except SealedPayloadUnreadable:
            record = self._groups[handle.group_key]
            rank = handle.consumed + 1
            child = self._settled_at_rank(record, rank)
            assert child is not None and child.stored is not None
            for sibling in record.children:
                try:
                    outcome = await decode_outcome(
                        self._payloads,
                        record.key,
                        sibling.replay_key,
                        child.stored,
                        position=sibling.position,
                    )
                except SealedPayloadUnreadable:
                    continue
                handle.consumed = rank
                return Settlement(
                    rank=rank,
                    position=child.position,
                    replay_key=child.replay_key,
                    outcome=outcome,
                )
            raise


@mutant("G-49", harness="sealed")
class HandsOverTheEnvelopeHost(MemoryEffectHost):
    """G-49: a reader that cannot open a sealed outcome returns the recorded envelope as
    the value."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except SealedPayloadUnreadable:
            record = self._groups[handle.group_key]
            rank = handle.consumed + 1
            child = self._settled_at_rank(record, rank)
            assert child is not None and child.stored is not None
            handle.consumed = rank
            return Settlement(
                rank=rank,
                position=child.position,
                replay_key=child.replay_key,
                outcome=Outcome.success(child.stored.model_dump(mode="json")),
            )


@mutant("G-49", harness="sealed")
class QuotesTheSealedBytesHost(MemoryEffectHost):
    """G-49: a refusal to open a sealed outcome quotes the recorded envelope's ciphertext
    "for debugging": no plaintext, but the sealed value leaves the store with the error."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except SealedPayloadUnreadable as exc:
            child = self._settled_at_rank(self._groups[handle.group_key], handle.consumed + 1)
            envelope = None if child is None or child.stored is None else child.stored.envelope
            if envelope is None:
                raise
            raise SealedPayloadUnreadable(
                f"{exc} (recorded: {envelope.ciphertext})",
                group_key=exc.group_key,
                replay_key=exc.replay_key,
            ) from None


@mutant("G-49", harness="sealed")
class AdvancesBeforeDecodingHost(MemoryEffectHost):
    """G-49: the handle is advanced before the outcome is decoded, so a refused read still
    moves the cursor."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except (SealedPayloadUnreadable, PayloadShredded):
            handle.consumed += 1
            raise


@mutant("G-50", harness="sealed")
class ShreddedLooksUnreadableHost(MemoryEffectHost):
    """G-50: every failure to open a sealed outcome is reported as
    ``SealedPayloadUnreadable``, erasure included."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except PayloadShredded as exc:
            raise SealedPayloadUnreadable(
                "cannot open", group_key=exc.group_key, replay_key=exc.replay_key
            ) from None


def _shape_fence(record: _Group, group: EffectGroup) -> None:
    if (record.child_count, record.wake, record.declared) != (
        group.child_count,
        group.wake,
        group.disposition,
    ):
        raise GroupShapeMismatch("shape differs", group_key=group.key)


@mutant("G-10")
class RecordsBeforeCheckingSleepsHost(MemoryEffectHost):
    """G-10: the first open records the group, then validates its children's inputs; a
    malformed ``sleep`` is refused, but the group stays recorded (as the SQL tier did when
    child-kind validation ran after the group row committed)."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        from effecthost.contract import InvalidEnvelope

        try:
            return await super().open_effect_group(group)
        except InvalidEnvelope:
            if group.key not in self._groups:
                self._record_group(group)
            raise


@mutant("G-12")
class UnwiredDrainRefusedHost(MemoryEffectHost):
    """G-12: a host with no resolver refuses to hand out a drain, as if draining needed
    executors (it reports every unfinished child as ``NoExecutor`` instead)."""

    def drain(self) -> GroupDrain:
        if not self.supports_effect_groups():
            from effecthost.contract import EffectGroupUnsupported

            raise EffectGroupUnsupported("no resolver: no drain")
        return super().drain()


# -- retirement waits for every child (R-11) --------------------------------------------------


@mutant("R-11", select="claimed_until_it_retires")
class FreesReplayKeysAtCloseHost(MemoryEffectHost):
    """R-11: close releases the group's replay-key claims at once, while a
    ``RUN_TO_COMPLETION`` loser still runs, so a new group reusing its key opens."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        await super().close_effect_group(handle, disposition)
        record = self._groups.get(handle.group_key)
        if record is not None:
            for child in record.children:
                self._replay_keys.pop(child.replay_key, None)


@mutant("R-11", select="closed_group_until_it_retires")
class ClosedGroupIgnoresEventsHost(MemoryEffectHost):
    """R-11: ``deliver_event`` to a closed group settles nothing and returns 0, as if the
    group had retired at close; its pending event wait never settles and the group never
    retires."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        record = self._groups.get(group_key)
        if record is not None and record.closed:
            return 0
        return await super().deliver_event(group_key, name, payload)


@mutant("R-11", select="until_it_retires")
class KeepsClaimsAfterRetirementHost(MemoryEffectHost):
    """R-11: retirement drops the group's ranks but keeps its replay-key claims, so the
    keys of a retired group are refused for ever."""

    def _maybe_retire(self, record: _Group) -> None:
        claims = {c.replay_key: record.key for c in record.children}
        super()._maybe_retire(record)
        if record.key in self._retired:
            self._replay_keys.update(claims)


@mutant("G-36", select="claimed_until_it_retires")
class NeverRetiresHost(MemoryEffectHost):
    """G-36: retirement switched off: a closed group whose children all settled keeps its
    record and its replay-key claims for ever, so its keys are never free again."""

    def _maybe_retire(self, record: _Group) -> None:
        return None


# -- the losers of a decided CANCEL group stay down ---------------------------------------


@mutant("R-13", harness="durable", select="losers_of_a_decided")
class ReopenRestartsDecidedLosersHost(MemoryEffectHost):
    """R-13: a reopen restarts every unsettled child no task runs, decided or not (as
    before the ruling), so a restarted ``race`` caller that re-reads rank 1 and closes
    starts every loser's tool a second time."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        reopen = group.key in self._groups
        handle = await super().open_effect_group(group)
        if reopen:
            self._restart(self._groups[group.key])
        return handle


class _WakingDispatcherHost(MemoryEffectHost):
    """A host whose dispatcher starts the children marked runnable when it next wakes: at
    the next open, of any group, before that group's own children."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._runnable: list[_Group] = []

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        woken, self._runnable = self._runnable, []
        for record in woken:
            if not record.closed:
                self._restart(record)
        return await super().open_effect_group(group)


@mutant("R-13", harness="durable", select="losers_of_a_decided")
class ReopenQueuesDecidedLosersHost(_WakingDispatcherHost):
    """R-13: a reopen marks every unsettled child no task runs as runnable, decided or
    not, and the dispatcher starts them at its next wake (the next open). The losers of a
    decided race start after the reopen has returned, not during it, and a close that
    comes first finds them still down."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        reopen = group.key in self._groups
        handle = await super().open_effect_group(group)
        if reopen:
            self._runnable.append(self._groups[group.key])
        return handle


@mutant("R-13", harness="durable", select="losers_of_a_decided")
class DrainQueuesDecidedLosersHost(_WakingDispatcherHost):
    """R-13 (R-1): a drain pass takes the unsettled losers of a decided group whose
    caller reopened it for orphans, but only frees them for a claim: it marks them
    runnable and reports nothing resumed (it started nothing), and the dispatcher starts
    them at its next wake (the next open)."""

    def drain(self) -> _MemoryDrain:
        host = self

        class Drain(_MemoryDrain):
            async def run_pass(self) -> Any:
                host._runnable.extend(r for r in host._groups.values() if r.held)
                return await super().run_pass()

        return Drain(host)


# -- G-36: a close and the last settlement meet --------------------------------------------------


@mutant("G-36", select="meeting_the_last_settlement")
class CloseMeetsTheLastSettlementHost(MemoryEffectHost):
    """G-36: the close and each settlement judge retirement from what they read one store
    round trip before their own write: a close that saw a child unsettled and a last
    settlement that saw the group open both decline to retire it, so it never retires
    (its replay keys stay claimed for ever)."""

    ROUND_TRIP = 0.05

    def _maybe_retire(self, record: _Group) -> None:
        return None  # judged below, from the earlier reads

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        closed = record.closed
        await asyncio.sleep(self.ROUND_TRIP)
        if self._finalize(record, child, fence, outcome) and closed:
            MemoryEffectHost._maybe_retire(self, record)

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        record = self._groups.get(handle.group_key)
        complete = record is not None and len(record.settled) == record.child_count
        await asyncio.sleep(self.ROUND_TRIP)
        await super().close_effect_group(handle, disposition)
        if complete and record is not None:
            MemoryEffectHost._maybe_retire(self, record)
