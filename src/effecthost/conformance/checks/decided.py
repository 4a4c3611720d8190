"""After a crash, the losers of a decided ``CANCEL`` group stay down: ruling R-13."""

from __future__ import annotations

from effecthost.contract import LoserPolicy, UnknownGroup, WakePolicy

from .._context import CheckContext
from .._registry import check

LOSERS = ("l1", "l2", "l3")


@check("G-29", requires=("restart",))
async def check_losers_of_a_decided_race_stay_down_after_a_crash(t: CheckContext) -> None:
    """Ruling R-13: a ``race`` (wake ``FIRST``, ``CANCEL``) whose caller read rank 1 and
    died with three losers running is decided. After the restart, callers reopen two
    such races and re-read rank 1: a drain pass, and another group's open and close after
    it, start none of their losers. The caller that reads on gets every rank: the losers
    start again only once it awaits rank 2, which does not exist yet. The other closes:
    no loser's tool starts a second time, and every loser still takes a rank."""
    ctl = await t.ctl()
    groups = {
        name: t.group(
            name,
            [t.step(f"{name}.w", gate=False), *(t.step(f"{name}.{x}") for x in LOSERS)],
            wake=WakePolicy.FIRST,
            disposition=LoserPolicy.CANCEL,
        )
        for name in ("down", "on")
    }
    for name, group in groups.items():
        handle = await t.open(ctl, group)
        await t.next_is(ctl, handle, f"{name}.w")
        for loser in LOSERS:
            await t.started(f"{name}.{loser}")
    await t.restart()
    ctl = await t.ctl()

    on, down = groups["on"], groups["down"]
    reading = await t.open(ctl, on)
    await t.next_is(ctl, reading, "on.w")
    reopened = await t.open(ctl, down)
    await t.next_is(ctl, reopened, "down.w")
    report = await t.within(ctl.drain().run_pass(), "a drain pass")
    resumed = [ids[1] for ids in report.resumed if ids[0] in (on.key, down.key)]
    t.expect(not resumed, f"a drain pass started losers of a decided race: {resumed}")
    # A loser the reopens or the pass started again, at once or at the host's next open,
    # reports so before a child opened after them has started and settled: count only then.
    probe = await t.open(ctl, t.group("probe", [t.step("probe.p", gate=False)]))
    await t.next_is(ctl, probe, "probe.p")
    await t.within(ctl.close_effect_group(probe), "the probe's close")
    early = {f"{g}.{x}": t.count("started", f"{g}.{x}") for g in groups for x in LOSERS}
    t.expect(
        all(n == 1 for n in early.values()),
        f"losers of a decided race started before any await of rank 2 (starts: {early})",
    )
    t.release(*(f"on.{x}" for x in LOSERS))
    served = [await t.next(ctl, reading) for _ in LOSERS]
    t.expect(
        sorted(s.replay_key for s in served) == sorted(t.tag(f"on.{x}") for x in LOSERS),
        "a caller reading on must get every loser's rank",
    )
    t.expect(
        all(s.outcome.status == "success" for s in served),
        f"the losers awaited must run: {[s.outcome.status for s in served]}",
    )

    await t.within(ctl.close_effect_group(reopened), "the close")

    async def ranked() -> int:
        try:
            return len(await ctl.settlement_order(down.key))
        except UnknownGroup:  # retired: every child took a rank
            return len(down.children)

    await t.eventually(ranked, lambda n: n == len(down.children), "every loser to take a rank")
    again = {x: t.count("started", f"down.{x}") for x in LOSERS}
    t.expect(
        all(n == 1 for n in again.values()),
        f"losers of a decided race started again after a crash (starts: {again})",
    )
