"""Open, settle, consume: G-08…G-22."""

from __future__ import annotations

import asyncio
from typing import Any

from effecthost.contract import (
    CursorExhausted,
    DrainReport,
    ExecutionInput,
    ExecutorConsumed,
    GroupClosed,
    GroupDrain,
    GroupShapeError,
    HandleMismatch,
    LoserPolicy,
    NoExecutor,
    UnknownGroup,
    WakePolicy,
)

from .._context import CheckContext, CheckFailed
from .._registry import check
from .._tools import ConformanceResolver


@check("G-08")
async def check_open_returns_once_recorded(t: CheckContext) -> None:
    """Open returns ``consumed = 0`` while every child is still running, and the group
    is listed as open."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a"), t.step("b")]))
    t.expect(handle.consumed == 0 and handle.child_count == 2, "open must return consumed=0")
    t.expect(handle.group_key in await ctl.open_group_keys(), "opened group not listed")
    await t.started("a")
    await t.started("b")
    t.expect(t.count("finished", "a") + t.count("finished", "b") == 0, "a child finished early")
    t.release("a", "b")
    await t.next(ctl, handle)
    await t.next(ctl, handle)


@check("G-09")
async def check_executors_come_from_the_resolver_and_run_once(t: CheckContext) -> None:
    """Every child runs through an executor of the registered resolver, a distinct one
    per child, and an executor refuses a second run."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a"), t.step("b")]))
    await t.started("a")
    await t.started("b")
    ids = {t.lab.of(t.tag(label))[0].data.get("executor") for label in ("a", "b")}
    t.expect(len(ids) == 2 and None not in ids, "children must get distinct executors")
    t.release("a", "b")
    await t.next(ctl, handle)
    await t.next(ctl, handle)
    envelope = t.step("solo", gate=False)
    executor = ConformanceResolver(t.lab.path).resolve(envelope)
    assert executor is not None
    await executor.execute(ExecutionInput(envelope))
    await t.refuses(ExecutorConsumed, executor.execute(ExecutionInput(envelope)), "second run")


@check("G-10")
async def check_first_open_with_a_miss_records_nothing(t: CheckContext) -> None:
    """A child the resolver cannot run refuses the whole first open with
    ``GroupShapeError`` naming its position and replay key; nothing is recorded, so the
    same open refused twice gives two identical refusals."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False), t.unroutable("x"), t.step("b")])
    first = await t.refuses(GroupShapeError, ctl.open_effect_group(group), "first open")
    t.expect(
        (first.position, first.replay_key, first.group_key) == (1, t.tag("x"), group.key),
        f"refusal must name position 1 and {t.tag('x')!r}, got {first.ids()}",
    )
    second = await t.refuses(GroupShapeError, ctl.open_effect_group(group), "second open")
    t.expect(first.ids() == second.ids(), "the second refusal differs: the first recorded")
    t.expect(group.key not in await ctl.open_group_keys(), "the refused group is listed")
    t.expect(t.count("started", "a") == 0, "a child of a refused group ran")
    await t.refuses(
        UnknownGroup, ctl.await_next_settlement(group.handle()), "await on a refused group"
    )


@check("G-11")
async def check_reopen_refuses_nothing_for_a_miss(t: CheckContext) -> None:
    """A reopen of a recorded group resolves only what it dispatches and refuses nothing
    for a miss — this needs no restart: the resolver now misses a settled child and a
    running one, the reopen succeeds with ``consumed = 0``, the settled rank stays
    readable and the group stays listed."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False), t.step("b")])
    handle = await t.open(ctl, group)
    first = await t.next_is(ctl, handle, "a")
    await t.started("b")
    t.lab.deny(t.tag("a"))
    t.lab.deny(t.tag("b"))
    reopened = await t.within(ctl.open_effect_group(group), "a reopen with resolver misses")
    t.expect(reopened.consumed == 0, "reopen must return consumed=0")
    t.expect(await t.next(ctl, reopened) == first, "the settled rank changed after the reopen")
    t.expect(group.key in await ctl.open_group_keys(), "the group must stay listed")
    t.lab.allow(t.tag("b"))
    t.release("b")
    await t.next_is(ctl, handle, "b")


