"""Close, losers and the drain: G-26…G-30."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from effecthost.contract import (
    DispositionWidened,
    EffectController,
    EffectGroup,
    GroupClosed,
    GroupHandle,
    HandleMismatch,
    LoserPolicy,
    ReplayMismatch,
    UnknownGroup,
    WakePolicy,
)

from .._context import CheckContext
from .._registry import check

PARKED = "an await parked when its group closed"


async def closed_under_a_parked_await(t: CheckContext) -> asyncio.Future[Any]:
    """Opens group ``g`` of one gated child ``a``, parks an await of rank 1 on it (seen
    parked where the host can tell) and closes the group; returns the parked await."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a")])
    handle = await t.open(ctl, group)
    waiter = asyncio.ensure_future(ctl.await_next_settlement(handle.copy_cursor()))
    await t.started("a")
    if t.host.capabilities.waiter_probe:
        await t.eventually(
            lambda: t.host.awaiting(group.key, 1), bool, "the await of rank 1 to be parked"
        )
    await ctl.close_effect_group(handle)
    return waiter


async def ranks_complete(
    t: CheckContext, ctl: EffectController, key: str, count: int, served: Sequence[int] = ()
) -> None:
    """Wait until ``count`` children of ``key`` have taken a rank, or the group retired
    (a closed group is not served, G-22's projection still shows its ranks until it
    retires): every child of a closed group still settles and ranks (G-27, G-28). Every
    read must be a projection of ranks: distinct positions of the group, each read
    extending the one before, starting with ``served`` (the positions the caller was
    served, in rank order)."""
    last: list[int] = list(served)

    async def ranked() -> int:
        nonlocal last
        try:
            order = await ctl.settlement_order(key)
        except UnknownGroup:
            return count
        t.expect(
            len(set(order)) == len(order) and all(0 <= p < count for p in order),
            f"the order of {key!r} is no projection of ranks of {count} children: {order}",
        )
        t.expect(
            order[: len(last)] == last,
            f"the order of {key!r} went from {last} to {order}: a rank moved",
        )
        last = list(order)
        return len(order)

    await t.eventually(ranked, lambda n: n >= count, f"every child of {key!r} to take a rank")


async def closes_promptly(
    t: CheckContext,
    ctl: EffectController,
    handle: GroupHandle,
    disposition: LoserPolicy | None = None,
) -> None:
    """A close that cancels losers returns once the cancels are asked for, without waiting
    for any loser to stop or settle (G-27): bounded by one settlement's timeout, not by
    the whole check's."""
    await t.within(
        ctl.close_effect_group(handle, disposition),
        "a CANCEL close (it must not wait for its losers, G-27)",
    )


async def claims_freed(t: CheckContext, ctl: EffectController, heir: EffectGroup) -> GroupHandle:
    """Open ``heir``, a group reusing replay keys of a closed group, once that group has
    retired and its claims are gone (R-11); until then the open is ``ReplayMismatch``
    (R-6) and records nothing, so it is retried until the check's timeout."""

    async def claim() -> GroupHandle | None:
        try:
            return await asyncio.wait_for(ctl.open_effect_group(heir), t.timeout)
        except ReplayMismatch:
            return None

    handle = await t.eventually(
        claim, lambda opened: opened is not None, f"the replay keys of {heir.key!r} to be free"
    )
    assert handle is not None
    t.remember(handle)
    return handle


