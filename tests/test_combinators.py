"""race, any_, all_, all_settled and the deadline selects over the memory host
(G-04, G-05, G-23…G-25, G-52). Children are gated tools; order comes from the gates."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
import pytest

from effecthost.combinators import (
    AllEffectsFailed,
    Call,
    DeadlineExceeded,
    EffectFailed,
    Scope,
    all_,
    all_settled,
    any_,
    build_group,
    first_success,
    next_group_key,
    race,
    sleep,
    tool,
    wait_event,
    wait_event_or_deadline,
    with_deadline,
)
from effecthost.contract import (
    EffectController,
    EffectGroup,
    EmptyGroup,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
    ToolError,
    ToolRegistry,
    UnknownGroup,
    WakePolicy,
)
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio

T = TypeVar("T")


class Lab:
    """Tools the test controls: a child waits on the gate named by its label."""

    def __init__(self) -> None:
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.finished: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.cancelled: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.runs: Counter[str] = Counter()
        self.registry = ToolRegistry({"step": self.step})

    async def step(self, spec: dict[str, Any]) -> Any:
        label = spec["label"]
        self.runs[label] += 1
        self.started[label].set()
        if spec["gate"]:
            try:
                await self.gates[label].wait()
            except asyncio.CancelledError:
                self.cancelled[label].set()
                raise
        self.finished[label].set()
        if "error" in spec:
            raise ToolError(spec["error"], f"{label} failed", data={"label": label})
        return spec.get("result", label.upper())

    async def release_after(self, earlier: str, later: str) -> None:
        """Open ``later``'s gate once ``earlier`` has settled (its tool returned)."""
        await self.finished[earlier].wait()
        self.gates[later].set()


class WatchedHost(MemoryEffectHost):
    """Counts opens and signals each one, so a test can act once a group exists."""

    def __init__(self, registry: ToolRegistry) -> None:
        super().__init__(registry)
        self.groups: list[EffectGroup] = []
        self.opened = asyncio.Event()

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        handle = await super().open_effect_group(group)
        self.groups.append(group)
        self.opened.set()
        return handle


class Untouchable(EffectController):
    """Any group call is a test failure: proves a combinator resolved locally."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        raise AssertionError(f"host touched for {group.key}")


def step(label: str, *, gate: bool = True, **spec: Any) -> Call:
    return tool("step", {"label": label, "gate": gate, **spec})


async def within(awaitable: Awaitable[T]) -> T:
    with anyio.fail_after(5):
        return await awaitable


def second_child_at_rank_one(code: str, key: str) -> dict[str, object]:
    """The ids of a ``code`` error from group ``key``'s second child, its first rank."""
    return {"code": code, "group_key": key, "replay_key": f"{key}:1", "position": 1, "rank": 1}


@pytest.fixture
def lab() -> Lab:
    return Lab()


@pytest.fixture
def scope() -> Scope:
    return Scope(scope_id="turn-9")


@pytest.fixture
async def host(lab: Lab) -> AsyncIterator[WatchedHost]:
    host = WatchedHost(lab.registry)
    yield host
    await host.aclose()


