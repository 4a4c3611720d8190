"""Which groups a reopen after a crash resumes: ruling R-13 beyond the ``race``.

``decided.py`` covers a decided ``race``; these cover the other wake policy R-13 names
(``FIRST_SUCCESS``: decided by a success, not by a failure) and the groups it leaves
unchanged (an undecided ``CANCEL`` group, a ``RUN_TO_COMPLETION`` race).
"""

from __future__ import annotations

from effecthost.contract import EffectController, LoserPolicy, UnknownGroup, WakePolicy

from .._context import CheckContext
from .._registry import check

LOSERS = ("l1", "l2")


async def _all_ranked(t: CheckContext, ctl: EffectController, key: str, count: int) -> None:
    async def ranked() -> int:
        try:
            return len(await ctl.settlement_order(key))
        except UnknownGroup:  # retired: every child took a rank
            return count

    await t.eventually(ranked, lambda n: n == count, "every child to take a rank")


@check("G-29", requires=("restart",))
async def check_losers_of_a_decided_any_stay_down_after_a_crash(t: CheckContext) -> None:
    """Ruling R-13: an ``any`` (wake ``FIRST_SUCCESS``, ``CANCEL``) is decided once a
    success holds a rank, whatever failed before it. Its caller read a failure, then a
    success, and died with two losers running: after the restart a reopen, a re-read of
    both ranks, a drain pass and the close start no loser a second time, and every loser
    still takes a rank."""
    ctl = await t.ctl()
    group = t.group(
        "any",
        [t.step("e", error="boom"), t.step("w"), *(t.step(x) for x in LOSERS)],
        wake=WakePolicy.FIRST_SUCCESS,
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, group)
    for label in ("e", "w", *LOSERS):
        await t.started(label)
    t.release("e")
    await t.next_is(ctl, handle, "e")
    t.release("w")
    await t.next_is(ctl, handle, "w")
    await t.restart()
    ctl = await t.ctl()

    reopened = await t.open(ctl, group)
    await t.next_is(ctl, reopened, "e")
    await t.next_is(ctl, reopened, "w")
    report = await t.within(ctl.drain().run_pass(), "a drain pass")
    resumed = [ids[1] for ids in report.resumed if ids[0] == group.key]
    t.expect(not resumed, f"a drain pass started losers of a decided any: {resumed}")
    await t.within(ctl.close_effect_group(reopened), "the close")
    await _all_ranked(t, ctl, group.key, len(group.children))
    starts = {x: t.count("started", x) for x in LOSERS}
    t.expect(
        all(n == 1 for n in starts.values()),
        f"losers of a decided any started again after a crash (starts: {starts})",
    )


@check("G-29", requires=("restart",))
async def check_a_reopen_resumes_an_undecided_cancel_group(t: CheckContext) -> None:
    """Ruling R-13: a ``CANCEL`` group is not decided until its wake policy is met; a
    failure does not meet ``FIRST_SUCCESS``, and a ``race`` with no rank is not met at
    all. After a crash, reopening such a group makes this incarnation the owner (R-1) and
    runs its unsettled children again, with no drain pass and no await of a missing rank:
    released, each finishes and is served."""
    ctl = await t.ctl()
    groups = {
        "any": t.group(
            "any",
            [t.step("e", error="boom"), t.step("any.l")],
            wake=WakePolicy.FIRST_SUCCESS,
            disposition=LoserPolicy.CANCEL,
        ),
        "race": t.group(
            "race",
            [t.step("race.a"), t.step("race.b")],
            wake=WakePolicy.FIRST,
            disposition=LoserPolicy.CANCEL,
        ),
    }
    handle = await t.open(ctl, groups["any"])
    await t.started("any.l")
    t.release("e")
    await t.next_is(ctl, handle, "e")
    await t.open(ctl, groups["race"])
    await t.started("race.a")
    await t.started("race.b")
    await t.restart()
    ctl = await t.ctl()

    unsettled = {"any": ["any.l"], "race": ["race.a", "race.b"]}
    for name, group in groups.items():
        reopened = await t.open(ctl, group)
        running = unsettled[name]
        for label in running:
            await t.started(label, 2)  # the reopen ran it again
        t.release(*running)
        for label in running:
            await t.finished(label)
        served = [(await t.next(ctl, reopened)).replay_key for _ in group.children]
        t.expect(
            sorted(served) == sorted(c.replay_key for c in group.children),
            f"the reopened {name} served {served}",
        )


@check("G-28", requires=("restart",))
async def check_race_losers_under_run_to_completion_run_on_after_a_crash(
    t: CheckContext,
) -> None:
    """Ruling R-13 leaves ``RUN_TO_COMPLETION`` losers unchanged (G-28): a ``race`` that
    declared it is never decided. Its caller read rank 1 and died with two losers
    running: after the restart, once it reopened and read rank 1 again and a drain pass
    ran, the losers run again and finish, and every child ranks."""
    ctl = await t.ctl()
    group = t.group(
        "race",
        [t.step("w", gate=False), *(t.step(x) for x in LOSERS)],
        wake=WakePolicy.FIRST,
    )
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "w")
    for loser in LOSERS:
        await t.started(loser)
    await t.restart()
    ctl = await t.ctl()

    reopened = await t.open(ctl, group)
    await t.next_is(ctl, reopened, "w")
    await t.within(ctl.drain().run_pass(), "a drain pass")
    t.release(*LOSERS)
    for loser in LOSERS:
        await t.finished(loser)
    await _all_ranked(t, ctl, group.key, len(group.children))