@check("G-26")
async def check_close_is_idempotent(t: CheckContext) -> None:
    """A second close, and a close from a restored handle, are harmless."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a", gate=False), t.step("b")]))
    await t.next_is(ctl, handle, "a")
    restored = GroupHandle.from_json(handle.to_json())
    await ctl.close_effect_group(handle)
    await ctl.close_effect_group(handle)
    await ctl.close_effect_group(restored)
    t.expect(handle.group_key not in await ctl.open_group_keys(), "a closed group is listed")
    t.expect(t.count("cancelled", "b") == 0, "a RUN_TO_COMPLETION close cancelled a loser")


@check("G-26")
async def check_close_only_narrows(t: CheckContext) -> None:
    """``CANCEL`` cannot be widened (``DispositionWidened``, nothing changes), also not
    by ``close(handle, None)`` (ruling R-3: it keeps the disposition in force);
    ``RUN_TO_COMPLETION`` can be narrowed to ``CANCEL`` at close, and a close replayed
    from the handle saved before that narrowing is harmless (the handle is compared with
    the declared disposition, not the narrowed one)."""
    ctl = await t.ctl()
    strict = await t.open(ctl, t.group("strict", [t.step("s")], disposition=LoserPolicy.CANCEL))
    await t.started("s")
    await t.refuses(
        DispositionWidened,
        ctl.close_effect_group(strict, LoserPolicy.RUN_TO_COMPLETION),
        "widening CANCEL",
        names={"group_key": strict.group_key},
    )
    t.expect(strict.group_key in await ctl.open_group_keys(), "a refused close closed the group")
    t.expect(t.count("cancelled", "s") == 0, "a refused close cancelled a child")
    await ctl.close_effect_group(strict)
    await t.cancelled("s")
    await ctl.close_effect_group(strict, LoserPolicy.CANCEL)

    loose = await t.open(ctl, t.group("loose", [t.step("l", hold_cancel=True)]))
    saved = loose.copy_cursor()
    await t.started("l")
    await ctl.close_effect_group(loose, LoserPolicy.CANCEL)
    await t.cancelled("l")
    await t.within(ctl.close_effect_group(saved), "a close replayed from the saved handle")
    t.lab.open(f"{t.tag('l')}/release")


@check("G-27")
async def check_cancel_close_does_not_wait_for_losers(t: CheckContext) -> None:
    """Under ``CANCEL`` the close returns while the loser is still winding down; the
    cancel reaches the loser, and the cancelled loser still takes a rank."""
    ctl = await t.ctl()
    group = t.group(
        "g",
        [t.step("win", gate=False), t.step("lose", hold_cancel=True)],
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "win")
    await t.started("lose")
    await closes_promptly(t, ctl, handle)
    t.expect(group.key not in await ctl.open_group_keys(), "a closed group is listed")
    await t.cancelled("lose")
    t.expect(t.count("finished", "lose") == 0, "the loser finished instead of being cancelled")
    t.lab.open(f"{t.tag('lose')}/release")
    await ranks_complete(t, ctl, group.key, 2, served=[0])


@check("G-27")
async def check_cancel_close_right_after_open_ranks_every_child(t: CheckContext) -> None:
    """A ``CANCEL`` close straight after the open, before any child could start (an
    outer cancellation closes there, R-9), still gives every child its terminal and a
    rank, and the group retires; no child finishes its work."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a"), t.step("b")], disposition=LoserPolicy.CANCEL)
    async with asyncio.timeout(t.timeout):  # no task of its own: nothing else runs between
        handle = await ctl.open_effect_group(group)
        t.remember(handle)
        await ctl.close_effect_group(handle)  # promptly: within the one settlement's timeout
    t.expect(group.key not in await ctl.open_group_keys(), "a closed group is listed")
    await ranks_complete(t, ctl, group.key, 2)
    t.expect(t.count("finished", "a") + t.count("finished", "b") == 0, "a cancelled child finished")
    t.release("a", "b")


@check("G-27")
async def check_cancel_close_cancels_only_its_own_losers(t: CheckContext) -> None:
    """A ``CANCEL`` close cancels the unsettled children of the group it closes, and no
    other: a child of another open group, running meanwhile, runs on and settles."""
    ctl = await t.ctl()
    other = await t.open(ctl, t.group("other", [t.step("bystander")]))
    closed = await t.open(ctl, t.group("closed", [t.step("loser")], disposition=LoserPolicy.CANCEL))
    await t.started("bystander")
    await t.started("loser")
    await closes_promptly(t, ctl, closed)
    await t.cancelled("loser")
    t.release("bystander")
    settlement = await t.next_is(ctl, other, "bystander")
    t.expect(settlement.outcome.ok, f"another group's child was {settlement.outcome.status}")
    t.expect(t.count("cancelled", "bystander") == 0, "a close cancelled another group's child")


