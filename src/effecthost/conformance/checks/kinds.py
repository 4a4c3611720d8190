"""Child kinds, the deadline/signal select and engine routing: G-14, G-51…G-53; a
malformed sleep refuses the open (G-10)."""

from __future__ import annotations

import asyncio
from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    InvalidEnvelope,
    LoserPolicy,
    ReplayMismatch,
    UnknownGroup,
    WakePolicy,
)

from .._context import INPUT_MARKER, CheckContext
from .._registry import check
from .closing import claims_freed, closes_promptly, ranks_complete


@check("G-51")
async def check_three_child_kinds(t: CheckContext) -> None:
    """A tool call, a sleep and an event wait all run as children and rank; ruling R-5:
    the sleep settles with ``null``, the event wait with the payload, and
    ``deliver_event`` counts the children it settled (a second delivery settles none)."""
    ctl = await t.ctl()
    group = t.group(
        "g", [t.step("tool", gate=False, result="T"), t.sleep("nap", 0.05), t.event("ev", "ping")]
    )
    handle = await t.open(ctl, group)
    seen: dict[str, object] = {}
    for _ in range(2):
        settlement = await t.next(ctl, handle)
        seen[settlement.replay_key] = settlement.outcome.value
    t.expect(set(seen) == {t.tag("tool"), t.tag("nap")}, f"tool and sleep first: {seen}")
    t.expect(seen[t.tag("tool")] == "T", "tool value")
    t.expect(seen[t.tag("nap")] is None, f"a sleep settles with null, got {seen[t.tag('nap')]!r}")
    reached = await ctl.deliver_event(group.key, "ping", {"n": 1})
    t.expect(reached == 1, f"the event must reach one child, reached {reached}")
    last = await t.next_is(ctl, handle, "ev")
    t.expect(last.outcome.value == {"n": 1}, "the event payload is the child's value")
    again = await ctl.deliver_event(group.key, "ping", {"n": 2})
    t.expect(again == 0, f"a second delivery to a settled child counted {again}")


@check("G-51", requires=("restart", "durable_timers"))
async def check_sleep_fires_at_its_recorded_due_time(t: CheckContext) -> None:
    """A sleep interrupted by a restart fires at the due time recorded at open, not a
    full duration after the restart. Judged against a reference sleep opened after the
    restart on the same host and due half the elapsed time before a restarted timer
    would be: the recorded timer must fire first. Load delays both timers alike, so no
    wall-clock margin decides the verdict."""
    ctl = await t.ctl()
    duration = max(1.0, t.timeout / 2)
    group = t.group("g", [t.sleep("nap", duration)])
    loop = asyncio.get_running_loop()
    opened = loop.time()
    await t.open(ctl, group)
    await t.restart()
    aged = loop.time() - opened
    if aged < duration / 2:
        # the recorded timer must age before the two readings can differ: the ageing of a
        # timer is what is tested here, nothing is ordered by this wait
        await asyncio.sleep(duration / 2 - aged)
    ctl = await t.ctl()
    handle = await t.open(ctl, group)
    elapsed = loop.time() - opened
    reference = t.group("ref", [t.sleep("ref", max(0.0, duration - elapsed / 2))])
    reference_handle = await t.open(ctl, reference)
    nap = asyncio.ensure_future(ctl.await_next_settlement(handle))
    ref = asyncio.ensure_future(ctl.await_next_settlement(reference_handle))
    try:
        done, _ = await asyncio.wait(
            {nap, ref}, timeout=duration + t.timeout, return_when=asyncio.FIRST_COMPLETED
        )
        t.expect(bool(done), "neither sleep fired")
        t.expect(
            nap in done,
            f"sleep restarted from zero: a sleep of {max(0.0, duration - elapsed / 2):.2f}s "
            f"opened {elapsed:.2f}s after it fired first",
        )
    finally:
        for task in (nap, ref):
            task.cancel()
        await asyncio.gather(nap, ref, return_exceptions=True)


