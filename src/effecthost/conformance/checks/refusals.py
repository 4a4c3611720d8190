"""Refusals name the ids they are about (§7: errors carry ids, never payload bytes).

The other checks establish *which* error a call raises; these read the ids it carries,
one rule each: a caller (or an operator reading a log) must be able to tell from the
error alone which group, child or position was refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from effecthost.contract import (
    EffectController,
    EffectGroup,
    EffectGroupUnsupported,
    GroupClosed,
    GroupHandle,
    HandleMismatch,
    InvalidEnvelope,
    ReplayMismatch,
    SealedPayloadUnreadable,
    UnknownGroup,
    WakePolicy,
)

from .._context import CheckContext
from .._registry import check
from .closing import PARKED, closed_under_a_parked_await


async def refused_unwired(
    t: CheckContext, group: EffectGroup, calls: dict[str, Callable[[], Awaitable[Any]]]
) -> None:
    """Each of ``calls`` (an unwired controller's group methods on ``group``, by what they
    are) refuses with ``EffectGroupUnsupported`` naming the group key, and none of them
    records the group or runs its child ``a``."""
    for what, call in calls.items():
        await t.refuses(EffectGroupUnsupported, call(), what, names={"group_key": group.key})
    wired = await t.ctl()
    t.expect(group.key not in await wired.open_group_keys(), "an unwired call recorded the group")
    t.expect(t.count("started", "a") == 0, "an unwired open ran a child")


async def refused_nonsense_disposition(
    t: CheckContext, ctl: EffectController, handle: GroupHandle
) -> None:
    """A close of ``handle`` asking for a disposition that is no loser policy is
    ``InvalidEnvelope`` naming the group, and leaves the group open."""
    await t.refuses(
        InvalidEnvelope,
        ctl.close_effect_group(handle, "sideways"),  # type: ignore[arg-type]
        "a close with a disposition that is no LoserPolicy",
        names={"group_key": handle.group_key},
    )
    t.expect(handle.group_key in await ctl.open_group_keys(), "a refused close closed the group")


@check("G-07")
async def check_an_unwired_refusal_names_its_group(t: CheckContext) -> None:
    """G-07 (§7): every group method of a controller with no resolver — open, await,
    close, ``settlement_order`` and ``deliver_event`` — refuses with
    ``EffectGroupUnsupported`` carrying the group key it was given, and records nothing."""
    bare = await t.ctl(wired=False)
    group = t.group("g", [t.step("a", gate=False)])
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "an unwired open": lambda: bare.open_effect_group(group),
        "an unwired await": lambda: bare.await_next_settlement(group.handle()),
        "an unwired close": lambda: bare.close_effect_group(group.handle()),
        "an unwired settlement_order": lambda: bare.settlement_order(group.key),
        "an unwired deliver_event": lambda: bare.deliver_event(group.key, "ping", 1),
    }
    await refused_unwired(t, group, calls)


@check("G-20")
async def check_a_handle_refusal_names_its_group(t: CheckContext) -> None:
    """G-20 (§7): a handle that claims another shape than its recorded group is
    ``HandleMismatch`` carrying the group key, on an await and on a close (which then
    closes nothing); an await of a key no group was recorded under is ``UnknownGroup``
    carrying that key."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a")])
    handle = await t.open(ctl, group)
    liar = handle.model_copy(update={"wake": WakePolicy.FIRST})
    names = {"group_key": group.key}
    await t.refuses(
        HandleMismatch,
        ctl.await_next_settlement(liar),
        "an await of a mismatched handle",
        names=names,
    )
    await t.refuses(
        HandleMismatch, ctl.close_effect_group(liar), "a close of a mismatched handle", names=names
    )
    t.expect(group.key in await ctl.open_group_keys(), "a refused close closed the group")
    never = t.group("never", [t.step("b")])
    await t.refuses(
        UnknownGroup,
        ctl.await_next_settlement(never.handle()),
        "an await of a key never recorded",
        names={"group_key": never.key},
    )
    t.release("a")
    await t.next_is(ctl, handle, "a")


