"""One drain pass over every kind of group a crash leaves behind: G-34 (R-1, R-13, G-29)."""

from __future__ import annotations

from effecthost.contract import GroupHandle, LoserPolicy, WakePolicy

from .._context import CheckContext
from .._registry import check


@check("G-34", requires=("restart",))
async def check_one_drain_pass_sorts_what_a_crash_left(t: CheckContext) -> None:
    """G-34 with R-1 and R-13: after a crash, one drain pass meets three groups. An
    ``any`` (wake ``FIRST_SUCCESS``, ``CANCEL``) whose rank 1 is a success is decided and
    its caller reopened it, so it has a live owner: the reopen and the pass start,
    cancel and report none of its losers, and a caller reading on then starts the loser
    and gets its success. A ``RUN_TO_COMPLETION`` group whose caller is gone has its
    running child finished (by the pass or by the engine), which then holds rank 1 as a
    success. A ``CANCEL`` group whose caller is gone has its child cancelled by the
    pass, listed in the report's ``cancelled`` as (group key, replay key), and ranked as
    cancelled. Every entry of the report is such a pair."""
    ctl = await t.ctl()
    decided = t.group(
        "any",
        [t.step("won", gate=False), t.step("lost")],
        wake=WakePolicy.FIRST_SUCCESS,
        disposition=LoserPolicy.CANCEL,
    )
    finishing = t.group("finish", [t.step("runs")])
    cancelling = t.group("cancel", [t.step("stops")], disposition=LoserPolicy.CANCEL)
    handle = await t.open(ctl, decided)
    await t.next_is(ctl, handle, "won")
    saved = handle.to_json()
    for group in (finishing, cancelling):
        await t.open(ctl, group)
    for label in ("lost", "runs", "stops"):
        await t.started(label)
    await t.restart()
    ctl = await t.ctl()

    reading = GroupHandle.from_json(saved)
    await t.open(ctl, decided)
    report = await t.within(ctl.drain().run_pass(), "a drain pass")
    entries = [*report.resumed, *report.cancelled]
    t.expect(
        all(
            isinstance(e, tuple) and len(e) == 2 and all(isinstance(i, str) for i in e)
            for e in entries
        ),
        f"a drain report entry is not a (group key, replay key) pair: {entries}",
    )
    touched = [e for e in entries if e[0] == decided.key]
    t.expect(not touched, f"the pass touched a reopened decided group (R-1, R-13): {touched}")
    t.expect(
        (cancelling.key, t.tag("stops")) in report.cancelled,
        f"the pass did not report the cancel of a gone caller's CANCEL child: {report}",
    )
    t.release("runs")
    await t.finished("runs")
    for group, label, status in (
        (finishing, "runs", "success"),
        (cancelling, "stops", "cancelled"),
    ):
        other = await t.open(ctl, group)
        settlement = await t.next_is(ctl, other, label)
        t.expect(
            settlement.outcome.status == status,
            f"{label!r} ranked as {settlement.outcome.status}, not {status}",
        )
    # Read only now: a loser the reopen started again reported so before the children the
    # pass dispatched later started and finished.
    t.expect(t.count("started", "lost") == 1, "the loser of a decided group started again")
    t.release("lost")
    settlement = await t.next_is(ctl, reading, "lost")
    t.expect(settlement.outcome.ok, f"the loser read on settled as {settlement.outcome.status}")
    t.expect(t.count("started", "lost") == 2, "reading on did not start the loser once more")