@check("G-51", requires=("restart",))
async def check_event_delivered_while_the_caller_is_down(t: CheckContext) -> None:
    """An event delivered after the caller's process died is not lost."""
    ctl = await t.ctl()
    group = t.group("g", [t.event("ev", "wake-up")])
    await t.open(ctl, group)
    await t.restart()
    ctl = await t.ctl()
    reached = await ctl.deliver_event(group.key, "wake-up", "payload")
    t.expect(reached == 1, "the event must reach the waiting child")
    handle = await t.open(ctl, group)
    settlement = await t.next_is(ctl, handle, "ev")
    t.expect(settlement.outcome.value == "payload", "event payload lost")


def _select(t: CheckContext, label: str) -> EffectGroup:
    """A FIRST/CANCEL group of a wait for event ``go`` (``ev``) and a 60 s sleep."""
    children = [t.event("ev", "go"), t.sleep("deadline", 60.0)]
    return t.group(label, children, wake=WakePolicy.FIRST, disposition=LoserPolicy.CANCEL)


@check("G-52", "G-53")
async def check_signal_or_deadline_select(t: CheckContext) -> None:
    """A two-child FIRST/CANCEL group of an event wait and a sleep: the event wins when
    delivered first, the deadline when not; children carry membership; the close really
    cancels the loser the host runs itself (the sleep, or the event wait), which then
    takes rank 2."""
    ctl = await t.ctl()
    signal = _select(t, "signal")
    t.expect(all(c.membership is not None for c in signal.children), "membership stripped")
    t.expect(
        [c.kind for c in signal.children] == [EffectKind.AWAIT_EVENT, EffectKind.SLEEP], "kinds"
    )
    handle = await t.open(ctl, signal)
    await ctl.deliver_event(signal.key, "go", True)
    first = await t.next_is(ctl, handle, "ev")
    t.expect(first.outcome.value is True, "event value")
    await closes_promptly(t, ctl, handle)
    await ranks_complete(t, ctl, signal.key, 2, served=[0])

    timeout = t.group(
        "timeout",
        [t.event("never", "never"), t.sleep("short", 0.05)],
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, timeout)
    await t.next_is(ctl, handle, "short")
    await closes_promptly(t, ctl, handle)
    t.expect(timeout.key not in await ctl.open_group_keys(), "a closed group is listed")
    await ranks_complete(t, ctl, timeout.key, 2, served=[1])
    reached = await ctl.deliver_event(timeout.key, "never", 1)
    t.expect(reached == 0, "the losing event wait was not cancelled by the close")


@check("G-52", requires=("restart",))
async def check_select_survives_a_restart(t: CheckContext) -> None:
    """The select opened before a restart is decided by the event delivered after it;
    ruling R-1: the reopen makes the new incarnation the owner, so a drain pass after the
    reopen takes none of its children for orphans."""
    ctl = await t.ctl()
    select = _select(t, "g")
    await t.open(ctl, select)
    await t.restart()
    ctl = await t.ctl()
    handle = await t.open(ctl, select)
    report = await t.within(ctl.drain().run_pass(), "a drain pass after the reopen")
    t.expect(
        not [ids for ids in report.cancelled if ids[0] == select.key],
        f"a drain cancelled the children of a group its live caller reopened: {report}",
    )
    reached = await ctl.deliver_event(select.key, "go", 1)
    t.expect(reached == 1, f"the event after the reopen settled {reached} children, not 1")
    await t.next_is(ctl, handle, "ev")
    await ctl.close_effect_group(handle)


@check("G-21", "G-51")
async def check_race_against_a_sleep_returns_at_the_deadline(t: CheckContext) -> None:
    """``race([slow tool, sleep(t)])`` settles with the sleep while the tool still runs."""
    ctl = await t.ctl()
    handle = await t.open(
        ctl, t.group("g", [t.step("slow"), t.sleep("nap", 0.05)], wake=WakePolicy.FIRST)
    )
    await t.next_is(ctl, handle, "nap")
    t.expect(t.count("finished", "slow") == 0, "the race waited for the slow tool")


