"""Broken memory hosts whose refusals drop an id they are about (§7), and whose byte
limits leak (R-8): each is the right error type, so only a check reading the ids or the
limits kills it. Registered in the catalog like ``memory_mutants.py``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from catalog import CATALOG, MUTANT_TIMEOUT, Mutant, mutant

from effecthost.conformance import FactoryEnv, HostUnderTest, conformance_resolver
from effecthost.contract import (
    EffectExecutor,
    EffectGroup,
    EffectGroupUnsupported,
    EffectHostError,
    EffectKind,
    ExecutionInput,
    GroupClosed,
    GroupDrain,
    GroupHandle,
    HandleMismatch,
    InvalidEnvelope,
    Outcome,
    ReplayMismatch,
    SealedPayloadUnreadable,
    Settlement,
    UnknownGroup,
    canonical_json,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.memory._host import _Child, _Group
from effecthost.hosts.memory.testing import PAYLOAD_LIMIT, LimitedMemoryHostUnderTest

# -- §7: refusals name their ids ------------------------------------------------------------


def _without_ids(method: Callable[..., Any], refusal: type[EffectHostError]) -> Any:
    """``method`` of the reference host, but its ``refusal`` is raised again with the
    message alone: the same error type, none of its ids."""
    if inspect.iscoroutinefunction(method):

        async def refused_async(self: MemoryEffectHost, *args: Any) -> Any:
            try:
                return await method(self, *args)
            except refusal as exc:
                raise refusal(str(exc)) from None

        return refused_async

    def refused(self: MemoryEffectHost, *args: Any) -> Any:
        try:
            return method(self, *args)
        except refusal as exc:
            raise refusal(str(exc)) from None

    return refused


@mutant("G-07", select="unwired_refusal_names")
class UnwiredRefusalNamesNoGroupHost(MemoryEffectHost):
    """G-07: an unwired controller refuses every group method with
    ``EffectGroupUnsupported``, but says only that no resolver is registered: the error
    carries no group key."""

    _require_wired = _without_ids(MemoryEffectHost._require_wired, EffectGroupUnsupported)


@mutant("G-20", select="handle_refusal_names")
class HandleMismatchNamesNoGroupHost(MemoryEffectHost):
    """G-20: a mismatched handle is refused with ``HandleMismatch`` that carries no group
    key (the message describes the shapes only)."""

    _lookup = _without_ids(MemoryEffectHost._lookup, HandleMismatch)


@mutant("G-22", select="unknown_key_names")
class OrderOfAnUnknownKeyNamesNothingHost(MemoryEffectHost):
    """G-22: ``settlement_order`` of an unknown key is ``UnknownGroup`` without the key."""

    settlement_order = _without_ids(MemoryEffectHost.settlement_order, UnknownGroup)


@mutant("R-5", select="unknown_group_names")
class EventToAnUnknownKeyNamesNothingHost(MemoryEffectHost):
    """R-5: ``deliver_event`` to an unknown key is ``UnknownGroup`` without the key."""

    deliver_event = _without_ids(MemoryEffectHost.deliver_event, UnknownGroup)


@mutant("R-4", select="told_which_group")
class ClosedWaiterNamesNoGroupHost(MemoryEffectHost):
    """R-4: an await refused because its group is closed raises ``GroupClosed`` without
    the group key."""

    await_next_settlement = _without_ids(MemoryEffectHost.await_next_settlement, GroupClosed)


@mutant("R-6", select="taken_replay_key_is_refused")
class TakenReplayKeyWithoutPositionHost(MemoryEffectHost):
    """R-6: a replay key another group holds is refused with ``ReplayMismatch`` naming
    both groups and the key, but not where the child sits in the refused group."""

    def _check_replay_keys(self, group: EffectGroup) -> None:
        try:
            super()._check_replay_keys(group)
        except ReplayMismatch as exc:
            raise ReplayMismatch(
                str(exc), group_key=exc.group_key, replay_key=exc.replay_key
            ) from None


# -- §7, R-8: the host's own byte limit ------------------------------------------------------


def limited_mutant(breaks: str, *, select: str) -> Any:
    """Register a memory-host mutant built, as the shipped memory ``factory`` builds the
    reference host, with the byte limit it declares (``payload_limit``)."""

    def register(cls: type[MemoryEffectHost]) -> type[MemoryEffectHost]:
        def factory(env: FactoryEnv) -> HostUnderTest:
            under_test = LimitedMemoryHostUnderTest(
                cls(conformance_resolver(env.lab_path), max_payload_bytes=PAYLOAD_LIMIT),
                cls(max_payload_bytes=PAYLOAD_LIMIT),
            )
            under_test.timeout = MUTANT_TIMEOUT
            return under_test

        factory.__name__ = f"{cls.__name__}_factory"
        doc = " ".join((cls.__doc__ or "").split())
        CATALOG.append(Mutant(cls.__name__, breaks, doc, factory, "memory", select))
        return cls

    return register


@limited_mutant("G-10", select="input_over_the_hosts_limit")
class SizesOnlyTheFirstChildHost(MemoryEffectHost):
    """G-10 (§7): the open measures the first child's input against the byte limit and
    takes the rest as fitting, so an oversized input at another position is recorded."""

    def _check_sizes(self, group: EffectGroup) -> None:
        super()._check_sizes(group.model_copy(update={"children": group.children[:1]}))


@limited_mutant("R-8", select="result_over_the_hosts_limit")
class RecordsOversizedResultsHost(MemoryEffectHost):
    """R-8: a tool result over the host's byte limit is recorded as it is, not as the
    child's ``PayloadTooLarge`` failure."""

    def _bounded(self, record: _Group, child: _Child, outcome: Outcome) -> Outcome:
        return outcome


