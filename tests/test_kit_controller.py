"""``KitController``: the kit's rules over a host that implements only the engine hooks.

The host here is a few dicts and asyncio tasks (tool calls only): what a newcomer writes
for an engine, so every rule these tests see comes from the base.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest
from group_support import group as effect_group

from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectGroupUnsupported,
    ExecutionInput,
    GroupClosed,
    GroupHandle,
    GroupShapeError,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    MalformedHandle,
    Outcome,
    ReplayMismatch,
    Settlement,
    ToolRegistry,
    UnknownGroup,
    WakePolicy,
)
from effecthost.contract.kit import (
    FirstOpen,
    GroupRecord,
    KitController,
    Known,
    RankLedger,
    RecordedChild,
    Tombstone,
)

pytestmark = pytest.mark.anyio
RTC, CANCEL = LoserPolicy.RUN_TO_COMPLETION, LoserPolicy.CANCEL


class DictHost(KitController):
    """Engine glue only: record, run, settle through the rank ledger, wake, cancel."""

    def __init__(self, tools: ToolRegistry | None) -> None:
        self.register_executors(tools)
        self.records: dict[str, GroupRecord] = {}
        self.tombstones: set[str] = set()
        self.children: dict[str, list[RecordedChild]] = {}
        self.holders: dict[str, str] = {}
        self.ledgers: dict[str, RankLedger] = {}
        self.ranks: dict[str, list[Settlement]] = {}
        self.changed: dict[str, asyncio.Event] = {}
        self.tasks: dict[tuple[str, int], asyncio.Task[None]] = {}

    async def find_group(self, key: str) -> Known:
        if key in self.tombstones:
            return Tombstone(key)
        return self.records.get(key)

    async def recorded_children(self, key: str) -> Sequence[RecordedChild]:
        return self.children[key]

    async def replay_key_holder(self, replay_key: str) -> str | None:
        return self.holders.get(replay_key)

    async def record_group(self, opened: FirstOpen) -> bool:
        group = opened.group
        if group.key in self.records or group.key in self.tombstones:
            return False
        self.records[group.key] = GroupRecord(
            group.key, group.child_count, group.wake, group.disposition
        )
        self.children[group.key] = [
            RecordedChild(p, c.replay_key, c.envelope_hash()) for p, c in enumerate(group.children)
        ]
        self.holders.update((c.replay_key, group.key) for c in group.children)
        self.ledgers[group.key] = RankLedger(group.child_count)
        self.ranks[group.key] = []
        self.changed[group.key] = asyncio.Event()
        for position, (child, executor) in enumerate(
            zip(group.children, opened.executors, strict=True)
        ):
            assert executor is not None
            self.tasks[(group.key, position)] = asyncio.create_task(
                self._run(group.key, position, child, executor)
            )
        return True

    async def _run(
        self, key: str, position: int, child: EffectEnvelope, executor: EffectExecutor
    ) -> None:
        try:
            outcome = await executor.execute(ExecutionInput(child))
        except asyncio.CancelledError:
            outcome = Outcome.cancelled()
        rank = self.ledgers[key].settle(position)
        if rank is not None:
            self.ranks[key].append(
                Settlement(
                    rank=rank, position=position, replay_key=child.replay_key, outcome=outcome
                )
            )
            self._wake(key)
            self._retire_if_done(key)

    def _wake(self, key: str) -> None:
        event, self.changed[key] = self.changed[key], asyncio.Event()
        event.set()

    def _retire_if_done(self, key: str) -> None:
        record = self.records.get(key)
        if record is not None and record.closed and self.ledgers[key].complete:
            del self.records[key]
            self.tombstones.add(key)
            for child in self.children.pop(key):
                self.holders.pop(child.replay_key, None)

    async def read_rank(self, key: str, rank: int) -> Settlement | None:
        ranks = self.ranks.get(key, [])
        return ranks[rank - 1] if rank <= len(ranks) else None

    async def wait_for_change(self, key: str, rank: int) -> None:
        if key in self.changed:
            await self.changed[key].wait()

    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        record = self.records[key]
        self.records[key] = GroupRecord(
            key, record.child_count, record.wake, record.declared, disposition, closed=True
        )
        self._wake(key)
        self._retire_if_done(key)

    async def cancel_unsettled(self, key: str) -> None:
        for (group_key, _position), task in self.tasks.items():
            if group_key == key and not task.done():
                task.cancel()

    async def settled_positions(self, key: str) -> Sequence[int]:
        return self.ledgers[key].order


def gated_tools(*names: str) -> tuple[ToolRegistry, dict[str, asyncio.Event]]:
    gates = {name: asyncio.Event() for name in names}
    tools = ToolRegistry()
    for name in names:

        async def tool(_input: object, gate: asyncio.Event = gates[name], name: str = name) -> str:
            await gate.wait()
            return name

        tools.add(name, tool)
    return tools, gates


def group(key: str, *names: str, disposition: LoserPolicy = RTC) -> EffectGroup:
    return effect_group(
        key,
        [
            EffectEnvelope(replay_key=f"{key}/{n}", kind="tool_call", name=n, input={})
            for n in names
        ],
        WakePolicy.FIRST,
        disposition,
    )


async def test_ranks_follow_settlement_order_and_the_handle_is_the_cursor() -> None:
    """G-18, G-21: rank 1 is the first settlement; the waiter wakes on it."""
    tools, gates = gated_tools("a", "b")
    host = DictHost(tools)
    handle = await host.open_effect_group(group("g", "a", "b"))
    waiter = asyncio.create_task(host.await_next_settlement(handle))
    gates["b"].set()
    first = await asyncio.wait_for(waiter, 5)
    assert (first.rank, first.position, handle.consumed) == (1, 1, 1)
    gates["a"].set()
    second = await asyncio.wait_for(host.await_next_settlement(handle), 5)
    assert (second.rank, second.position) == (2, 0)
    with pytest.raises(CursorExhausted):
        await host.await_next_settlement(handle)
    assert await host.settlement_order("g") == [1, 0]


async def test_await_refusals_in_r2_order() -> None:
    """R-2: MalformedHandle → EffectGroupUnsupported → UnknownGroup → GroupClosed →
    HandleMismatch → CursorExhausted."""
    unwired = DictHost(None)
    with pytest.raises(MalformedHandle):
        await unwired.await_next_settlement("nope")  # type: ignore[arg-type]
    stray = GroupHandle(
        group_key="x", child_count=2, consumed=0, wake=WakePolicy.ALL, disposition=RTC
    )
    with pytest.raises(EffectGroupUnsupported):
        await unwired.await_next_settlement(stray)
    tools, gates = gated_tools("a", "b")
    host = DictHost(tools)
    with pytest.raises(UnknownGroup):
        await host.await_next_settlement(stray)
    handle = await host.open_effect_group(group("x", "a", "b"))
    with pytest.raises(HandleMismatch):
        await host.await_next_settlement(stray)
    await host.close_effect_group(handle)
    with pytest.raises(GroupClosed):
        await host.await_next_settlement(stray)
    for gate in gates.values():
        gate.set()


async def test_first_open_refusals_record_nothing_and_reopen_is_fenced() -> None:
    """G-10, G-11, G-13, R-6, R-2: ReplayMismatch before GroupShapeError; a refused
    first open records nothing; a reopen is fenced on shape and refuses no miss."""
    tools, gates = gated_tools("a", "b")
    host = DictHost(tools)
    await host.open_effect_group(group("held", "a"))
    with pytest.raises(GroupShapeError) as refused:
        await host.open_effect_group(group("g", "a", "missing"))
    assert (refused.value.position, await host.find_group("g")) == (1, None)
    taken = effect_group(
        "g2",
        [
            EffectEnvelope(replay_key="x", kind="tool_call", name="missing", input={}),
            EffectEnvelope(replay_key="held/a", kind="tool_call", name="a", input={}),
        ],
        WakePolicy.FIRST,
        RTC,
    )
    with pytest.raises(ReplayMismatch) as mismatch:
        await host.open_effect_group(taken)
    assert mismatch.value.position == 1 and "held" in str(mismatch.value)
    handle = await host.open_effect_group(group("g", "a", "b"))
    with pytest.raises(GroupShapeMismatch):
        await host.open_effect_group(group("g", "a", "b", disposition=CANCEL))
    host.register_executors(ToolRegistry())  # a deployment that runs nothing
    assert await host.open_effect_group(group("g", "a", "b")) == handle  # G-11
    for gate in gates.values():
        gate.set()


async def test_close_narrows_cancels_wakes_and_is_a_no_op_after() -> None:
    """G-26, G-27, R-3, R-4: CANCEL losers still rank; a parked waiter wakes with
    GroupClosed; later closes are no-ops; the retired key stays closed."""
    tools, gates = gated_tools("a", "b")
    host = DictHost(tools)
    handle = await host.open_effect_group(group("c", "a", "b"))
    parked = asyncio.create_task(host.await_next_settlement(handle.copy_cursor()))
    await asyncio.sleep(0)
    await host.close_effect_group(handle, "cancel")
    with pytest.raises(GroupClosed):
        await asyncio.wait_for(parked, 5)
    for _ in range(50):  # the cancelled losers settle as the loop runs their tasks
        if isinstance(await host.find_group("c"), Tombstone):
            break
        await asyncio.sleep(0)
    assert isinstance(await host.find_group("c"), Tombstone)
    assert [s.outcome.status for s in host.ranks["c"]] == ["cancelled", "cancelled"]
    await host.close_effect_group(handle, RTC)  # retired: a no-op, not a widening
    with pytest.raises(GroupClosed):
        await host.open_effect_group(group("c", "a", "b"))
    declared = await host.open_effect_group(group("d", "a", "b", disposition=CANCEL))
    with pytest.raises(DispositionWidened):
        await host.close_effect_group(declared, RTC)
    with pytest.raises(HandleMismatch):
        await host.close_effect_group(handle.model_copy(update={"group_key": "d"}))
    await host.close_effect_group(declared)  # None keeps CANCEL in force
    for gate in gates.values():
        gate.set()


async def test_a_lost_race_to_record_is_a_fenced_reopen() -> None:
    """R-7: when another opener records the key first, this open is a reopen."""
    tools, gates = gated_tools("a")

    class Racing(DictHost):
        async def record_group(self, opened: FirstOpen) -> bool:
            await DictHost.record_group(self, opened)  # the other opener wins
            return False

    host = Racing(tools)
    handle = await host.open_effect_group(group("r", "a"))
    assert handle.child_count == 1 and isinstance(await host.find_group("r"), GroupRecord)
    gates["a"].set()


class GuardedHost(DictHost):
    """A host with concurrent writers: each hook yields to the loop (as an engine's I/O
    would), and the guard is one lock per key."""

    def __init__(self, tools: ToolRegistry | None) -> None:
        super().__init__(tools)
        self.locks: dict[str, asyncio.Lock] = {}
        self.recorded: list[str] = []
        self.closes: list[LoserPolicy] = []

    def guard(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def held(self, key: str) -> bool:
        return key in self.locks and self.locks[key].locked()

    async def find_group(self, key: str) -> Known:
        await asyncio.sleep(0)
        return await DictHost.find_group(self, key)

    async def record_group(self, opened: FirstOpen) -> bool:
        assert self.held(opened.group.key)
        await asyncio.sleep(0)
        self.recorded.append(opened.group.key)
        return await DictHost.record_group(self, opened)

    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        assert self.held(key)
        await asyncio.sleep(0)
        self.closes.append(disposition)
        await DictHost.record_close(self, key, disposition)

    async def cancel_unsettled(self, key: str) -> None:
        assert not self.held(key)  # a cancel that settles under the guard must not deadlock
        await DictHost.cancel_unsettled(self, key)


async def test_the_guard_makes_check_then_act_one_step() -> None:
    """R-7, R-3: the base reads and writes an open or a close inside the host's guard,
    so concurrent first opens record once and a close's check sees the last close;
    the cancels are issued after the guard is left."""
    tools, gates = gated_tools("a", "b")
    host = GuardedHost(tools)
    handles = await asyncio.gather(
        *(host.open_effect_group(group("k", "a", "b")) for _ in range(3))
    )
    assert host.recorded == ["k"] and handles[0] == handles[1] == handles[2]
    await asyncio.gather(
        host.close_effect_group(handles[0], CANCEL), host.close_effect_group(handles[1], CANCEL)
    )
    assert host.closes == [CANCEL]  # the second close found the group closed: a no-op
    for gate in gates.values():
        gate.set()


class ResumingHost(DictHost):
    """Records what the base asks of the two R-13 hooks; ``on_restart`` stands for the
    children a real host would dispatch."""

    def __init__(self, tools: ToolRegistry | None) -> None:
        super().__init__(tools)
        self.resumes: list[tuple[str, bool]] = []
        self.restarts: list[str] = []
        self.on_restart: Callable[[], None] = lambda: None

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        self.resumes.append((group.key, restart))

    async def restart_unsettled(self, key: str) -> None:
        self.restarts.append(key)
        self.on_restart()


async def test_a_decided_group_is_resumed_without_restarts_and_its_losers_run_on_demand() -> None:
    """R-13: the reopen of a decided ``CANCEL`` race asks ``resume_group(restart=False)``;
    an await of rank 2, which does not exist yet, asks ``restart_unsettled`` once (the
    loser here runs only then); an undecided reopen, a ``RUN_TO_COMPLETION`` one and an
    ``ALL`` one restart as before."""
    tools, gates = gated_tools("a", "b")
    host = ResumingHost(tools)
    race = group("race", "a", "b", disposition=CANCEL)
    handle = await host.open_effect_group(race)
    await host.open_effect_group(race)  # undecided: nothing ranked yet
    gates["a"].set()
    assert (await asyncio.wait_for(host.await_next_settlement(handle), 5)).position == 0
    await host.open_effect_group(race)
    assert host.resumes == [("race", True), ("race", False)]
    host.on_restart = gates["b"].set
    assert (await asyncio.wait_for(host.await_next_settlement(handle), 5)).position == 1
    assert host.restarts == ["race"]

    tools, gates = gated_tools("c", "d")
    others = ResumingHost(tools)
    others.on_restart = gates["d"].set
    gates["c"].set()
    every = effect_group(
        "every",
        [
            EffectEnvelope(replay_key=f"every/{n}", kind="tool_call", name=n, input={})
            for n in ("c", "d")
        ],
        WakePolicy.ALL,
        CANCEL,
    )
    for shape in (group("rtc", "c", "d"), every):
        opened = await others.open_effect_group(shape)
        await asyncio.wait_for(others.await_next_settlement(opened), 5)
        await others.open_effect_group(shape)
    assert others.resumes == [("rtc", True), ("every", True)]
    waiter = asyncio.create_task(others.await_next_settlement(opened))
    gates["d"].set()
    await asyncio.wait_for(waiter, 5)
    assert others.restarts == []
