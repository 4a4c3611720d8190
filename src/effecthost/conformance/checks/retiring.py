"""Retirement under races: G-36 (R-11) when a close and the last settlement meet."""

from __future__ import annotations

import asyncio

from .._context import CheckContext
from .._registry import check
from .closing import claims_freed

ROUNDS = 4
"""Groups whose close meets their last settlement, run together."""


@check("G-36")
async def check_a_close_meeting_the_last_settlement_still_retires(t: CheckContext) -> None:
    """G-36 (R-11): the retire rule is judged in the same atomic step as each write that
    can make it true, the close and every settlement, so whichever lands last retires
    the group. Each round closes a group in the same turn as it releases its last
    running child: the group must still retire, its replay keys free for a new group
    (R-6). A host whose close reads "a child is unsettled" while the last settlement
    reads "the group is open", each before the other's write, retires it neither way and
    fails here."""
    ctl = await t.ctl()

    async def meet(n: int) -> None:
        group = t.group(f"g{n}", [t.step(f"a{n}", gate=False), t.step(f"b{n}")])
        handle = await t.open(ctl, group)
        await t.next_is(ctl, handle, f"a{n}")
        await t.started(f"b{n}")
        t.release(f"b{n}")
        await t.within(ctl.close_effect_group(handle), f"the close of {group.key!r}")
        await t.finished(f"b{n}")

    await asyncio.gather(*(meet(n) for n in range(ROUNDS)))
    for n in range(ROUNDS):
        heir = t.group(f"heir{n}", [t.step(f"a{n}", gate=False), t.step(f"b{n}", gate=False)])
        await claims_freed(t, ctl, heir)
