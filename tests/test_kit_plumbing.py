"""The kit's shared plumbing and decisions: the retry contract of an optimistic guard, the
batch replay-key lookup, the drain's decisions, the retire rule, ``TaskChildren``'s failed
settlement writes, and a reopen next to a live owner (on the example file host: two
incarnations over one directory, both alive)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_kit_controller import DictHost, gated_tools, group

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EngineUnavailable,
    LoserPolicy,
    ReplayMismatch,
    ToolRegistry,
    WakePolicy,
)
from effecthost.contract.kit import (
    DrainChild,
    DrainStep,
    DrainTally,
    FirstOpen,
    Retry,
    drain_child,
    drain_children,
    drain_group,
    retires,
)

pytestmark = pytest.mark.anyio
RTC, CANCEL = LoserPolicy.RUN_TO_COMPLETION, LoserPolicy.CANCEL
ROOT = Path(__file__).resolve().parent.parent


class OptimisticHost(DictHost):
    """A guard that loses its first ``conflicts`` commits, as a Redis ``EXEC`` after a
    ``WATCH``ed key changed: its writes are thrown away and the step must run again."""

    def __init__(self, tools: ToolRegistry | None, conflicts: int) -> None:
        super().__init__(tools)
        self.conflicts = conflicts
        self.steps = 0
        self.started: list[str] = []

    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        self.steps += 1
        snapshot = (dict(self.records), dict(self.holders))
        yield
        if self.conflicts:
            self.conflicts -= 1
            self.records, self.holders = dict(snapshot[0]), dict(snapshot[1])
            raise Retry

    async def record_group(self, opened: FirstOpen) -> bool:
        self.after_guard(lambda: self.started.append(opened.group.key))
        return await super().record_group(opened)


async def test_an_optimistic_guard_reruns_the_step_and_starts_only_once() -> None:
    """R-7 (the retry contract): a guard raising ``Retry`` on exit makes the kit run the
    open again from its first read; what the lost step deferred with ``after_guard`` is
    dropped, so the children are started once, by the step that held."""
    tools, gates = gated_tools("a", "b")
    host = OptimisticHost(tools, conflicts=2)
    handle = await host.open_effect_group(group("g", "a", "b"))
    assert host.steps == 3 and host.started == ["g"]
    gates["a"].set()
    assert (await host.await_next_settlement(handle)).position == 0
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*host.tasks.values())


async def test_a_guard_that_never_holds_becomes_engine_unavailable() -> None:
    """R-12: a run of conflicts longer than ``guard_attempts`` is ``EngineUnavailable``
    naming the group, the operation and how long it tried, never a hang."""
    tools, _gates = gated_tools("a")
    host = OptimisticHost(tools, conflicts=10**6)
    host.guard_attempts = 5
    with pytest.raises(EngineUnavailable) as raised:
        await host.open_effect_group(group("g", "a"))
    assert raised.value.group_key == "g" and raised.value.operation == "open"
    assert 0 < raised.value.tried_for < 60
    assert host.steps == 5 and host.started == []


async def test_a_hosts_own_step_runs_through_the_same_guard_and_retry() -> None:
    """R-12 (the retry contract, for a host's own steps): ``guarded`` runs a step inside
    the guard, again on ``Retry`` with what it deferred dropped, runs the deferred actions
    of the step that held once, and names the host's operation when conflicts never end."""
    host = OptimisticHost(None, conflicts=2)
    ran: list[int] = []

    async def step() -> int:
        host.after_guard(lambda: ran.append(host.steps))
        return host.steps

    assert await host.guarded("g", "settle", step) == 3
    assert ran == [3]
    host.conflicts, host.guard_attempts = 10**6, 4
    with pytest.raises(EngineUnavailable) as raised:
        await host.guarded("g", "settle", step)
    assert raised.value.operation == "settle" and ran == [3]


class BatchHost(DictHost):
    def __init__(self, tools: ToolRegistry | None) -> None:
        super().__init__(tools)
        self.asked: list[list[str]] = []

    async def replay_key_holder(self, replay_key: str) -> str | None:
        raise AssertionError("the batch hook answers for every child")

    async def replay_key_holders(self, replay_keys: Sequence[str]) -> Mapping[str, str]:
        self.asked.append(list(replay_keys))
        return {k: self.holders[k] for k in replay_keys if k in self.holders}


async def test_replay_key_holders_is_asked_once_per_open() -> None:
    """R-6: a first open asks the batch hook once with every child's replay key, and a
    key another group holds is refused naming its position."""
    tools, gates = gated_tools("a", "b", "c")
    host = BatchHost(tools)
    await host.open_effect_group(group("g", "a", "b"))
    assert host.asked == [["g/a", "g/b"]]
    host.holders["h/c"] = "g"
    with pytest.raises(ReplayMismatch) as raised:
        await host.open_effect_group(group("h", "b", "c"))
    assert raised.value.position == 1 and len(host.asked) == 2
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*host.tasks.values())