@check("G-28")
async def check_run_to_completion_losers_finish_after_close(t: CheckContext) -> None:
    """Under ``RUN_TO_COMPLETION`` a loser keeps running after the caller closed,
    finishes under the host's ownership, and its settlement takes a rank."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("win", gate=False), t.step("lose")]))
    await t.next_is(ctl, handle, "win")
    await ctl.close_effect_group(handle)
    await t.started("lose")
    t.release("lose")
    await t.finished("lose")
    t.expect(t.count("cancelled", "lose") == 0, "a RUN_TO_COMPLETION loser was cancelled")
    await ranks_complete(t, ctl, handle.group_key, 2)


@check("G-17", "G-28", "G-36")
async def check_a_closed_groups_replay_keys_stay_claimed_until_it_retires(
    t: CheckContext,
) -> None:
    """Ruling R-11: a closed group retires only once every child has settled (G-36), and
    then it does retire: its claims go. While its
    ``RUN_TO_COMPLETION`` loser still runs, a new group reusing one of its replay keys is
    ``ReplayMismatch`` naming the closed group (R-6) and records nothing; once the loser
    settled and the group retired, its replay keys are free for a new group."""
    ctl = await t.ctl()
    closed = t.group("closed", [t.step("win", gate=False), t.step("lose")], wake=WakePolicy.FIRST)
    handle = await t.open(ctl, closed)
    await t.next_is(ctl, handle, "win")
    await t.started("lose")
    await ctl.close_effect_group(handle)
    for label in ("win", "lose"):
        thief = t.group(f"thief-{label}", [t.step(f"own-{label}", gate=False), t.step(label)])
        error = await t.refuses(
            ReplayMismatch,
            ctl.open_effect_group(thief),
            f"reusing replay key {label!r} of a closed group whose loser still runs",
            names={"group_key": thief.key, "replay_key": t.tag(label), "position": 1},
        )
        t.expect(
            closed.key in str(error),
            f"the refusal must name the closed group {closed.key!r}: {error}",
        )
        t.expect(t.count("started", f"own-{label}") == 0, "a child of a refused group ran")
    t.expect(t.count("finished", "lose") == 0, "the loser finished before it was released")
    t.release("lose")
    await t.finished("lose")
    await claims_freed(t, ctl, t.group("heir", [t.step("win", gate=False), t.step("lose")]))
    await t.started("lose", 2)  # the heir's child runs: not deduplicated onto the old one


@check("G-28", "G-29", requires=("restart",))
async def check_drain_finishes_losers_of_a_gone_caller(t: CheckContext) -> None:
    """The caller closes under ``RUN_TO_COMPLETION`` and its process dies: after the
    restart the drain (or the engine) finishes the loser."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("win", gate=False), t.step("lose")]))
    await t.next_is(ctl, handle, "win")
    await ctl.close_effect_group(handle)
    await t.started("lose")
    await t.restart()
    ctl = await t.ctl()
    t.release("lose")
    await ctl.drain().run_pass()
    await t.finished("lose")
    t.expect(t.count("cancelled", "lose") == 0, "a RUN_TO_COMPLETION loser was cancelled")


@check("G-29", requires=("restart",))
async def check_drain_applies_a_declared_cancel(t: CheckContext) -> None:
    """A ``CANCEL`` group whose caller died before closing: the drain reads the declared
    disposition and cancels the unfinished children; they rank as cancelled."""
    ctl = await t.ctl()
    group = t.group(
        "g", [t.step("a"), t.step("b"), t.step("c", gate=False)], disposition=LoserPolicy.CANCEL
    )
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "c")
    saved = handle.to_json()
    await t.started("a")
    await t.started("b")
    await t.restart()
    ctl = await t.ctl()
    report = await t.within(ctl.drain().run_pass(), "a drain pass")
    cancelled = {(group.key, t.tag(x)) for x in ("a", "b")}
    t.expect(
        cancelled <= set(report.cancelled),
        f"the drain pass must report the children it cancelled: {report}",
    )
    reopened = await t.open(ctl, group)
    restored = GroupHandle.from_json(saved)
    t.expect(reopened.consumed == 0, "reopen must return consumed=0")
    for _ in range(2):
        settlement = await t.next(ctl, restored)
        t.expect(
            settlement.outcome.status == "cancelled",
            f"rank {settlement.rank} should be cancelled by the drain, got "
            f"{settlement.outcome.status}",
        )
    t.expect(t.count("finished", "a") + t.count("finished", "b") == 0, "a loser ran on")


