"""What an event reaches once its group is closed: R-5 and R-11 (G-51)."""

from __future__ import annotations

from effecthost.contract import LoserPolicy, UnknownGroup

from .._context import CheckContext
from .._registry import check


@check("G-51")
async def check_an_event_reaches_no_wait_a_close_cancelled(t: CheckContext) -> None:
    """Rulings R-5 and R-11: ``deliver_event`` counts the unsettled ``await_event``
    children it settles. Once a ``CANCEL`` close's cancel of a wait has been recorded
    (the wait holds a rank), that wait is settled: an event of its name reaches nothing
    and returns 0 — also while the group has not retired yet, its tool loser still
    winding down (on a host that ranks that loser only once its tool stops)."""
    ctl = await t.ctl()
    group = t.group(
        "g",
        [t.event("wait", "ping"), t.step("tool", hold_cancel=True)],
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, group)
    await t.started("tool")
    await t.within(ctl.close_effect_group(handle), "the CANCEL close")
    await t.cancelled("tool")

    async def order() -> list[int]:
        try:
            return await ctl.settlement_order(group.key)
        except UnknownGroup:  # retired: every child ranked
            return [-1]

    await t.eventually(order, lambda o: 0 in o or -1 in o, "the wait's cancel to rank")
    reached = await t.within(
        ctl.deliver_event(group.key, "ping", 1), "an event to the closed group"
    )
    t.expect(reached == 0, f"an event reached {reached} wait(s) a close had already cancelled")
    t.lab.open(f"{t.tag('tool')}/release")