@limited_mutant("R-5", select="event_over_the_hosts_limit")
class RefusesOversizedEventsUntypedHost(MemoryEffectHost):
    """R-5 (§7): an event over the byte limit is refused, but as a ``ValueError`` of the
    host's own, not the typed ``PayloadTooLarge``."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        if len(canonical_json(payload)) > self._max_payload_bytes:
            raise ValueError(f"event {name!r} is too large")
        return await super().deliver_event(group_key, name, payload)


# -- G-34: one drain pass over what a crash left -----------------------------------------------


@mutant("G-34", harness="durable", select="sorts_what_a_crash_left")
class DrainsAReopenedDecidedGroupHost(MemoryEffectHost):
    """G-34 (R-1, R-13): a drain pass takes every group with unfinished children for an
    orphan, also a decided one its caller has just reopened, and cancels its losers
    under the live caller."""

    def drain(self) -> GroupDrain:
        for record in self._groups.values():
            record.held = False
        return super().drain()


@mutant("G-49", harness="sealed", select="refused_naming_its_slot")
class UnreadableRankNamesOnlyTheGroupHost(MemoryEffectHost):
    """G-49 (§7): a rank a reader cannot open is refused with ``SealedPayloadUnreadable``
    naming the group key only, not which child or rank."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        try:
            return await super().await_next_settlement(handle)
        except SealedPayloadUnreadable as exc:
            raise SealedPayloadUnreadable(str(exc), group_key=exc.group_key) from None


# -- an event and a closed group -----------------------------------------------------


@mutant("R-5", select="reaches_no_wait_a_close_cancelled")
class CountsCancelledWaitsHost(MemoryEffectHost):
    """R-5: ``deliver_event`` counts every wait of the name that no event reached yet,
    also one a ``CANCEL`` close has already settled as cancelled."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        reached = await super().deliver_event(group_key, name, payload)
        record = self._groups.get(group_key)
        if record is not None:
            reached += sum(
                1
                for child in record.children
                if child.envelope.kind == EffectKind.AWAIT_EVENT
                and child.envelope.name == name
                and child.state == "settled"
                and child.event is None
            )
        return reached


# -- G-09: the attempt a tool is told ----------------------------------------------------------


class _FirstAttempt(EffectExecutor):
    """Runs ``inner`` telling it it is attempt 1, whatever the host counted."""

    def __init__(self, inner: EffectExecutor) -> None:
        super().__init__()
        self._inner = inner

    async def execute(self, call: ExecutionInput) -> Outcome:
        return await self._inner.execute(ExecutionInput(call.envelope, 1))

    async def run(self, call: ExecutionInput) -> Any:  # pragma: no cover - execute is whole
        raise NotImplementedError


@mutant("G-09", harness="durable", select="later_attempt")
class EveryRunIsAttemptOneHost(MemoryEffectHost):
    """G-09: a child run again after a crash is told it is attempt 1, like its first
    run, so a tool cannot tell a re-run from a first run."""

    def _dispatch(self, record: _Group, child: _Child, executor: EffectExecutor) -> None:
        super()._dispatch(record, child, _FirstAttempt(executor))


@mutant("G-26", select="close_with_no_disposition")
class BadDispositionNamesNoGroupHost(MemoryEffectHost):
    """G-26 (§7): a close with a disposition that is no loser policy is refused with
    ``InvalidEnvelope`` that does not say which group's close it was."""

    async def close_effect_group(self, handle: GroupHandle, disposition: Any = None) -> None:
        try:
            await super().close_effect_group(handle, disposition)
        except InvalidEnvelope as exc:
            raise InvalidEnvelope(str(exc)) from None