@check("G-14", requires=("unroutable_children",))
async def check_unbound_target_is_a_terminal_404(t: CheckContext) -> None:
    """A child addressed to a handler no deployment binds settles as an error with code
    404, once, and is never retried."""
    ctl = await t.ctl()
    group = t.group("g", [t.unroutable("x"), t.step("ok", gate=False)])
    await t.host.open_unroutable(ctl, group)
    handle = group.handle()
    settled = await t.settled(ctl, handle, 2)
    bad = settled[t.tag("x")].outcome
    t.expect(
        bad.status == "error" and bad.error is not None and bad.error.code == 404,
        f"expected a terminal 404, got {bad}",
    )


@check("G-10", "G-51")
async def check_a_malformed_sleep_refuses_the_first_open(t: CheckContext) -> None:
    """G-10 (a refused open records nothing; the same refusal repeats): a ``sleep`` child
    whose input is not a finite, non-negative number of seconds (negative, a string,
    missing) refuses the whole open with ``InvalidEnvelope`` naming its position and
    replay key; no sibling runs. (An integer beyond the limits, R-8, is refused when the
    envelope is built and never reaches a host.)"""
    ctl = await t.ctl()
    values: list[Any] = [{"seconds": -1}, {"seconds": "soon"}, {}]
    for i, value in enumerate(values):
        bad = EffectEnvelope(
            replay_key=t.tag(f"bad{i}"), kind=EffectKind.SLEEP, name="sleep", input=value
        )
        group = t.group(f"g{i}", [t.step(f"a{i}", gate=False), bad])
        first = await t.refuses(InvalidEnvelope, ctl.open_effect_group(group), "first open")
        t.expect(
            (first.group_key, first.position, first.replay_key) == (group.key, 1, t.tag(f"bad{i}")),
            f"refusal must name the group, position 1 and {t.tag(f'bad{i}')!r}: {first.ids()}",
        )
        second = await t.refuses(InvalidEnvelope, ctl.open_effect_group(group), "second open")
        t.expect(first.ids() == second.ids(), "the second refusal differs: the first recorded")
        t.expect(group.key not in await ctl.open_group_keys(), "the refused group is listed")
        t.expect(t.count("started", f"a{i}") == 0, "a child of a refused group ran")


@check("G-51")
async def check_an_event_reaches_one_group(t: CheckContext) -> None:
    """Ruling R-5: ``deliver_event(key, name, payload)`` settles that group's unsettled
    ``await_event`` children of that name — every one of them — and no other group's, and
    returns how many it settled; an event to a closed group is not refused (R-4's edge,
    R-11: it settles the pending wait of a group not yet retired); a retired key returns
    0; a key never recorded is ``UnknownGroup``, naming ids only (never the payload)."""
    ctl = await t.ctl()
    one = t.group("one", [t.event("e1", "ping"), t.event("e1b", "ping"), t.event("o", "pong")])
    two = t.group("two", [t.event("e2", "ping")])
    second = await t.open(ctl, two)
    first = await t.open(ctl, one)
    reached = await ctl.deliver_event(one.key, "ping", 1)  # right after the open
    t.expect(reached == 2, f"the event must settle both waits of its name, settled {reached}")
    for _ in range(2):
        settlement = await t.next(ctl, first)
        t.expect(settlement.outcome.value == 1, "event payload")
    reached = await ctl.deliver_event(two.key, "ping", 2)
    t.expect(reached == 1, "an event delivered to another group settled this group's wait")
    settlement = await t.next_is(ctl, second, "e2")
    t.expect(settlement.outcome.value == 2, "an event of another group settled this wait")
    never = f"{t.scope}:group:never:0"
    await t.refuses(
        UnknownGroup,
        ctl.deliver_event(never, "ping", INPUT_MARKER),
        "an event to no group",
        names={"group_key": never},
    )
    closed = t.group("closed", [t.event("late", "ping")])
    handle = await t.open(ctl, closed)
    await ctl.close_effect_group(handle)
    reached = await t.within(ctl.deliver_event(closed.key, "ping", 3), "an event to a closed group")
    t.expect(reached == 1, f"an event to a closed group's single wait settled {reached}")
    await ranks_complete(t, ctl, closed.key, 1)
    reached = await t.within(ctl.deliver_event(closed.key, "ping", 4), "an event to a retired key")
    t.expect(reached == 0, f"an event to a retired key settled {reached}")