def test_the_drain_decisions() -> None:
    """R-1, G-12, G-29, R-13: a live owner's group is never touched, a decided group of
    this incarnation keeps its losers down; per child: no resolver is reported, a dead
    owner's CANCEL cancels, an event wait waits, the rest starts."""
    assert not drain_group(mine=False, owner_alive=True, decided=False)
    assert not drain_group(mine=True, owner_alive=False, decided=True)
    assert drain_group(mine=False, owner_alive=False, decided=True)

    def step(**changed: Any) -> DrainStep:
        base = dict(mine=False, in_force=RTC, kind="tool_call", settled=False, running=False)
        return drain_child(**(base | {"wired": True} | changed))

    assert step(settled=True) is DrainStep.LEAVE
    assert step(running=True) is DrainStep.LEAVE
    assert step(wired=False, in_force=CANCEL) is DrainStep.NO_RESOLVER
    assert step(in_force="cancel") is DrainStep.CANCEL
    assert step(in_force=CANCEL, mine=True) is DrainStep.START
    assert step(kind="await_event") is DrainStep.LEAVE
    assert step() is DrainStep.START

    tally, cancelled = DrainTally(), []
    children = [
        DrainChild("k/0", "tool_call", True, False),
        ("k/1", "tool_call", False, False),
        ("k/2", "tool_call", False, False),
    ]
    touched = drain_children(
        "k",
        children,
        mine=True,
        in_force=RTC,
        wired=True,
        start=lambda p: p == 1,
        cancel=cancelled.append,
        tally=tally,
    )
    report = tally.report()
    assert touched and report.resumed == (("k", "k/1"),) and not cancelled
    assert [(m.replay_key, m.position) for m in report.no_executor] == [("k/2", 2)]


def test_the_retire_rule() -> None:
    """G-36, R-11: closed and every child ranked, nothing less."""
    assert retires(True, 3, 3)
    assert not retires(True, 3, 2)
    assert not retires(False, 3, 3)


