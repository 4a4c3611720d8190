"""The waiter probe that G-19's check relies on, checked against the awaits it reports."""

from __future__ import annotations

import asyncio

from .._context import CheckContext
from .._registry import check


@check("G-19", requires=("waiter_probe",))
async def check_the_waiter_probe_reports_parked_awaits_only(t: CheckContext) -> None:
    """G-19 is checked by cancelling an await while the host reports it parked, so the
    report must be true exactly then: not before any await of the rank, yes while one is
    parked, and not again once it returned with its settlement. A probe that always says
    yes, or that keeps counting an await that left, would have the check cancel an await
    that never parked."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a")])
    handle = await t.open(ctl, group)
    await t.started("a")
    t.expect(
        not await t.host.awaiting(group.key, 1), "an await is reported parked before any began"
    )
    waiter = asyncio.ensure_future(ctl.await_next_settlement(handle))
    try:
        await t.eventually(
            lambda: t.host.awaiting(group.key, 1), bool, "the await of rank 1 to be parked"
        )
        t.release("a")
        settlement = await t.within(waiter, "the parked await")
    finally:
        waiter.cancel()
    t.expect(settlement.replay_key == t.tag("a"), f"the await returned {settlement.replay_key!r}")
    await t.eventually(
        lambda: t.host.awaiting(group.key, 1),
        lambda parked: not parked,
        "the await that returned to be reported gone",
    )
