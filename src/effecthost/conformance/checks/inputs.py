"""A close's disposition as a caller may pass it: the enum, its string value, or nonsense."""

from __future__ import annotations

from effecthost.contract import LoserPolicy

from .._context import CheckContext
from .._registry import check
from .refusals import refused_nonsense_disposition


@check("G-26")
async def check_a_close_reads_the_disposition_by_value(t: CheckContext) -> None:
    """A close's disposition is a ``LoserPolicy`` or one of its string values, the same on
    every tier: ``"cancel"`` narrows like ``LoserPolicy.CANCEL`` (G-26). Anything else is
    bad input (SPEC §7): ``InvalidEnvelope`` naming the group, and nothing changes: the
    group stays open and its child runs on."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False), t.step("b")])
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "a")
    await t.started("b")
    await refused_nonsense_disposition(t, ctl, handle)
    t.expect(t.count("cancelled", "b") == 0, "a refused close cancelled a child")
    await t.within(
        ctl.close_effect_group(handle, LoserPolicy.CANCEL.value),  # type: ignore[arg-type]
        "a close with the string 'cancel'",
    )
    await t.cancelled("b")
    t.expect(group.key not in await ctl.open_group_keys(), "a closed group is still listed")
