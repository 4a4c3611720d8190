"""Transient faults (R-12): a write that fails, a race an optimistic engine loses.

These need a host that can be made to fail on request (the ``transient_faults``
capability): the next settlement writes raise as an outage would, the next opens and
closes lose their optimistic race before writing. A retry never changes what is recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from effecthost.contract import (
    DrainReport,
    EffectGroup,
    EngineUnavailable,
    GroupHandle,
    LoserPolicy,
    UnknownGroup,
)

from .._context import CheckContext
from .._host import FaultedStep
from .._registry import check


@asynccontextmanager
async def faults(t: CheckContext, operation: FaultedStep) -> AsyncIterator[int]:
    """The host's bound for ``operation``; no fault is left pending after the check."""
    bound = await t.host.inject_faults(operation, 0)
    t.expect(bound >= 1, f"the host reports a bound of {bound} attempts for {operation!r}")
    try:
        yield bound
    finally:
        await t.host.inject_faults(operation, 0)


def gave_up(t: CheckContext, error: EngineUnavailable, key: str, operation: str) -> None:
    """An ``EngineUnavailable`` names the group, the call that gave up and how long it
    tried (R-12)."""
    t.expect(
        error.operation == operation,
        f"the EngineUnavailable of a failed {operation} names operation {error.operation!r}",
    )
    t.expect(key in str(error), f"the EngineUnavailable of a failed {operation} names no group")
    tried = error.tried_for
    t.expect(
        isinstance(tried, float | int) and 0 < tried < 3600,
        f"the EngineUnavailable of a failed {operation} says it tried for {tried!r} seconds",
    )


@check("G-15", requires=("transient_faults",))
async def check_a_settlement_write_that_fails_is_retried_never_lost(t: CheckContext) -> None:
    """Ruling R-12 (G-15): a settlement write that fails transiently is retried up to the
    host's bound, and the settlement takes its rank as if nothing failed: a tool's and an
    event's. When every attempt fails the settlement is neither lost nor recorded twice:
    the child stays unsettled and a drain pass of its owner runs it again, once; an event
    delivery whose every write failed raises ``EngineUnavailable`` naming the group and
    ``deliver_event`` (no driver's error leaves the API), and delivering again settles
    the wait."""
    ctl = await t.ctl()
    async with faults(t, "settle") as bound:
        group = t.group("g", [t.step("a"), t.step("b"), t.event("w", "go")])
        handle = await t.open(ctl, group)
        await t.started("a")
        await t.started("b")

        await t.host.inject_faults("settle", bound - 1)
        t.release("a")
        await t.next_is(ctl, handle, "a")

        await t.host.inject_faults("settle", bound)
        t.release("b")
        await t.finished("b")
        ids = (group.key, t.tag("b"))

        async def drain() -> DrainReport:
            return await t.within(ctl.drain().run_pass(), "a drain pass")

        await t.eventually(
            drain, lambda report: ids in report.resumed, "a drain pass to run b again"
        )
        await t.next_is(ctl, handle, "b")
        t.expect(
            t.count("started", "b") == 2,
            f"b ran {t.count('started', 'b')} times: once, and once more for the drain",
        )

        await t.host.inject_faults("settle", bound)
        error = await t.refuses(
            EngineUnavailable,
            ctl.deliver_event(group.key, "go", 7),
            "a delivery whose every settlement write failed",
            names={"group_key": group.key},
        )
        gave_up(t, error, group.key, "deliver_event")
        t.expect(
            await ctl.settlement_order(group.key) == [0, 1],
            "a delivery that failed recorded a settlement",
        )
        await t.host.inject_faults("settle", bound - 1)
        reached = await t.within(ctl.deliver_event(group.key, "go", 7), "a delivery")
        t.expect(reached == 1, f"a delivery after the outage settled {reached} waits, not 1")
        served = await t.next_is(ctl, handle, "w")
        t.expect(served.outcome.value == 7, f"the event settled with {served.outcome.value!r}")


async def _listed(t: CheckContext, key: str) -> bool:
    ctl = await t.ctl()
    return key in await ctl.open_group_keys()