@check("G-11", "G-09", requires=("restart",))
async def check_reopen_with_a_miss_dispatches_what_it_can(t: CheckContext) -> None:
    """After a restart, a reopen whose resolver misses a child refuses nothing; the
    miss is reported by the drain as ``NoExecutor`` naming ids only (never the child's
    input) and the group stays visible; the other child re-runs through a fresh
    executor."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a"), t.step("b")])
    await t.open(ctl, group)
    await t.started("a")
    await t.started("b")
    first_executor = t.lab.of(t.tag("a"))[0].data.get("executor")
    t.lab.deny(t.tag("b"))
    await t.restart()
    ctl = await t.ctl()
    handle = await t.open(ctl, group)
    t.expect(handle.consumed == 0, "reopen must return consumed=0")
    report = await ctl.drain().run_pass()
    missing = {(e.group_key, e.replay_key, e.position) for e in report.no_executor}
    t.expect(
        (group.key, t.tag("b"), 1) in missing,
        f"drain must report b (position 1) as NoExecutor: {report}",
    )
    for error in report.no_executor:
        t.ids_only(error, "a drain's report of a resolver miss")
    names_its_ids(t, report, group.key)
    t.expect(group.key in await ctl.open_group_keys(), "the group must stay visible")
    await t.started("a", 2)
    again = [e.data.get("executor") for e in t.lab.of(t.tag("a")) if e.kind == "started"]
    t.expect(again[-1] != first_executor, "a retry must resolve a fresh executor")
    t.release("a")
    await t.next_is(ctl, handle, "a")


def names_its_ids(t: CheckContext, report: DrainReport, key: str) -> None:
    """Each ``NoExecutor`` entry of group ``key`` names its group and replay key in its
    message, as every error does (SPEC §7)."""
    for error in report.no_executor:
        if error.group_key == key:
            t.expect(
                key in str(error) and str(error.replay_key) in str(error),
                f"a NoExecutor entry's message does not name its ids: {error}",
            )


@check("G-12")
async def check_unwired_host_still_hands_out_a_drain(t: CheckContext) -> None:
    """A host without a resolver hands out a drain whose pass runs."""
    bare = await t.ctl(wired=False)
    drain = bare.drain()
    t.expect(isinstance(drain, GroupDrain), "drain() must return a GroupDrain")
    report = await asyncio.wait_for(drain.run_pass(), t.timeout)
    t.expect(all(isinstance(e, NoExecutor) for e in report.no_executor), "bad report")


@check("G-12", "G-29", requires=("restart",))
async def check_unwired_drain_reports_every_unfinished_child(t: CheckContext) -> None:
    """After a restart without a resolver, a drain pass reports every unfinished child
    as ``NoExecutor`` — never an empty pass — naming ids only (never the child's input),
    and cancels nothing."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a"), t.step("b"), t.step("c", gate=False)])
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "c")
    await t.started("a")
    await t.started("b")
    await t.restart()
    report = await (await t.ctl(wired=False)).drain().run_pass()
    missing = {(e.replay_key, e.position) for e in report.no_executor if e.group_key == group.key}
    t.expect(
        missing == {(t.tag("a"), 0), (t.tag("b"), 1)},
        f"expected a and b (positions 0 and 1) as NoExecutor: {report}",
    )
    for error in report.no_executor:
        t.ids_only(error, "an unwired drain's report")
    names_its_ids(t, report, group.key)
    t.expect(not report.cancelled and not report.resumed, "an unwired drain acted")


@check("G-15", "G-17")
async def check_a_settled_rank_is_a_durable_fact(t: CheckContext) -> None:
    """Rank n names the same child for every reader: a saved cursor, a reopen, and
    after later settlements append above it."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", result="A"), t.step("b", result="B"), t.step("c")])
    handle = await t.open(ctl, group)
    saved = handle.copy_cursor()
    t.release("c")
    first = await t.next_is(ctl, handle, "c")
    t.release("a")
    second = await t.next_is(ctl, handle, "a")
    t.expect(second.outcome.value == "A", "outcome value lost")
    t.release("b")
    await t.next_is(ctl, handle, "b")
    t.expect(await t.next(ctl, saved) == first, "a saved cursor read another rank 1")
    t.expect(await t.next(ctl, saved) == second, "a saved cursor read another rank 2")
    reopened = await ctl.open_effect_group(group)
    t.expect(reopened.consumed == 0, "reopen must return consumed=0")
    t.expect(await t.next(ctl, reopened) == first, "rank 1 changed after a reopen")


@check("G-15", "G-09", "G-30", requires=("restart",))
async def check_ranks_survive_a_restart(t: CheckContext) -> None:
    """After a restart the open group is still listed before anyone reopens it (G-30:
    open groups are countable); a reopened group with a restored cursor serves the same
    ranks —
    the consumed one and the one settled but not yet consumed, whose child does not run
    again — and the unfinished child re-runs and settles exactly once."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", result=1), t.step("b", result=2), t.step("c", result=3)])
    handle = await t.open(ctl, group)
    t.release("b")
    first = await t.next_is(ctl, handle, "b")
    saved = handle.to_json()
    t.release("c")
    await t.eventually(
        lambda: ctl.settlement_order(group.key), lambda order: len(order) >= 2, "c to settle"
    )
    await t.started("a")
    await t.restart()
    ctl = await t.ctl()
    t.expect(group.key in await ctl.open_group_keys(), "an open group is unlisted by a restart")
    reopened = await t.open(ctl, group)
    t.expect(await t.next(ctl, reopened) == first, "rank 1 changed across a restart")
    restored = type(handle).from_json(saved)
    second = await t.next_is(ctl, restored, "c")
    t.expect(second.outcome.value == 3, "c's outcome lost")
    t.expect(t.count("started", "c") == 1, "a child settled before the restart ran again")
    await t.started("a", 2)
    t.release("a")
    third = await t.next_is(ctl, restored, "a")
    t.expect(third.outcome.value == 1, "a's outcome lost")
    await t.refuses(CursorExhausted, ctl.await_next_settlement(restored), "past the end")


