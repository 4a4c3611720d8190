"""Owner liveness across incarnations: R-1 (G-29, G-34) seen from another live process."""

from __future__ import annotations

from effecthost.contract import LoserPolicy, WakePolicy

from .._context import CheckContext
from .._registry import check


@check("G-29", "G-34", requires=("second_incarnation",))
async def check_another_process_never_takes_a_live_owners_group(t: CheckContext) -> None:
    """Ruling R-1: a group's owner is live while its incarnation holds its claim, so a
    drain pass run by *another* live incarnation over the same store (the unwired
    controller) cancels, resumes and reports none of the children of a live owner's
    ``CANCEL`` group: not a running tool call, not an event wait, not a timer (not even
    as ``NoExecutor``). A host that takes every other process for gone fails here."""
    ctl = await t.ctl()
    group = t.group(
        "g",
        [t.step("tool"), t.event("ev", "go"), t.sleep("nap", 60.0)],
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, group)
    await t.started("tool")
    other = await t.ctl(wired=False)
    report = await t.within(other.drain().run_pass(), "another process's drain pass")
    touched = {
        "resumed": [ids[1] for ids in report.resumed if ids[0] == group.key],
        "cancelled": [ids[1] for ids in report.cancelled if ids[0] == group.key],
        "no_executor": [e.replay_key for e in report.no_executor if e.group_key == group.key],
    }
    t.expect(not any(touched.values()), f"another process took a live owner's children: {touched}")
    t.expect(await ctl.deliver_event(group.key, "go", "won") == 1, "the event wait was settled")
    first = await t.next_is(ctl, handle, "ev")
    t.expect(first.outcome.value == "won", "the event lost the select to the other drain")
    # the tool call runs to its end: a cancel from the other drain, however late its
    # report, would have stopped it
    t.release("tool")
    await t.finished("tool")
    t.expect(t.count("cancelled", "tool") == 0, "another process cancelled the live tool call")