@check("G-08", requires=("transient_faults",))
async def check_an_open_that_loses_its_race_runs_again(t: CheckContext) -> None:
    """Ruling R-12 (G-08, R-7): an open whose atomic step loses an optimistic race (the
    engine reports a conflict before anything is written) runs again from its first read,
    up to the host's bound, and returns its handle once recorded; each child starts once.
    After as many conflicts in a row as the bound, it raises ``EngineUnavailable`` naming
    the group and ``open`` and has recorded nothing: the key is not listed, nothing
    started, and opening again is a first open."""
    ctl = await t.ctl()
    async with faults(t, "guard") as bound:
        group = t.group("g", [t.step("a", gate=False), t.step("b", gate=False)])
        await t.host.inject_faults("guard", bound - 1)
        handle = await t.open(ctl, group)
        t.expect(handle.consumed == 0, f"an open returned consumed={handle.consumed}")
        served = [(await t.next(ctl, handle)).replay_key for _ in range(2)]
        t.expect(sorted(served) == [t.tag("a"), t.tag("b")], f"served {served}")

        lost = t.group("lost", [t.step("c", gate=False)])
        await t.host.inject_faults("guard", bound)
        error = await t.refuses(
            EngineUnavailable,
            ctl.open_effect_group(lost),
            "an open that lost every race",
            names={"group_key": lost.key},
        )
        gave_up(t, error, lost.key, "open")
        t.expect(not await _listed(t, lost.key), "an open that gave up listed its group")
        await t.refuses(
            UnknownGroup,
            ctl.settlement_order(lost.key),
            "the order of a group whose open gave up",
            names={"group_key": lost.key},
        )
        again = await t.open(ctl, lost)
        await t.next_is(ctl, again, "c")
        for label in ("a", "b", "c"):
            starts = t.count("started", label)
            t.expect(starts == 1, f"{label} started {starts} times; an open starts it once")


@check("G-26", requires=("transient_faults",))
async def check_a_close_that_loses_its_race_runs_again(t: CheckContext) -> None:
    """Ruling R-12 (G-26, R-4): a close whose atomic step loses an optimistic race runs
    again from its first read, up to the host's bound, and then applies as one close: a
    ``CANCEL`` close cancels the losers and the group is unlisted. After as many conflicts
    in a row as the bound, it raises ``EngineUnavailable`` naming the group and ``close``
    and has recorded nothing: the group stays open and readable, and closing again
    applies."""
    ctl = await t.ctl()
    async with faults(t, "guard") as bound:
        groups: dict[str, tuple[EffectGroup, GroupHandle]] = {}
        for name in ("once", "lost"):
            group = t.group(name, [t.step(f"{name}.w", gate=False), t.step(f"{name}.l")])
            handle = await t.open(ctl, group)
            await t.next_is(ctl, handle, f"{name}.w")
            await t.started(f"{name}.l")
            groups[name] = group, handle

        group, handle = groups["once"]
        await t.host.inject_faults("guard", bound - 1)
        await t.within(ctl.close_effect_group(handle, LoserPolicy.CANCEL), "a close")
        await t.cancelled("once.l")
        t.expect(not await _listed(t, group.key), "a closed group is still listed")

        group, handle = groups["lost"]
        await t.host.inject_faults("guard", bound)
        error = await t.refuses(
            EngineUnavailable,
            ctl.close_effect_group(handle, LoserPolicy.CANCEL),
            "a close that lost every race",
            names={"group_key": group.key},
        )
        gave_up(t, error, group.key, "close")
        t.expect(await _listed(t, group.key), "a close that gave up unlisted its group")
        t.expect(t.count("cancelled", "lost.l") == 0, "a close that gave up cancelled a loser")
        t.expect(
            await ctl.settlement_order(group.key) == [0],
            "a close that gave up changed the group's order",
        )
        await t.within(ctl.close_effect_group(handle, LoserPolicy.CANCEL), "a close")
        await t.cancelled("lost.l")
        t.expect(not await _listed(t, group.key), "a closed group is still listed")