@check("G-16", "G-17", "G-18")
async def check_settlements_are_served_by_rank(t: CheckContext) -> None:
    """Children settling in an order unrelated to their positions are served as ranks
    1…n, each exactly ``consumed + 1``, whatever sequence numbers the host uses."""
    ctl = await t.ctl()
    labels = ["p0", "p1", "p2", "p3", "p4"]
    handle = await t.open(ctl, t.group("g", [t.step(label) for label in labels]))
    for label in ["p3", "p0", "p4", "p1", "p2"]:
        t.release(label)
        await t.next_is(ctl, handle, label)
    t.expect(handle.exhausted, "all five ranks consumed")


@check("G-17", "G-26", "G-30")
async def check_retirement_is_whole(t: CheckContext) -> None:
    """Once closed, a group leaves the open keys; a restored cursor is then refused with
    ``GroupClosed`` (ruling R-4: a closed group is never served again) — never another
    child, never the same rank served again."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False), t.step("b", gate=False)])
    handle = await t.open(ctl, group)
    await t.next(ctl, handle)
    saved = group.handle()
    await t.next(ctl, handle)
    await ctl.close_effect_group(handle)
    t.expect(group.key not in await ctl.open_group_keys(), "a closed group is listed")
    await t.refuses(
        GroupClosed,
        ctl.await_next_settlement(saved),
        "reading a closed group",
        names={"group_key": group.key},
    )
    t.expect(saved.consumed == 0, "a refused read moved the cursor")


@check("G-18")
async def check_the_handle_is_the_only_cursor(t: CheckContext) -> None:
    """Copies of a handle advance independently (a copy still at 0 reads rank 1 after the
    original read it: the host keeps no cursor of its own); one caller can await many
    groups at once without interference; a reopen returns ``consumed = 0``."""
    ctl = await t.ctl()
    groups = [t.group(f"g{i}", [t.step(f"g{i}a"), t.step(f"g{i}b")]) for i in range(3)]
    handles = [await t.open(ctl, group) for group in groups]
    copies = [h.copy_cursor() for h in handles]
    waits = [asyncio.ensure_future(t.next(ctl, h)) for h in handles]
    for i in (2, 0, 1):
        t.release(f"g{i}b")
    results = await asyncio.gather(*waits)
    for i, settlement in enumerate(results):
        t.expect(settlement.replay_key == t.tag(f"g{i}b"), f"group {i} got another group's rank")
    for i in range(3):
        t.expect(copies[i].consumed == 0, "a copy of a handle was advanced")
        again = await t.next(ctl, copies[i])
        t.expect(again == results[i], "a copy read another rank 1")
        t.release(f"g{i}a")
        await t.next_is(ctl, handles[i], f"g{i}a")
    reopened = await ctl.open_effect_group(groups[0])
    t.expect(reopened.consumed == 0, "reopen must return consumed=0")


@check("G-19")
async def check_cancelling_an_await_changes_nothing(t: CheckContext) -> None:
    """Cancelling the awaiting task leaves the handle and the ranks as they were."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a"), t.step("b")]))
    waiter = asyncio.ensure_future(ctl.await_next_settlement(handle))
    await t.started("a")
    await t.started("b")
    waiter.cancel()
    try:
        await waiter
    except asyncio.CancelledError:
        pass
    t.expect(handle.consumed == 0, "a cancelled await moved the cursor")
    t.release("b")
    await t.next_is(ctl, handle, "b")
    t.release("a")
    await t.next_is(ctl, handle, "a")