async def test_g24_g25_race_returns_the_first_settlement_and_losers_run_on(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("slow"), step("fast", gate=False)]
    assert await within(race(host, scope, calls)) == "FAST"
    (g,) = host.groups
    assert (g.wake, g.disposition) == (WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    assert not lab.cancelled["slow"].is_set()
    lab.gates["slow"].set()
    await within(lab.finished["slow"].wait())
    assert not lab.cancelled["slow"].is_set()
    with pytest.raises(UnknownGroup):
        await host.settlement_order(g.key)


async def test_g24_race_raises_the_first_settlement_when_it_is_an_error(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("slow"), step("bad", gate=False, error="Boom")]
    key = next_group_key(scope, calls)
    with pytest.raises(EffectFailed) as caught:
        await within(race(host, scope, calls))
    error = caught.value
    assert error.ids() == second_child_at_rank_one("effect_failed", key)
    assert (error.error.type, error.error.data) == ("Boom", {"label": "bad"})
    assert str(error).startswith("[effect_failed]") and f"{key}:1" in str(error)
    assert error.settlement.outcome.status == "error"


async def test_g25_race_with_cancel_disposition_cancels_the_losers(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("slow"), step("fast", gate=False)]
    assert await within(race(host, scope, calls, disposition=LoserPolicy.CANCEL)) == "FAST"
    await within(lab.cancelled["slow"].wait())
    assert not lab.finished["slow"].is_set()


async def test_g24_any_returns_the_first_success_after_failures(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("good", result="ok"), step("bad", gate=False, error="Boom")]
    waiter = asyncio.create_task(lab.release_after("bad", "good"))
    assert await within(any_(host, scope, calls)) == "ok"
    await waiter
    (g,) = host.groups
    assert (g.wake, g.disposition) == (WakePolicy.FIRST_SUCCESS, LoserPolicy.RUN_TO_COMPLETION)
    assert first_success is any_


async def test_g24_any_aggregates_every_failure_in_position_order(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("late", error="Late"), step("early", gate=False, error="Early")]
    key = next_group_key(scope, calls)
    waiter = asyncio.create_task(lab.release_after("early", "late"))
    with pytest.raises(AllEffectsFailed) as caught:
        await within(any_(host, scope, calls))
    await waiter
    failures = caught.value.failures
    assert [(f.position, f.rank, f.error.type) for f in failures] == [
        (0, 2, "Late"),
        (1, 1, "Early"),
    ]
    assert [f.replay_key for f in failures] == [f"{key}:0", f"{key}:1"]
    assert caught.value.group_key == key
    assert str(caught.value).startswith("[all_effects_failed]")


async def test_g24_all_returns_values_in_position_order_not_rank_order(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("a", result=1), step("b", gate=False, result=2), step("c", result=3)]
    releases = [
        asyncio.create_task(lab.release_after("b", "c")),
        asyncio.create_task(lab.release_after("c", "a")),
    ]
    assert await within(all_(host, scope, calls)) == [1, 2, 3]
    await asyncio.gather(*releases)
    (g,) = host.groups
    assert (g.wake, g.disposition) == (WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)


async def test_g23_all_stops_at_the_first_rejection_in_rank_order_and_losers_run_on(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("a", error="Late"), step("b", gate=False, error="Early"), step("c")]
    key = next_group_key(scope, calls)
    with pytest.raises(EffectFailed) as caught:
        await within(all_(host, scope, calls))
    assert (caught.value.rank, caught.value.position, caught.value.error.type) == (1, 1, "Early")
    assert caught.value.replay_key == f"{key}:1"
    assert key not in await host.open_group_keys()
    lab.gates["a"].set()
    lab.gates["c"].set()
    await within(lab.finished["a"].wait())
    await within(lab.finished["c"].wait())
    assert not lab.cancelled["a"].is_set() and not lab.cancelled["c"].is_set()


async def test_g24_all_settled_returns_every_outcome_in_position_order(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    calls = [step("a", error="Nope"), step("b", gate=False, result="fine")]
    waiter = asyncio.create_task(lab.release_after("b", "a"))
    outcomes = await within(all_settled(host, scope, calls))
    await waiter
    assert [o.status for o in outcomes] == ["error", "success"]
    assert outcomes[0].error is not None and outcomes[0].error.type == "Nope"
    assert outcomes[1].value == "fine"
    (g,) = host.groups
    assert (g.wake, g.disposition) == (WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)


async def test_g04_empty_combinators_resolve_locally(scope: Scope) -> None:
    ctl = Untouchable()
    assert await all_(ctl, scope, []) == []
    assert await all_settled(ctl, scope, []) == []
    with pytest.raises(EmptyGroup, match=r"^\[empty_group\] race\(\[\]\)"):
        await race(ctl, scope, [])
    with pytest.raises(EmptyGroup):
        await any_(ctl, scope, [])
    assert scope.counter.counts == {}


async def test_g52_with_deadline_returns_the_value_and_cancels_the_timer(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    assert await within(with_deadline(host, scope, step("quick", gate=False), 3600)) == "QUICK"
    (g,) = host.groups
    assert (g.wake, g.disposition) == (WakePolicy.FIRST, LoserPolicy.CANCEL)
    assert [c.kind for c in g.children] == ["tool_call", "sleep"]
    await within(asyncio.gather(*host._tasks.values()))
    with pytest.raises(UnknownGroup):
        await host.settlement_order(g.key)


async def test_g52_with_deadline_raises_when_the_timer_wins_and_cancels_the_call(
    host: WatchedHost, lab: Lab, scope: Scope
) -> None:
    call = step("stuck")
    key = next_group_key(scope, [call, sleep(0)])
    with pytest.raises(DeadlineExceeded) as caught:
        await within(with_deadline(host, scope, call, 0))
    error = caught.value
    assert error.ids() == second_child_at_rank_one("deadline_exceeded", key)
    await within(lab.cancelled["stuck"].wait())
    assert not lab.finished["stuck"].is_set()


async def test_g52_wait_event_or_deadline_returns_the_event_and_cancels_the_timer(
    host: WatchedHost, scope: Scope
) -> None:
    key = next_group_key(scope, [wait_event("approval"), sleep(3600)])
    select = asyncio.create_task(wait_event_or_deadline(host, scope, "approval", 3600))
    await within(host.opened.wait())
    assert host.groups[0].key == key
    assert await host.deliver_event(key, "approval", {"by": "ops"}) == 1
    assert await within(select) == ("event", {"by": "ops"})
    await within(asyncio.gather(*host._tasks.values()))
    assert await host.deliver_event(key, "approval") == 0


class TimerCancelledFirst(WatchedHost):
    """Serves its groups' timer arm as rank 1, cancelled: what a host that applied a
    ``CANCEL`` to both arms (a drain after a crash) may rank first, in any order."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        group = self.groups[-1]
        return Settlement(
            rank=1, position=1, replay_key=f"{group.key}:1", outcome=Outcome.cancelled()
        )


async def test_g52_a_cancelled_timer_is_no_deadline(lab: Lab, scope: Scope) -> None:
    """G-52, G-24: ``("deadline", None)`` means the timer fired; a timer arm that was
    cancelled (no deadline passed) surfaces as ``EffectFailed``, as a cancelled event arm
    does."""
    host = TimerCancelledFirst(lab.registry)
    try:
        with pytest.raises(EffectFailed) as failed:
            await within(wait_event_or_deadline(host, scope, "approval", 3600))
        assert failed.value.error.type == "Cancelled"
        assert failed.value.position == 1
    finally:
        await host.aclose()


async def test_g52_wait_event_or_deadline_reports_the_deadline(
    host: WatchedHost, scope: Scope
) -> None:
    key = next_group_key(scope, [wait_event("approval"), sleep(0)])
    assert await within(wait_event_or_deadline(host, scope, "approval", 0)) == ("deadline", None)
    (g,) = host.groups
    assert (g.key, g.wake, g.disposition) == (key, WakePolicy.FIRST, LoserPolicy.CANCEL)
    await within(asyncio.gather(*host._tasks.values()))
    assert await host.deliver_event(key, "approval") == 0


async def test_g05_identical_combinator_calls_open_distinct_groups(
    host: WatchedHost, scope: Scope
) -> None:
    calls = [step("x", gate=False)]
    assert next_group_key(scope, calls) == next_group_key(scope, calls)
    first = await within(race(host, scope, calls))
    second = await within(race(host, scope, calls))
    assert first == second == "X"
    keys = [g.key for g in host.groups]
    assert keys[0].endswith(":0") and keys[1].endswith(":1")
    assert keys[0].rsplit(":", 1)[0] == keys[1].rsplit(":", 1)[0]
    assert next_group_key(scope, calls).endswith(":2")
    peek = build_group(
        Scope.from_json(scope.to_json()), calls, WakePolicy.FIRST, LoserPolicy.CANCEL
    )
    assert peek.key == next_group_key(scope, calls)


class _Calls(list[Call]):
    """A list of calls a test can hold a weak reference to."""


@pytest.mark.parametrize("combinator", [race, any_, all_, all_settled])
async def test_combinators_let_go_of_inline_calls_once_the_group_is_built(
    combinator: Any,
) -> None:
    """G-01: the group holds its own copies of the calls' inputs, so a combinator keeps
    the group, not the caller's list: calls passed inline are freed while the group runs
    (a 10,000-child group would otherwise hold every call to its end)."""
    seen: list[bool] = []
    holder: list[weakref.ref[_Calls]] = []

    async def probe(_: Any) -> str:
        gc.collect()
        seen.append(holder[0]() is None)
        return "ok"

    host = MemoryEffectHost(ToolRegistry({"probe": probe}))
    calls = _Calls([tool("probe", 1), tool("probe", 2)])
    holder.append(weakref.ref(calls))
    running = combinator(host, Scope(scope_id="inline"), calls)
    del calls
    await within(running)
    assert seen and all(seen)