@check("G-29", requires=("restart",))
async def check_drain_applies_a_narrowed_cancel(t: CheckContext) -> None:
    """The drain applies the disposition in force, not the declared one: a
    ``RUN_TO_COMPLETION`` group a close narrowed to ``CANCEL`` (G-26), whose loser was
    still winding down when the process died, has that loser cancelled, never resumed,
    and every child ranks."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("win", gate=False), t.step("lose", hold_cancel=True)])
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "win")
    await t.started("lose")
    await closes_promptly(t, ctl, handle, LoserPolicy.CANCEL)
    await t.cancelled("lose")
    await t.restart()
    ctl = await t.ctl()
    report = await t.within(ctl.drain().run_pass(), "a drain pass")
    t.expect(
        (group.key, t.tag("lose")) not in report.resumed,
        f"the drain resumed a loser of a group narrowed to CANCEL: {report}",
    )
    t.lab.open(f"{t.tag('lose')}/release")
    await ranks_complete(t, ctl, group.key, 2)


@check("G-30")
async def check_open_group_keys_are_inspectable(t: CheckContext) -> None:
    """Open groups are listed until closed — also once every child settled; nothing
    expires them."""
    ctl = await t.ctl()
    one = await t.open(ctl, t.group("one", [t.step("a")]))
    two = await t.open(ctl, t.group("two", [t.step("b")]))
    done = await t.open(ctl, t.group("done", [t.step("c", gate=False)]))
    await t.next_is(ctl, done, "c")
    keys = await ctl.open_group_keys()
    t.expect({one.group_key, two.group_key} <= set(keys), "open groups must be listed")
    t.expect(done.group_key in keys, "a group whose children all settled left before its close")
    await ctl.close_effect_group(one, LoserPolicy.CANCEL)
    keys = await ctl.open_group_keys()
    t.expect(one.group_key not in keys and two.group_key in keys, "close must unlist only it")


@check("G-26", "G-17")
async def check_a_closed_key_stays_closed(t: CheckContext) -> None:
    """Ruling R-4 (and R-2's order): a closed group's key keeps a tombstone. Every later
    open of it (the same group, another shape, other inputs) and every await is
    ``GroupClosed`` — while a loser still runs (not retired yet) and once every child
    has settled (retired); a later close is a no-op; nothing runs again."""
    ctl = await t.ctl()
    running = t.group("running", [t.step("win", gate=False), t.step("lose")])
    settled = t.group("settled", [t.step("done", gate=False)])
    handles = [await t.open(ctl, running), await t.open(ctl, settled)]
    await t.next_is(ctl, handles[0], "win")
    await t.next_is(ctl, handles[1], "done")
    await t.started("lose")
    for handle in handles:
        await ctl.close_effect_group(handle)
    reopens = {
        "running": [
            running,
            t.group("running", [t.step("win", gate=False)]),
            t.group("running", [t.step("win", gate=False, result=1), t.step("lose")]),
        ],
        "settled": [
            settled,
            t.group("settled", [t.step("done", gate=False), t.step("more")]),
            t.group("settled", [t.step("done", gate=False, result=1)]),
        ],
    }
    for (label, groups), handle in zip(reopens.items(), handles, strict=True):
        phase = "a closed group a loser still runs in" if label == "running" else "a retired group"
        for group in groups:
            await t.refuses(
                GroupClosed,
                ctl.open_effect_group(group),
                f"reopen of {phase}",
                names={"group_key": group.key},
            )
        for cursor in (handle.copy_cursor(), groups[0].handle()):
            await t.refuses(
                GroupClosed,
                ctl.await_next_settlement(cursor),
                f"await on {phase}",
                names={"group_key": cursor.group_key},
            )
        await ctl.close_effect_group(handle)
        t.expect(handle.group_key not in await ctl.open_group_keys(), f"{phase} is listed")
    t.release("lose")
    await t.finished("lose")
    for label in ("win", "lose", "done"):
        t.expect(t.count("started", label) == 1, f"{label} ran again after its group closed")
    t.expect(t.count("started", "more") == 0, "a refused reopen ran a child")


@check("G-26")
async def check_a_close_of_a_closed_group_is_a_no_op(t: CheckContext) -> None:
    """Rulings R-4 and R-2, G-26's edge: "a close of a closed or retired group is a
    no-op", whatever disposition it asks for. A widening close of a closed ``CANCEL``
    group (a loser still holding its cancel, then retired) is not refused, and a late
    ``CANCEL`` close of a closed ``RUN_TO_COMPLETION`` group cancels nothing."""
    ctl = await t.ctl()
    strict = await t.open(
        ctl,
        t.group(
            "strict",
            [t.step("won", gate=False), t.step("held", hold_cancel=True)],
            disposition=LoserPolicy.CANCEL,
        ),
    )
    await t.next_is(ctl, strict, "won")
    await t.started("held")
    await closes_promptly(t, ctl, strict)
    await t.cancelled("held")
    await t.within(
        ctl.close_effect_group(strict, LoserPolicy.RUN_TO_COMPLETION),
        "a widening close of a closed group a loser still runs in",
    )
    t.lab.open(f"{t.tag('held')}/release")
    await ranks_complete(t, ctl, strict.group_key, 2, served=[0])
    await t.within(
        ctl.close_effect_group(strict, LoserPolicy.RUN_TO_COMPLETION),
        "a widening close of a retired group",
    )
    t.expect(strict.group_key not in await ctl.open_group_keys(), "a late close relisted it")

    loose = await t.open(ctl, t.group("loose", [t.step("runs")]))
    await t.started("runs")
    await ctl.close_effect_group(loose)
    await t.within(
        ctl.close_effect_group(loose, LoserPolicy.CANCEL), "a late CANCEL close of a closed group"
    )
    t.release("runs")
    await t.finished("runs")
    t.expect(t.count("cancelled", "runs") == 0, "a close of a closed group cancelled a loser")
    t.expect(t.count("started", "held") == 1, "a late close re-ran a child")


@check("G-21", "G-26")
async def check_a_waiter_wakes_when_its_group_closes(t: CheckContext) -> None:
    """Ruling R-4: a waiter parked on a group when it is closed wakes with
    ``GroupClosed`` (the close wakes it; it does not sleep until a loser settles)."""
    await t.refuses(GroupClosed, await closed_under_a_parked_await(t), PARKED)
    t.release("a")
    await t.finished("a")


@check("G-20", "G-26")
async def check_refusals_come_in_the_ruled_order(t: CheckContext) -> None:
    """Ruling R-2: on await, ``GroupClosed`` before ``HandleMismatch`` before
    ``CursorExhausted``; on close, ``HandleMismatch`` before ``DispositionWidened``."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False)], disposition=LoserPolicy.CANCEL)
    handle = await t.open(ctl, group)
    await t.next(ctl, handle)
    liar = handle.model_copy(update={"wake": WakePolicy.FIRST})
    await t.refuses(
        HandleMismatch,
        ctl.await_next_settlement(liar),
        "an exhausted, mismatched handle",
        names={"group_key": group.key},
    )
    await t.refuses(
        HandleMismatch,
        ctl.close_effect_group(liar, LoserPolicy.RUN_TO_COMPLETION),
        "a widening close with a mismatched handle",
        names={"group_key": group.key},
    )
    await ctl.close_effect_group(handle)
    running = t.group("h", [t.step("b")])
    other = await t.open(ctl, running)
    await t.started("b")
    await ctl.close_effect_group(other)
    for cursor in (other.model_copy(update={"wake": WakePolicy.FIRST}), handle):
        await t.refuses(
            GroupClosed,
            ctl.await_next_settlement(cursor),
            "an await of a closed group",
            names={"group_key": cursor.group_key},
        )
    t.release("b")
    await t.finished("b")


@check("G-29")
async def check_a_drain_never_touches_a_live_owners_group(t: CheckContext) -> None:
    """Ruling R-1: a drain pass beside the live owner of a ``CANCEL`` group — a tool
    call, an event wait and a timer, all unsettled — cancels, resumes and reports none of
    its children: the event still decides the select."""
    await drain_beside_a_live_owner(t, other_process=False)


async def drain_beside_a_live_owner(t: CheckContext, *, other_process: bool) -> None:
    """R-1 seen from a drain pass of the owner's own controller or of another live
    process (the unwired controller): it leaves every child of the owner's ``CANCEL``
    group alone, so the event decides the select and the tool call runs to its end."""
    who = "another process" if other_process else "the drain"
    ctl = await t.ctl()
    group = t.group(
        "g",
        [t.step("tool"), t.event("ev", "go"), t.sleep("nap", 60.0)],
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, group)
    await t.started("tool")
    drainer = await t.ctl(wired=False) if other_process else ctl
    report = await t.within(drainer.drain().run_pass(), f"a drain pass of {who}")
    touched = {
        "resumed": [ids[1] for ids in report.resumed if ids[0] == group.key],
        "cancelled": [ids[1] for ids in report.cancelled if ids[0] == group.key],
        "no_executor": [e.replay_key for e in report.no_executor if e.group_key == group.key],
    }
    t.expect(not any(touched.values()), f"{who} touched a live owner's children: {touched}")
    t.expect(await ctl.deliver_event(group.key, "go", "won") == 1, "the event wait was settled")
    first = await t.next_is(ctl, handle, "ev")
    t.expect(first.outcome.value == "won", f"the event lost the select to {who}")
    # the tool call runs to its end: a cancel from the drain, however late its report,
    # would have stopped it
    t.release("tool")
    await t.finished("tool")
    t.expect(t.count("cancelled", "tool") == 0, f"{who} cancelled the live tool call")
