"""Wake policies and the combinators over a real host: G-23…G-25, and a combinator
cancelled from outside (R-9)."""

from __future__ import annotations

import asyncio
from typing import Any

from effecthost.combinators import (
    AllEffectsFailed,
    Call,
    DeadlineExceeded,
    EffectFailed,
    Scope,
    all_,
    all_settled,
    any_,
    next_group_key,
    race,
    sleep,
    tool,
    wait_event,
    wait_event_or_deadline,
    with_deadline,
)
from effecthost.contract import (
    GroupClosed,
    LoserPolicy,
    WakePolicy,
)

from .._context import CheckContext
from .._registry import check
from .._tools import STEP, STEP_ERROR_CODE, failure_data, step_input
from ._recording import Recording
from .closing import ranks_complete


def _call(t: CheckContext, label: str, **options: Any) -> Call:
    return tool(STEP, step_input(t.tag(label), **options))


@check("G-23", "G-24")
async def check_all_stops_at_the_first_rejection_in_rank_order(t: CheckContext) -> None:
    """``all`` raises the rejection that ranks first — not the first by position — and
    the other children run on."""
    ctl = await t.ctl()
    calls = [
        _call(t, "a", error="EarlyByPosition"),
        _call(t, "b", error="FirstByRank"),
        _call(t, "c", result=3),
    ]
    task = asyncio.ensure_future(all_(ctl, Scope(scope_id=t.scope), calls))
    await t.started("a")
    t.release("b")
    try:
        await t.within(task, "all()")
    except EffectFailed as failure:
        t.expect(failure.error.type == "FirstByRank", f"wrong rejection: {failure.error.type}")
        t.expect(failure.rank == 1 and failure.position == 1, "rejection must carry its ids")
        slot = (failure.replay_key, failure.settlement.position, bool(failure.message))
        t.expect(
            slot == (f"{failure.group_key}:1", 1, True),
            f"the rejection names child {slot[0]!r} of {failure.group_key!r}, settlement "
            f"position {slot[1]}, message {failure.message!r}",
        )
    else:
        raise AssertionError("all() did not raise")
    t.release("a", "c")
    await t.finished("a")
    await t.finished("c")
    t.expect(t.count("cancelled", "a") + t.count("cancelled", "c") == 0, "losers cancelled")


@check("G-23", "G-24")
async def check_all_settled_and_all_return_in_position_order(t: CheckContext) -> None:
    """``allSettled`` returns every outcome and ``all`` every value, in position order,
    whatever order they settled in; a failure comes back whole, as the tool raised it
    (type, message, data and code)."""
    ctl = await t.ctl()
    t.expect(list(WakePolicy) == [WakePolicy.FIRST, WakePolicy.FIRST_SUCCESS, WakePolicy.ALL], "")
    scope = Scope(scope_id=t.scope)
    task = asyncio.ensure_future(
        all_settled(ctl, scope, [_call(t, "a", result=1), _call(t, "b", error="Boom")])
    )
    t.release("b")
    await t.finished("b")
    t.release("a")
    outcomes = await t.within(task, "allSettled()")
    t.expect([o.status for o in outcomes] == ["success", "error"], "allSettled order")
    t.expect(outcomes[0].value == 1, "allSettled value")
    failure = outcomes[1].error
    recorded = None if failure is None else (failure.type, failure.message, failure.data)
    raised = ("Boom", f"step {t.tag('b')} failed on purpose", failure_data(t.tag("b")))
    t.expect(recorded == raised, f"the failure as recorded {recorded} is not as raised {raised}")
    code = None if failure is None else failure.code
    t.expect(code == STEP_ERROR_CODE, f"the failure's code {code!r} is not {STEP_ERROR_CODE}")
    task2 = asyncio.ensure_future(
        all_(ctl, scope, [_call(t, "x", result="X"), _call(t, "y", result="Y")])
    )
    t.release("y")
    await t.finished("y")
    t.release("x")
    t.expect(await t.within(task2, "all()") == ["X", "Y"], "all() position order")


@check("G-24")
async def check_race_returns_the_first_settlement(t: CheckContext) -> None:
    """``race`` returns the first settlement's value, or raises its failure."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    value = await t.within(
        race(ctl, scope, [_call(t, "slow"), _call(t, "fast", gate=False, result="F")]),
        "race()",
    )
    t.expect(value == "F", "race must return the first settlement")
    try:
        await t.within(
            race(ctl, scope, [_call(t, "slow2"), _call(t, "bad", gate=False, error="Nope")]),
            "race()",
        )
    except EffectFailed as failure:
        t.expect(failure.error.type == "Nope", "race must raise the first failure")
    else:
        raise AssertionError("race did not raise the first settlement's failure")


@check("G-24")
async def check_any_returns_the_first_success(t: CheckContext) -> None:
    """``any`` skips failures to the first success; if all fail, it raises one error
    carrying every failure."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    task = asyncio.ensure_future(
        any_(ctl, scope, [_call(t, "bad", gate=False, error="E1"), _call(t, "good", result=5)])
    )
    await t.finished("bad")
    t.release("good")
    t.expect(await t.within(task, "any()") == 5, "any must return the success")
    try:
        await t.within(
            any_(
                ctl,
                scope,
                [_call(t, "e1", gate=False, error="E1"), _call(t, "e2", gate=False, error="E2")],
            ),
            "any() of failures",
        )
    except AllEffectsFailed as aggregate:
        types = [f.error.type for f in aggregate.failures]
        t.expect(types == ["E1", "E2"], f"aggregate must carry both failures: {types}")
    else:
        raise AssertionError("any() of failures did not raise")