@check("G-51", "G-17")
async def check_an_event_reaches_a_closed_group_until_it_retires(t: CheckContext) -> None:
    """Ruling R-11 (R-4's edge, R-5): a closed group whose ``await_event`` child is still
    pending has not retired. ``deliver_event`` to it settles that child and returns 1;
    the child takes its rank and the group retires (its replay key is free for a new
    group); after retirement the same delivery returns 0."""
    ctl = await t.ctl()
    closed = t.group(
        "closed", [t.step("win", gate=False), t.event("late", "ping")], wake=WakePolicy.FIRST
    )
    handle = await t.open(ctl, closed)
    await t.next_is(ctl, handle, "win")
    await ctl.close_effect_group(handle)
    reached = await t.within(
        ctl.deliver_event(closed.key, "ping", 1), "an event to a closed, unretired group"
    )
    t.expect(reached == 1, f"an event to a closed group's pending wait settled {reached}, not 1")
    await ranks_complete(t, ctl, closed.key, 2)
    await claims_freed(t, ctl, t.group("heir", [t.event("late", "ping")]))
    reached = await t.within(ctl.deliver_event(closed.key, "ping", 2), "an event to a retired key")
    t.expect(reached == 0, f"an event to a retired group settled {reached} children")


@check("G-15", "G-17")
async def check_a_second_completion_changes_no_rank(t: CheckContext) -> None:
    """Rank n is a durable fact (G-15) and only the first settlement of a child counts
    (G-17): a second completion of a settled child — a duplicate delivery, here a second
    event of its name — takes no rank and leaves rank n's outcome as it was, for every
    reader."""
    ctl = await t.ctl()
    group = t.group("g", [t.event("ev", "ping"), t.event("other", "pong")])
    handle = await t.open(ctl, group)
    saved = handle.copy_cursor()
    await ctl.deliver_event(group.key, "ping", "first")
    first = await t.next_is(ctl, handle, "ev")
    await ctl.deliver_event(group.key, "ping", "second")
    t.expect(await ctl.settlement_order(group.key) == [0], "a second completion took a rank")
    again = await t.next(ctl, saved)
    t.expect(
        again == first,
        f"rank 1 read {again.outcome.value!r} after a second completion, not "
        f"{first.outcome.value!r}",
    )
    await ctl.deliver_event(group.key, "pong", "last")
    await t.next_is(ctl, handle, "other")


@check("G-02")
async def check_replay_keys_are_unique_across_groups(t: CheckContext) -> None:
    """Ruling R-6: opening a group whose child reuses a replay key another recorded group
    holds is ``ReplayMismatch`` and records nothing."""
    ctl = await t.ctl()
    await t.open(ctl, t.group("one", [t.step("shared")]))
    other = t.group("two", [t.step("own", gate=False), t.step("shared")])
    names = {"group_key": other.key, "replay_key": t.tag("shared"), "position": 1}
    refused = ctl.open_effect_group(other)
    await t.refuses(ReplayMismatch, refused, "a replay key of another group", names=names)
    t.expect(other.key not in await ctl.open_group_keys(), "the refused group is listed")
    t.expect(t.count("started", "own") == 0, "a child of the refused group ran")
    t.expect(t.count("started", "shared") <= 1, "the shared child ran twice")


@check("G-10", "G-13")
async def check_concurrent_first_opens_are_one_open(t: CheckContext) -> None:
    """Ruling R-7: several concurrent first opens of one key are one open: each returns
    a handle, every child starts once, and the ranks are one group's."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a"), t.step("b")])
    handles = await t.within(
        asyncio.gather(*(ctl.open_effect_group(group) for _ in range(3))), "concurrent opens"
    )
    t._opened.append(handles[0].copy_cursor())
    await t.started("a")
    await t.started("b")
    t.release("a")
    await t.next_is(ctl, handles[0], "a")
    t.release("b")
    await t.next_is(ctl, handles[1], "a")
    await t.next_is(ctl, handles[0], "b")
    t.expect(t.count("started", "a") == 1 and t.count("started", "b") == 1, "a child ran twice")
