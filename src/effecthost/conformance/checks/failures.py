"""What a combinator's failure carries (G-24): the ids of the group and of the child that
failed, for a tool's error and for a cancellation, as attributes and in the message."""

from __future__ import annotations

import asyncio

from effecthost.combinators import (
    AllEffectsFailed,
    EffectFailed,
    Scope,
    any_,
    build_group,
    next_group_key,
    race,
    sleep,
    tool,
    wait_event,
    wait_event_or_deadline,
)
from effecthost.contract import LoserPolicy, UnknownGroup, WakePolicy

from .._context import CheckContext
from .._registry import check
from .._tools import STEP, step_input


def _carries(t: CheckContext, failure: EffectFailed, key: str, position: int, rank: int) -> None:
    """``failure`` names its group, child, position and rank, as attributes and message."""
    ids = (failure.group_key, failure.replay_key, failure.position, failure.rank)
    expected = (key, f"{key}:{position}", position, rank)
    t.expect(ids == expected, f"the failure carries {ids}, not {expected}")
    t.expect(
        repr(key) in failure.message and repr(f"{key}:{position}") in failure.message,
        f"the failure's message names neither its group nor its child: {failure.message!r}",
    )


@check("G-24")
async def check_combinator_failures_name_their_group_and_child(t: CheckContext) -> None:
    """G-24 with SPEC §7 (errors carry ids): the failure ``race`` raises for its first
    settlement names the group key, the child's replay key, position and rank; when
    every child of ``any`` fails, the aggregate names the group (as ``group_key`` and in
    its message) and holds every failure in position order — also when they ranked in
    the other order — each naming the group and its child."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    calls = [
        tool(STEP, step_input(t.tag("slow"))),
        tool(STEP, step_input(t.tag("bad"), gate=False, error="Nope")),
    ]
    key = next_group_key(scope, calls)
    try:
        await t.within(race(ctl, scope, calls), "race()")
    except EffectFailed as failure:
        _carries(t, failure, key, 1, 1)
    else:
        raise AssertionError("race did not raise its first settlement's failure")
    t.release("slow")

    calls = [
        tool(STEP, step_input(t.tag("late"), error="Late")),
        tool(STEP, step_input(t.tag("early"), gate=False, error="Early")),
    ]
    key = next_group_key(scope, calls)
    task = asyncio.ensure_future(any_(ctl, scope, calls))

    async def order() -> list[int]:
        try:
            return await ctl.settlement_order(key)
        except UnknownGroup:  # not opened yet
            return []

    await t.eventually(order, lambda found: found[:1] == [1], "the early failure's rank")
    t.release("late")
    try:
        await t.within(task, "any() of failures")
    except AllEffectsFailed as aggregate:
        t.expect(aggregate.group_key == key, f"the aggregate names group {aggregate.group_key}")
        t.expect(repr(key) in aggregate.message, f"its message {aggregate.message!r}")
        found = [(f.position, f.error.type) for f in aggregate.failures]
        t.expect(found == [(0, "Late"), (1, "Early")], f"its failures are {found}")
        for each in aggregate.failures:
            assert each.position is not None
            _carries(t, each, key, each.position, 2 - each.position)
    else:
        raise AssertionError("any() of failures did not raise")


@check("G-24", "G-29", requires=("restart",))
async def check_a_cancelled_first_settlement_surfaces_as_a_cancellation(t: CheckContext) -> None:
    """G-24: ``race`` raises its first settlement's failure, also when that settlement is
    a cancellation. A ``race`` declaring ``CANCEL`` opened its group and its process died
    with both children running; the drain applied the declared ``CANCEL`` (G-29). Its
    caller, restarted with the saved scope, runs the race again: it raises
    ``EffectFailed`` for rank 1 naming the group, the child and its position, whose
    ``error`` is of type ``Cancelled`` (docs/contract.md) with a message, and whose
    settlement says ``cancelled``."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    saved = scope.to_json()
    calls = [tool(STEP, step_input(t.tag("a"))), tool(STEP, step_input(t.tag("b")))]
    group = build_group(scope, calls, WakePolicy.FIRST, LoserPolicy.CANCEL)  # what race opens
    await t.open(ctl, group)
    await t.started("a")
    await t.started("b")
    await t.restart()
    ctl = await t.ctl()
    await t.within(ctl.drain().run_pass(), "a drain pass")
    try:
        await t.within(
            race(ctl, Scope.from_json(saved), calls, disposition=LoserPolicy.CANCEL),
            "the restarted race",
        )
    except EffectFailed as failure:
        assert failure.position is not None
        _carries(t, failure, group.key, failure.position, 1)
        error = (failure.error.type, bool(failure.error.message))
        t.expect(error == ("Cancelled", True), f"a cancelled child surfaced as {failure.error}")
        status = failure.settlement.outcome.status
        t.expect(status == "cancelled", f"the cancelled child's settlement says {status}")
    else:
        raise AssertionError("the race over cancelled children returned a value")
    t.expect(t.count("finished", "a") + t.count("finished", "b") == 0, "a child ran on")


@check("G-52", "G-24", requires=("restart",))
async def check_a_cancelled_select_arm_is_no_deadline(t: CheckContext) -> None:
    """G-52, G-24: ``wait_event_or_deadline`` answers ``("deadline", None)`` only when its
    timer fired. Its group was opened and its process died before either arm settled; the
    drain applied the declared ``CANCEL`` (G-29) to both. The caller, restarted with the
    saved scope, selects again: whichever cancelled arm holds rank 1, it raises
    ``EffectFailed`` naming the group, whose error is a ``Cancelled``; no deadline passed.
    Read before the select closes the group, both arms settled as cancelled: the timer
    too, never as fired, whichever rank it took."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    saved = scope.to_json()
    name = t.tag("never")
    arms = [wait_event(name), sleep(3600.0)]
    group = build_group(scope, arms, WakePolicy.FIRST, LoserPolicy.CANCEL)  # what it opens
    await t.open(ctl, group)
    await t.restart()
    ctl = await t.ctl()
    await t.within(ctl.drain().run_pass(), "a drain pass")
    # Read now: the select's close retires the group, and its rank 1 alone does not show
    # the timer when the event arm drained first.
    reading = await t.open(ctl, group)
    drained = {s.position: s.outcome.status for s in [await t.next(ctl, reading) for _ in arms]}
    t.expect(
        drained == {0: "cancelled", 1: "cancelled"},
        f"the drain settled the select's arms as {drained} (event 0, timer 1), not cancelled",
    )
    try:
        answer = await t.within(
            wait_event_or_deadline(ctl, Scope.from_json(saved), name, 3600.0),
            "the restarted select",
        )
    except EffectFailed as failure:
        t.expect(failure.group_key == group.key, f"the failure names {failure.group_key}")
        t.expect(failure.rank == 1, f"the failure names rank {failure.rank}")
        t.expect(failure.error.type == "Cancelled", f"a cancelled arm surfaced as {failure.error}")
    else:
        raise AssertionError(f"a select whose arms were both cancelled answered {answer!r}")