@pytest.fixture
def file_host(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example's host class; each incarnation built from it lets its owner lock go
    at the end (a process exit would)."""
    monkeypatch.syspath_prepend(str(ROOT))
    from examples.file_host.host import FileHost

    built: list[Any] = []

    class Closing(FileHost):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            built.append(self)

    yield Closing
    for host in built:
        host._owner_lock.close()


def _failing_writes(file_host: Any, error: str, failing: Callable[[], bool]) -> Any:
    """``file_host`` whose settlement writes raise ``ConnectionError(error)`` while
    ``failing()`` says so."""

    class Failing(file_host):  # type: ignore[misc, valid-type]
        async def settle_child(self, *args: Any) -> bool:
            if failing():
                raise ConnectionError(error)
            return bool(await super().settle_child(*args))

    return Failing


async def test_a_failed_settlement_write_is_retried(file_host: Any, tmp_path: Path) -> None:
    """G-15 (a failed write): a settlement whose write fails is retried until it lands,
    so the awaiting caller is served, never left waiting on a lost write."""
    failures = iter([True] * 3)
    flaky = _failing_writes(file_host, "pool exhausted", lambda: next(failures, False))
    tools, gates = gated_tools("a")
    host = flaky(tmp_path, tools)
    host.settle_attempts = 5
    handle = await host.open_effect_group(group("g", "a"))
    gates["a"].set()
    settled = await asyncio.wait_for(host.await_next_settlement(handle), 30)
    assert settled.outcome.status == "success" and next(failures, None) is None


async def test_a_write_that_never_lands_leaves_the_child_to_the_drain(
    file_host: Any, tmp_path: Path
) -> None:
    """G-28: a settlement that cannot be written after every retry leaves the child
    unsettled and not running, so the owner's next drain pass starts it again."""
    broken = True
    down = _failing_writes(file_host, "engine down", lambda: broken)
    tools, gates = gated_tools("a")
    host = down(tmp_path, tools)
    host.settle_attempts = 2
    handle = await host.open_effect_group(group("g", "a"))
    gates["a"].set()
    await asyncio.wait_for(host.idle(), 30)
    assert not host.is_running("g", 0)
    broken = False
    report = await host.drain().run_pass()
    assert report.resumed == (("g", "g/a"),)
    assert (await asyncio.wait_for(host.await_next_settlement(handle), 30)).position == 0


async def test_a_delivery_whose_writes_all_fail_is_engine_unavailable(
    file_host: Any, tmp_path: Path
) -> None:
    """R-12: an event delivery whose settlement write fails on every attempt raises
    ``EngineUnavailable`` naming the group and ``deliver_event``, not the driver's error;
    nothing is recorded, and delivering again once the engine is back settles the wait."""
    broken = True
    host = _failing_writes(file_host, "engine down", lambda: broken)(tmp_path, ToolRegistry())
    host.settle_attempts = 2
    opened = EffectGroup(
        key="g",
        wake=WakePolicy.ALL,
        disposition=RTC,
        children=[EffectEnvelope(replay_key="g/w", kind="await_event", name="go", input=None)],
    )
    handle = await host.open_effect_group(opened)
    with pytest.raises(EngineUnavailable) as raised:
        await host.deliver_event("g", "go", 1)
    assert (raised.value.group_key, raised.value.operation) == ("g", "deliver_event")
    assert await host.settlement_order("g") == []
    broken = False
    assert await host.deliver_event("g", "go", 1) == 1
    assert (await asyncio.wait_for(host.await_next_settlement(handle), 30)).outcome.value == 1


async def test_a_reopen_does_not_restart_a_live_owners_children(
    file_host: Any, tmp_path: Path
) -> None:
    """R-1: a second live incarnation reopening a group takes it over but does not start
    the children the first one still runs, nor does its drain; each runs once."""
    runs: list[str] = []
    gate, started = asyncio.Event(), asyncio.Event()

    async def slow(_input: object) -> str:
        runs.append("a")
        started.set()
        await gate.wait()
        return "a"

    first = file_host(tmp_path, ToolRegistry({"a": slow}))
    second = file_host(tmp_path, ToolRegistry({"a": slow}))
    handle = await first.open_effect_group(group("g", "a"))
    await asyncio.wait_for(started.wait(), 30)
    again = await second.open_effect_group(group("g", "a"))
    assert (await second.drain().run_pass()).empty
    gate.set()
    assert (await asyncio.wait_for(second.await_next_settlement(again), 30)).position == 0
    assert (await first.await_next_settlement(handle)).outcome.value == "a"
    assert runs == ["a"]
    await first.idle()


async def test_a_cancel_close_right_after_open_settles_children_that_never_ran(
    file_host: Any, tmp_path: Path
) -> None:
    """G-27: a ``CANCEL`` close in the opener's own task, before any child task took its
    first step, still gives every child a ``cancelled`` settlement and a rank (a task
    cancelled before it starts never enters its body, so it must not be left to it)."""
    tools, _gates = gated_tools("a", "b")
    host = file_host(tmp_path, tools)
    g = group("g", "a", "b")
    handle = await host.open_effect_group(g)
    await host.close_effect_group(handle, LoserPolicy.CANCEL)
    await asyncio.wait_for(host.idle(), 30)
    record = host.store.read("g")
    assert record is not None and record["children"] == [], "the group did not retire"
