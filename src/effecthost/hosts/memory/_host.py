"""The in-memory reference host: the observable semantics of SPEC §2, durable only for
the life of the process. Children run as asyncio tasks.

Subclasses (the adversarial host, and the deliberately broken hosts the suite is tested
against) override the small hooks marked *hook* below; everything else is the rule.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from effecthost.contract import (
    DrainReport,
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectHostError,
    EffectKind,
    ExecutionInput,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    LoserPolicy,
    NoExecutor,
    Outcome,
    PayloadTooLarge,
    Settlement,
    WakePolicy,
    WiredController,
    canonical_json,
    coerce_disposition,
    is_host_kind,
    kit,
    limits,
    require_group,
    require_handle,
    sleep_durations,
    sleep_seconds,
)
from effecthost.payloads import (
    PayloadPolicy,
    StoredOutcome,
    decode_outcome,
    encode_outcome,
    encode_outcome_inline,
    event_value,
)

DEFAULT_MAX_PAYLOAD_BYTES = 2 * 1024 * 1024


@dataclass(eq=False, slots=True)
class _Child:
    """One child's record. Its replay key and hash are read from the envelope, not copied:
    a wide group holds one record per child."""

    envelope: EffectEnvelope
    position: int
    state: str = "pending"  # pending | running | settled
    fence: int = 0
    seq: int | None = None
    outcome: Outcome | None = None
    stored: StoredOutcome | None = None  # instead of ``outcome`` when a payload policy is set
    cancel_requested: bool = False
    due_at: float | None = None
    event: tuple[Any] | None = None
    arrived: asyncio.Event | None = None  # made for an await_event child when it waits

    @property
    def replay_key(self) -> str:
        return self.envelope.replay_key

    @property
    def hash(self) -> str:
        return self.envelope.envelope_hash()

    @property
    def event_arrived(self) -> asyncio.Event:
        """Set once an event reached this child; made on first use (most children never
        wait for one, and an event costs its own allocations per child)."""
        if self.arrived is None:
            self.arrived = asyncio.Event()
        return self.arrived


@dataclass(eq=False)
class _Group:
    key: str
    wake: WakePolicy
    declared: LoserPolicy
    children: list[_Child]
    effective: LoserPolicy
    counter: int = 0
    settled: list[_Child] = field(default_factory=list)  # ordered by seq
    closed: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    parked: Counter[int] = field(default_factory=Counter)  # awaits waiting, by rank
    held: bool = False  # a reopen found it decided: its losers wait for an await

    @property
    def child_count(self) -> int:
        return len(self.children)

    def shape(self) -> kit.GroupRecord:
        """The record as the kit's fences read it; ``closed`` is checked by the host's own
        order of refusals (R-2). Kept until a field it copies changes."""
        shape = self.__dict__.get("_shape")
        if (
            shape is None
            or shape.effective is not self.effective
            or shape.child_count != len(self.children)
            or shape.wake is not self.wake
            or shape.declared is not self.declared
            or shape.key != self.key
        ):
            shape = kit.GroupRecord(
                self.key, self.child_count, self.wake, self.declared, self.effective
            )
            self.__dict__["_shape"] = shape
        return shape


class MemoryEffectHost(WiredController):
    """Reference host. ``supports_effect_groups()`` is true iff a resolver is registered.

    Ranks are served as the ``rank``-th smallest settlement sequence (G-16); this host's
    sequences happen to be dense, but nothing relies on that.

    With ``payloads`` (G-47…G-50) each outcome is recorded as the
    :class:`~effecthost.payloads.StoredOutcome` of :func:`~effecthost.payloads.encode_outcome`
    (inline or by reference, sealed or not) and served through
    :func:`~effecthost.payloads.decode_outcome`; a retired group's payloads are deleted.
    Without it (the default) outcomes are recorded as they are.
    """

    def __init__(
        self,
        resolver: GroupExecutors | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        payloads: PayloadPolicy | None = None,
    ) -> None:
        self._resolver = resolver
        self._max_payload_bytes = max_payload_bytes
        self._groups: dict[str, _Group] = {}
        self._retired: dict[str, LoserPolicy] = {}
        self._replay_keys: dict[str, str] = {}  # replay key -> the group recording it
        self._tasks: dict[_Child, asyncio.Task[None]] = {}  # keyed by the child: no key tuple each
        self._payloads = payloads
        self._encoded: dict[tuple[str, str, int], StoredOutcome] = {}
        self._deletions: set[asyncio.Task[None]] = set()

    def with_payloads(self, payloads: PayloadPolicy | None) -> MemoryEffectHost:
        """Another controller over the same recorded state, configured with other payload
        settings: what a second process with another key store sees (G-49)."""
        view = copy.copy(self)
        view._payloads = payloads
        return view

    # -- wiring -------------------------------------------------------------------------

    def supports_concurrent_effects(self) -> bool:
        return True

    # -- open ---------------------------------------------------------------------------

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self._require_wired(require_group(group).key)
        record = self._groups.get(group.key)
        if group.key in self._retired or (record is not None and record.closed):
            raise kit.group_closed(group.key)  # R-4, first in R-2's order
        if record is None:
            self._check_sizes(group)
            sleep_durations(group)
            self._check_replay_keys(group)
            executors = self._resolve_all(group)
            record = self._record_group(group)
            for child, executor in zip(record.children, executors, strict=True):
                self._dispatch(record, child, executor)
        else:
            self._fence_reopen(record, group)
            record.held = kit.decided(record.shape(), map(_status, record.settled))
            if not record.held:  # a decided group's losers stay down
                self._restart(record)
        return group.handle()

    def _restart(self, record: _Group) -> None:
        """Dispatch the unsettled children no task of this process runs (a reopen, or
        R-13's caller awaiting a rank that does not exist yet)."""
        for child in record.children:
            if child.state != "settled" and child not in self._tasks:
                runner = self._resolve(child.envelope)
                if runner is not None:
                    self._dispatch(record, child, runner)

    def _check_sizes(self, group: EffectGroup) -> None:
        for position, child in enumerate(group.children):
            if child.canonical_size() <= self._max_payload_bytes:
                continue  # the input is a part of the envelope's encoding
            size = len(canonical_json(child.input))
            if size > self._max_payload_bytes:
                raise PayloadTooLarge(
                    f"input of child {child.replay_key!r} of group {group.key!r} encodes to {size} "
                    f"bytes, over the limit of {self._max_payload_bytes}",
                    group_key=group.key,
                    replay_key=child.replay_key,
                    position=position,
                )

    def _check_replay_keys(self, group: EffectGroup) -> None:
        """Replay keys are unique in the host's record, not only within a group (R-6);
        a retired group's keys are free again, as on the SQL tiers."""
        for position, child in enumerate(group.children):
            holder = self._replay_keys.get(child.replay_key)
            if holder is not None:
                raise kit.replay_key_taken(group.key, position, child.replay_key, holder)

    def _resolve_all(self, group: EffectGroup) -> list[EffectExecutor]:
        """First open: resolve every child before recording anything (G-10)."""
        return [e for e in kit.resolve_first_open(group, self._resolve) if e is not None]

    def _record_group(self, group: EffectGroup) -> _Group:
        record = _Group(
            key=group.key,
            wake=group.wake,
            declared=group.disposition,
            effective=group.disposition,
            children=[_Child(child, _position(child)) for child in group.children],
        )
        self._groups[group.key] = record
        self._replay_keys.update((child.replay_key, group.key) for child in group.children)
        return record

    def _fence_reopen(self, record: _Group, group: EffectGroup) -> None:
        """Reopen is fenced on shape (G-13) and on each child's hash (G-02)."""
        recorded = [kit.RecordedChild(c.position, c.replay_key, c.hash) for c in record.children]
        kit.check_reopen(kit.Offer.of(group), record.shape(), recorded)

    # -- children -----------------------------------------------------------------------

    def _resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        """The registered resolver is the only seam for tool calls (G-09); the host runs
        ``sleep`` and ``await_event`` itself (G-51)."""
        if is_host_kind(envelope):
            return _HostKindExecutor(self)
        if self._resolver is None:
            return None
        return self._resolver.resolve(envelope)

    def _dispatch(self, record: _Group, child: _Child, executor: EffectExecutor) -> None:
        child.fence += 1
        child.state = "running"
        if child.envelope.kind == EffectKind.SLEEP and child.due_at is None:
            loop = asyncio.get_running_loop()
            child.due_at = loop.time() + sleep_seconds(child.envelope)
        # named by the replay key itself: a name of its own would be another string per child
        self._tasks[child] = asyncio.get_running_loop().create_task(
            self._run_child(record, child, executor, child.fence), name=child.replay_key
        )

    async def _run_child(
        self, record: _Group, child: _Child, executor: EffectExecutor, fence: int
    ) -> None:
        """A child's task; it leaves ``_tasks`` as it ends (no done-callback per child: a
        finished task is freed at once). One cancelled before it started never runs this:
        :meth:`_request_cancel` and :meth:`aclose` forget those."""
        try:
            try:
                outcome = await executor.execute(ExecutionInput(child.envelope, fence))
            except asyncio.CancelledError:
                if not child.cancel_requested:
                    raise  # the host is going away: like a dead process, record nothing
                outcome = Outcome.cancelled()
            except EffectHostError as exc:
                outcome = Outcome.failure(type(exc).__name__, str(exc))
            outcome = self._bounded(record, child, outcome)
            if self._payloads is not None:
                await self._encode(self._payloads, record, child, fence, outcome)
            await self._deliver(record, child, fence, outcome)
        finally:
            if child.fence == fence:  # else a later dispatch owns the entry
                self._tasks.pop(child, None)

    def _forget(self, child: _Child, task: object) -> None:
        if self._tasks.get(child) is task:
            del self._tasks[child]

    def _cancel_ended(
        self, record: _Group, child: _Child, fence: int, task: asyncio.Task[None]
    ) -> None:
        """A task a close cancelled has ended. One cancelled before its first step never
        ran :meth:`_run_child`: its cancelled terminal is recorded here, so it still
        takes a rank and the group can retire (G-27)."""
        self._forget(child, task)
        if task.cancelled() and child.state != "settled" and child.fence == fence:
            self._finalize(record, child, fence, Outcome.cancelled())

    async def _encode(
        self, policy: PayloadPolicy, record: _Group, child: _Child, fence: int, outcome: Outcome
    ) -> None:
        """Encode before delivering: the rank authority records only the stored form. A
        close's cancel arriving meanwhile does not lose an outcome already computed; a
        store failure leaves the child unsettled (a drain pass runs it again)."""
        pending = asyncio.ensure_future(
            encode_outcome(policy, record.key, child.replay_key, outcome, position=child.position)
        )
        while True:
            try:
                stored = await asyncio.shield(pending)
                break
            except asyncio.CancelledError:
                if not child.cancel_requested:
                    pending.cancel()
                    raise
        self._encoded[(record.key, child.replay_key, fence)] = stored

    def _bounded(self, record: _Group, child: _Child, outcome: Outcome) -> Outcome:
        """An outcome over the size limit is recorded as a ``PayloadTooLarge`` failure."""
        if outcome._size_within(self._max_payload_bytes):
            return outcome
        size = outcome.canonical_size()
        return Outcome.failure(
            "PayloadTooLarge",
            f"outcome of {child.replay_key!r} in group {record.key!r} encodes to {size} bytes, "
            f"over the limit of {self._max_payload_bytes}",
        )

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        """*hook*: how a child's outcome reaches the rank authority."""
        self._finalize(record, child, fence, outcome)

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        """The rank authority: fence first, bump only on a match (G-31's order, G-17)."""
        encoded = (
            self._encoded.pop((record.key, child.replay_key, fence), None)
            if self._encoded
            else None
        )
        if child.state == "settled" or child.fence != fence:
            return False
        record.counter = self._next_sequence(record)
        child.seq = record.counter
        if self._payloads is None:
            child.outcome = outcome
        else:
            child.stored = encoded or encode_outcome_inline(
                self._payloads, record.key, child.replay_key, outcome, position=child.position
            )
        child.state = "settled"
        record.settled.append(child)  # sequences only grow (G-17): the newest is the last
        self._notify(record)
        self._maybe_retire(record)
        return True

    def _next_sequence(self, record: _Group) -> int:
        """*hook*: the next settlement sequence; strictly increasing (G-17)."""
        return record.counter + 1

    def _settled_at_rank(self, record: _Group, rank: int) -> _Child | None:
        """*hook*: the child holding the ``rank``-th smallest sequence (G-16)."""
        return record.settled[rank - 1] if len(record.settled) >= rank else None

    def _notify(self, record: _Group) -> None:
        changed = record.changed
        if changed._waiters:  # else nobody to wake: the unset event serves the next waiter
            record.changed = asyncio.Event()
            changed.set()

    def _maybe_retire(self, record: _Group) -> None:
        """A group retires whole, once closed and no child can still rank (G-17, G-36)."""
        if record.closed and len(record.settled) == record.child_count:
            self._groups.pop(record.key, None)
            self._retired[record.key] = record.effective
            for child in record.children:
                self._replay_keys.pop(child.replay_key, None)
            store = self._payloads.store if self._payloads is not None else None
            if store is not None:
                task = asyncio.get_running_loop().create_task(store.delete_group(record.key))
                self._deletions.add(task)
                task.add_done_callback(self._deletions.discard)

    # -- consume ------------------------------------------------------------------------

    def _lookup(self, handle: GroupHandle) -> _Group:
        """*hook*: the record a handle names, after the handle's fence (G-20); a closed
        record is returned (the callers order ``GroupClosed`` themselves, R-2)."""
        key = handle.group_key
        record = self._groups.get(key)
        if record is None:
            raise kit.group_closed(key) if key in self._retired else kit.unknown_group(key)
        kit.check_handle(key, handle, record)  # type: ignore[arg-type]  # reads the same fields
        return record

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        """As :meth:`EffectController.await_next_settlement`; with a payload policy the
        recorded outcome is decoded before the handle advances.

        Raises:
            EffectGroupUnsupported, CursorExhausted, HandleMismatch, UnknownGroup,
                GroupClosed: as the contract says.
            SealedPayloadUnreadable: the rank's outcome is sealed and cannot be opened
                with this controller's payload policy (no key store, no such key, unknown
                cipher, wrong slot, tampered); the handle does not advance and nothing
                recorded changes (G-49).
            MalformedHandle: ``handle`` is not a valid handle; checked first (R-2).
            PayloadShredded: the key of the outcome's scope was destroyed (G-50); the
                handle does not advance.
            PayloadMissing: the outcome is stored by reference and the payload is gone
                (G-47); the handle does not advance.
        """
        require_handle(handle)
        self._require_wired(handle.group_key)
        recorded = self._groups.get(handle.group_key)
        if recorded is not None and recorded.closed:  # GroupClosed before HandleMismatch
            raise kit.group_closed(recorded.key)
        record = self._lookup(handle)
        rank = kit.check_cursor(record.key, handle.consumed, record.child_count)
        if record.held and self._settled_at_rank(record, rank) is None:
            record.held = False
            self._restart(record)  # the losers of a decided group run on demand
        while (child := self._settled_at_rank(record, rank)) is None:
            changed = record.changed
            record.parked[rank] += 1
            try:
                await changed.wait()
            finally:
                record.parked[rank] -= 1
            if record.closed:
                raise kit.group_closed(record.key)
        if child.stored is not None:
            # A refusal raises here: nothing recorded changes and the handle stays (G-49).
            outcome = await decode_outcome(
                self._payloads,
                record.key,
                child.replay_key,
                child.stored,
                position=child.position,
                rank=rank,
            )
        else:
            assert child.outcome is not None
            outcome = child.outcome
        settlement = Settlement.recorded(rank, child.position, child.replay_key, outcome)
        handle.consumed = rank
        return settlement

    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(limits.check_key(group_key, what="the group key of settlement_order"))
        record = self._groups.get(group_key)
        if record is None:
            raise kit.unknown_group(group_key)
        return [child.position for child in record.settled]

    async def open_group_keys(self) -> list[str]:
        return sorted(key for key, record in self._groups.items() if not record.closed)

    # -- close --------------------------------------------------------------------------

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        disposition = coerce_disposition(require_handle(handle).group_key, disposition)
        self._require_wired(handle.group_key)
        if handle.group_key in self._retired:
            return  # a close of a closed or retired group is a no-op
        record = self._lookup(handle)
        if record.closed:
            return
        target = self._check_narrowing(record.key, record.effective, disposition)
        record.effective = target
        record.closed = True
        if target is LoserPolicy.CANCEL:
            for child in record.children:
                if child.state != "settled":
                    self._request_cancel(record, child)
        self._notify(record)
        self._maybe_retire(record)

    def _check_narrowing(
        self, group_key: str, current: LoserPolicy, requested: LoserPolicy | None
    ) -> LoserPolicy:
        """*hook*: a close may narrow ``RUN_TO_COMPLETION`` to ``CANCEL``, never widen."""
        return kit.narrow(group_key, current, requested)

    def _request_cancel(self, record: _Group, child: _Child) -> None:
        """One cancel per unsettled child; does not wait for it to stop (G-27)."""
        child.cancel_requested = True
        task = self._tasks.get(child)
        if task is not None:
            task.cancel()
            fence = child.fence
            task.add_done_callback(lambda done: self._cancel_ended(record, child, fence, done))
        else:
            self._finalize(record, child, child.fence, Outcome.cancelled())

    # -- events -------------------------------------------------------------------------

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self._require_wired(group_key)
        value = event_value(group_key, name, payload)
        size = len(canonical_json(value))
        if size > self._max_payload_bytes:
            raise PayloadTooLarge(
                f"event {name!r} for group {group_key!r} encodes to {size} bytes, over the "
                f"limit of {self._max_payload_bytes}",
                group_key=group_key,
            )
        record = self._groups.get(group_key)
        if record is None:
            if group_key in self._retired:
                return 0
            raise kit.unknown_group(group_key)
        reached = 0
        for child in record.children:
            if (
                child.envelope.kind == EffectKind.AWAIT_EVENT
                and child.envelope.name == name
                and child.state != "settled"
                and child.event is None
            ):
                child.event = (value,)
                child.event_arrived.set()
                reached += 1
        return reached

    def _child(self, envelope: EffectEnvelope) -> _Child:
        assert envelope.membership is not None
        record = self._groups[envelope.membership.group_key]
        return record.children[envelope.membership.position]

    # -- drain --------------------------------------------------------------------------

    def drain(self) -> GroupDrain:
        return _MemoryDrain(self)

    async def aclose(self) -> None:
        """Stop every child task without recording anything (like the process ending)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for child, task in list(self._tasks.items()):
            if task.done():  # cancelled before it started: it never left on its own
                self._forget(child, task)
        await asyncio.gather(*list(self._deletions), return_exceptions=True)


class _HostKindExecutor(EffectExecutor):
    """Runs the child kinds the host supplies itself (G-51): ``sleep`` until the due time
    recorded at first dispatch, ``await_event`` until ``deliver_event`` reaches it."""

    def __init__(self, host: MemoryEffectHost) -> None:
        super().__init__()
        self._host = host

    async def run(self, call: ExecutionInput) -> Any:
        child = self._host._child(call.envelope)
        if call.envelope.kind == EffectKind.SLEEP:
            due = child.due_at if child.due_at is not None else 0.0
            await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
            return None
        await child.event_arrived.wait()
        assert child.event is not None
        return child.event[0]


class _MemoryDrain(GroupDrain):
    """Finishes unfinished children that no live task owns, by the recorded disposition."""

    def __init__(self, host: MemoryEffectHost) -> None:
        self._host = host

    async def run_pass(self) -> DrainReport:
        host = self._host
        resumed: list[tuple[str, str]] = []
        cancelled: list[tuple[str, str]] = []
        missing: list[NoExecutor] = []
        for record in list(host._groups.values()):
            if record.held and host._resolver is not None:
                continue  # its live caller decides when its losers run
            for child in record.children:
                if child.state == "settled" or child in host._tasks:
                    continue
                ids = (record.key, child.replay_key)
                if host._resolver is None:
                    missing.append(_no_executor(record, child, kit.NO_RESOLVER))
                elif record.effective is LoserPolicy.CANCEL:
                    child.cancel_requested = True
                    host._finalize(record, child, child.fence, Outcome.cancelled())
                    cancelled.append(ids)
                elif (executor := host._resolve(child.envelope)) is None:
                    missing.append(_no_executor(record, child, kit.RESOLVER_MISS))
                else:
                    host._dispatch(record, child, executor)
                    resumed.append(ids)
        return DrainReport(
            resumed=tuple(resumed), cancelled=tuple(cancelled), no_executor=tuple(missing)
        )


def _position(envelope: EffectEnvelope) -> int:
    """A grouped child's position: the membership's own number (the group stamped every
    child), not another int object per child."""
    membership = envelope.membership
    assert membership is not None
    return membership.position


def _status(child: _Child) -> str:
    """A settled child's status as R-13 reads it (hidden when sealed)."""
    if child.outcome is not None:
        return child.outcome.status
    stored = child.stored
    return stored.outcome.status if stored is not None and stored.outcome is not None else ""


def _no_executor(record: _Group, child: _Child, why: str) -> NoExecutor:
    return kit.no_executor(record.key, child.replay_key, child.position, why)