@check("G-22")
async def check_settlement_order_of_an_unknown_key_names_it(t: CheckContext) -> None:
    """G-22 (§7): ``settlement_order`` of a key no group was recorded under is
    ``UnknownGroup`` carrying that key, not an empty order."""
    ctl = await t.ctl()
    key = t.key("never")
    await t.refuses(
        UnknownGroup,
        ctl.settlement_order(key),
        "the order of an unknown key",
        names={"group_key": key},
    )


@check("G-51")
async def check_an_event_for_an_unknown_group_names_it(t: CheckContext) -> None:
    """Ruling R-5 (§7): an event is scoped to one group; ``deliver_event`` to a key no
    group was recorded under is ``UnknownGroup`` carrying that key, and the same event
    name in a recorded group stays pending."""
    ctl = await t.ctl()
    group = t.group("g", [t.event("e", "ping")], wake=WakePolicy.FIRST)
    handle = await t.open(ctl, group)
    never = t.key("never")
    await t.refuses(
        UnknownGroup,
        ctl.deliver_event(never, "ping", 1),
        "an event to an unknown key",
        names={"group_key": never},
    )
    t.expect(await ctl.settlement_order(group.key) == [], "an event to another key settled a child")
    t.expect(await ctl.deliver_event(group.key, "ping", 2) == 1, "the pending wait was not settled")
    settlement = await t.next_is(ctl, handle, "e")
    t.expect(settlement.outcome.value == 2, f"the wait settled with {settlement.outcome.value!r}")


@check("G-26")
async def check_a_waiter_woken_by_a_close_is_told_which_group(t: CheckContext) -> None:
    """Ruling R-4 (§7): an await parked on a group when a close arrives wakes with
    ``GroupClosed`` carrying the group's key."""
    waiter = await closed_under_a_parked_await(t)
    await t.refuses(GroupClosed, waiter, PARKED, names={"group_key": t.key("g")})
    t.release("a")
    await t.finished("a")


@check("G-02")
async def check_a_taken_replay_key_is_refused_at_its_position(t: CheckContext) -> None:
    """Ruling R-6 (§7): the ``ReplayMismatch`` of an open whose child reuses a replay key
    another recorded group holds carries the refused group's key, the replay key and that
    child's position in the refused group."""
    ctl = await t.ctl()
    await t.open(ctl, t.group("one", [t.step("shared")]))
    other = t.group(
        "two", [t.step("own", gate=False), t.step("also", gate=False), t.step("shared")]
    )
    await t.refuses(
        ReplayMismatch,
        ctl.open_effect_group(other),
        "a replay key of another group",
        names={"group_key": other.key, "replay_key": t.tag("shared"), "position": 2},
    )
    t.expect(other.key not in await ctl.open_group_keys(), "the refused group is listed")


@check("G-49", requires=("sealing",))
async def check_an_unopenable_rank_is_refused_naming_its_slot(t: CheckContext) -> None:
    """G-49 (§7): the ``SealedPayloadUnreadable`` of a rank a reader cannot open carries
    the group key and the rank asked for, so an operator can find the record without being
    shown it; a replay key it carries is the one of the child holding that rank. (A host
    that seals its whole record, as Temporal's payload codec seals the whole history, cannot
    tell a reader without keys which child holds the rank.)"""
    ctl = await t.ctl()
    group = t.group("g", [t.step("first", gate=False, result="one"), t.step("second")])
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "first")
    t.release("second")
    await t.eventually(
        lambda: ctl.settlement_order(group.key), lambda o: len(o) == 2, "both children to rank"
    )
    reader = await t.host.reader(keys="none")
    refused = await t.refuses(
        SealedPayloadUnreadable,
        reader.await_next_settlement(handle.copy_cursor()),
        "rank 2 read with no key store",
        names={"group_key": group.key, "rank": 2},
    )
    t.expect(
        refused.replay_key in (None, t.tag("second")),
        f"the refusal of rank 2 names another child's replay key: {refused.replay_key!r}",
    )


@check("G-26")
async def check_a_close_with_no_disposition_names_its_group(t: CheckContext) -> None:
    """G-26 (§7, bad input): a close asking for a disposition that is no loser policy is
    ``InvalidEnvelope`` carrying the group key, and closes nothing: the group stays open
    and is served."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a")])
    handle = await t.open(ctl, group)
    await refused_nonsense_disposition(t, ctl, handle)
    t.release("a")
    await t.next_is(ctl, handle, "a")