@check("G-25", "G-23")
async def check_combinators_declare_wake_and_loser_policy(t: CheckContext) -> None:
    """all/allSettled declare ALL + RUN_TO_COMPLETION, race FIRST and any FIRST_SUCCESS
    with RUN_TO_COMPLETION by default, a deadline FIRST + CANCEL; the host's handle
    reports what was declared."""
    spy = Recording(await t.ctl())
    scope = Scope(scope_id=t.scope)
    await all_(spy, scope, [_call(t, "a", gate=False)])
    await all_settled(spy, scope, [_call(t, "b", gate=False)])
    await race(spy, scope, [_call(t, "c", gate=False)])
    await any_(spy, scope, [_call(t, "d", gate=False)])
    await with_deadline(spy, scope, _call(t, "e", gate=False), 30.0)
    rtc, cancel = LoserPolicy.RUN_TO_COMPLETION, LoserPolicy.CANCEL
    expected = [
        (WakePolicy.ALL, rtc),
        (WakePolicy.ALL, rtc),
        (WakePolicy.FIRST, rtc),
        (WakePolicy.FIRST_SUCCESS, rtc),
        (WakePolicy.FIRST, cancel),
    ]
    got = [(g.wake, g.disposition) for g in spy.opened]
    t.expect(got == expected, f"declared policies {got} != {expected}")
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("z", gate=False)], disposition=cancel))
    t.expect(handle.disposition is cancel, "the handle must carry the declared disposition")


@check("G-25", "G-26")
async def check_an_outer_cancellation_closes_the_group(t: CheckContext) -> None:
    """Ruling R-9: a combinator cancelled from outside closes its group with the declared
    disposition, shielded from the cancellation, before re-raising it: after a ``race``
    declaring ``CANCEL`` is cancelled while both children run, the caller sees its own
    cancellation, the group is closed (not listed, an await is ``GroupClosed``) and both
    losers are cancelled."""
    ctl = await t.ctl()
    spy = Recording(ctl)
    calls = [_call(t, "a"), _call(t, "b")]
    task = asyncio.ensure_future(
        race(spy, Scope(scope_id=t.scope), calls, disposition=LoserPolicy.CANCEL)
    )
    await t.started("a")
    await t.started("b")
    group = spy.opened[0]
    t._opened.append(group.handle())
    task.cancel()
    await asyncio.wait({task}, timeout=t.timeout)
    t.expect(task.done(), "the cancelled race did not return")
    if not task.cancelled():
        raise AssertionError(f"the cancelled race ended with {task.exception()!r}")
    t.expect(group.key not in await ctl.open_group_keys(), "the cancelled race's group is open")
    await t.refuses(
        GroupClosed, ctl.await_next_settlement(group.handle()), "an await after the cancel"
    )
    await t.cancelled("a")
    await t.cancelled("b")


@check("G-52", "G-24")
async def check_the_deadline_combinators_report_which_arm_won(t: CheckContext) -> None:
    """``with_deadline`` returns the call's value when it settles first, raises its
    failure as ``EffectFailed`` (position 0, rank 1) when it fails first, and raises
    ``DeadlineExceeded`` naming the group and the timer's slot (position 1, rank 1) when
    the timer settles first, the call then cancelled. ``wait_event_or_deadline`` answers
    ``("event", payload)`` for an event delivered to the key ``next_group_key`` named
    before, ``("deadline", None)`` when the timer wins, its wait then cancelled."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    value = await t.within(
        with_deadline(ctl, scope, _call(t, "quick", gate=False, result="q"), 30.0), "a deadline"
    )
    t.expect(value == "q", f"with_deadline returned {value!r}, not the call's value")

    failing = _call(t, "fails", gate=False, error="Early")
    key = next_group_key(scope, [failing, sleep(30.0)])
    try:
        await t.within(with_deadline(ctl, scope, failing, 30.0), "a failing call's deadline")
    except EffectFailed as failure:
        ids = (failure.group_key, failure.position, failure.rank, failure.error.type)
        t.expect(ids == (key, 0, 1, "Early"), f"the call's failure carries {ids}")
    else:
        raise AssertionError("with_deadline did not raise the call's failure")

    slow = _call(t, "slow")
    key = next_group_key(scope, [slow, sleep(0.05)])
    try:
        await t.within(with_deadline(ctl, scope, slow, 0.05), "a deadline that passes")
    except DeadlineExceeded as exceeded:
        slot = (exceeded.group_key, exceeded.replay_key, exceeded.position, exceeded.rank)
        t.expect(slot == (key, f"{key}:1", 1, 1), f"DeadlineExceeded carries {slot}")
        t.expect(bool(exceeded.message), "DeadlineExceeded has no message")
    else:
        raise AssertionError("with_deadline did not raise DeadlineExceeded")
    await t.cancelled("slow")
    t.release("slow")

    name = t.tag("go")
    key = next_group_key(scope, [wait_event(name), sleep(30.0)])
    task = asyncio.ensure_future(wait_event_or_deadline(ctl, scope, name, 30.0))
    await t.eventually(ctl.open_group_keys, lambda keys: key in keys, "the select to open")
    reached = await ctl.deliver_event(key, name, {"v": 1})
    t.expect(reached == 1, f"the event to the select's key settled {reached} waits, not 1")
    answer = await t.within(task, "the select after its event")
    t.expect(answer == ("event", {"v": 1}), f"the event-first select answered {answer}")

    quiet = t.tag("quiet")
    key = next_group_key(scope, [wait_event(quiet), sleep(0.05)])
    answer = await t.within(wait_event_or_deadline(ctl, scope, quiet, 0.05), "a quiet select")
    t.expect(answer == ("deadline", None), f"the timer-first select answered {answer}")
    await ranks_complete(t, ctl, key, 2, served=[1])
    reached = await ctl.deliver_event(key, quiet, 1)
    t.expect(reached == 0, "the select's losing event wait was not cancelled")