@check("G-19", requires=("waiter_probe",))
async def check_cancelling_a_parked_await_changes_nothing(t: CheckContext) -> None:
    """Cancelling an await while it is parked inside the host (an engine's waiting request
    in flight) raises ``CancelledError`` in the awaiting task and leaves the handle and the
    ranks as they were."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a"), t.step("b")])
    handle = await t.open(ctl, group)
    waiter = asyncio.ensure_future(ctl.await_next_settlement(handle))
    await t.started("a")
    await t.started("b")
    await t.eventually(
        lambda: t.host.awaiting(group.key, 1), bool, "the await of rank 1 to be parked"
    )
    t.expect(not waiter.done(), "the await finished before any child settled")
    waiter.cancel()
    try:
        await t.within(waiter, "the cancelled await")
    except asyncio.CancelledError:
        pass
    except Exception as exc:
        raise CheckFailed(
            f"a cancelled await raised {type(exc).__name__}, not CancelledError"
        ) from None
    else:
        raise CheckFailed("a cancelled await returned a settlement")
    t.expect(handle.consumed == 0, "a cancelled await moved the cursor")
    t.release("b")
    await t.next_is(ctl, handle, "b")
    t.release("a")
    await t.next_is(ctl, handle, "a")


@check("G-20")
async def check_both_sides_of_the_cursor_are_fenced(t: CheckContext) -> None:
    """Past the last child is ``CursorExhausted`` (never clamped); a handle whose child
    count, wake or disposition disagrees with the record is ``HandleMismatch``, on await
    and on close; a foreign key is ``UnknownGroup``; none of them moves the cursor or the
    record."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False), t.step("b", gate=False)])
    handle = await t.open(ctl, group)
    first = await t.next(ctl, handle)
    liars: dict[str, dict[str, Any]] = {
        "3 children": {"child_count": 3},
        "1 child": {"child_count": 1},
        "another wake": {"wake": WakePolicy.FIRST},
        "another disposition": {"disposition": LoserPolicy.CANCEL},
    }
    for what, update in liars.items():
        liar = handle.model_copy(update={**update, "consumed": 0})
        await t.refuses(
            HandleMismatch,
            ctl.await_next_settlement(liar),
            f"an await with {what}",
            names={"group_key": group.key},
        )
        t.expect(liar.consumed == 0, "a refused handle was advanced")
        await t.refuses(
            HandleMismatch,
            ctl.close_effect_group(liar, LoserPolicy.CANCEL),
            f"a close with {what}",
            names={"group_key": group.key},
        )
    t.expect(group.key in await ctl.open_group_keys(), "a refused close closed the group")
    foreign = handle.model_copy(update={"group_key": f"{t.scope}:group:never:0"})
    await t.refuses(
        UnknownGroup,
        ctl.await_next_settlement(foreign),
        "a foreign group key",
        names={"group_key": foreign.group_key},
    )
    await t.next(ctl, handle)
    await t.refuses(
        CursorExhausted,
        ctl.await_next_settlement(handle),
        "past the end",
        names={"group_key": group.key, "rank": 3},
    )
    t.expect(handle.consumed == 2, "an exhausted handle was moved")
    t.expect(await t.next(ctl, group.handle()) == first, "refusals changed the record")


@check("G-21")
async def check_the_first_settlement_wakes_the_waiter(t: CheckContext) -> None:
    """A waiter wakes when rank ``consumed + 1`` exists, while other children still run."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("slow"), t.step("fast")]))
    waiter = asyncio.ensure_future(t.next(ctl, handle))
    await t.started("slow")
    t.release("fast")
    settlement = await waiter
    t.expect(settlement.replay_key == t.tag("fast"), "rank 1 must be the first to settle")
    t.expect(t.count("finished", "slow") == 0, "the waiter waited for the slow child")


@check("G-22")
async def check_settlement_order_projects_ranks(t: CheckContext) -> None:
    """``settlement_order`` lists positions in rank order — also once the group is closed,
    until it retires (a loser's late settlement is appended, nothing is reordered); once
    retired the key is unknown to it, as a key never recorded is."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a"), t.step("b"), t.step("c")]))
    key = handle.group_key
    t.release("c")
    await t.next_is(ctl, handle, "c")
    t.release("a")
    await t.next_is(ctl, handle, "a")
    t.expect(await ctl.settlement_order(key) == [2, 0], "order must be [2, 0]")
    await ctl.close_effect_group(handle)
    t.expect(await ctl.settlement_order(key) == [2, 0], "a close changed the order of a group")
    t.release("b")
    await t.finished("b")

    async def order() -> list[int] | None:
        try:
            return await ctl.settlement_order(key)
        except UnknownGroup:
            return None

    seen = await t.eventually(order, lambda found: found != [2, 0], "the loser to take rank 3")
    t.expect(seen in ([2, 0, 1], None), f"a closed group's order became {seen}, not [2, 0, 1]")
    await t.eventually(order, lambda found: found is None, "the retired group's order to go")
