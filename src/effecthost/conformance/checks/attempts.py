"""Which attempt a tool is told it is: the contract's ``ChildInfo.attempt`` (G-09)."""

from __future__ import annotations

from effecthost.contract import GroupHandle

from .._context import CheckContext
from .._registry import check


def _attempts(t: CheckContext, label: str) -> list[object]:
    return [e.data.get("attempt") for e in t.lab.of(t.tag(label)) if e.kind == "started"]


@check("G-09", requires=("restart",))
async def check_a_run_again_is_a_later_attempt(t: CheckContext) -> None:
    """G-09 (at-least-once execution): a tool is told which attempt it is (the executor's
    ``ExecutionInput.attempt``, a tool's ``ChildInfo.attempt``): 1 on a child's first run,
    and more on the run a reopen in a new process starts after the first one's process
    died, so a tool can tell a re-run from a first run."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a")])
    handle = await t.open(ctl, group)
    saved = handle.to_json()
    await t.started("a")
    first = _attempts(t, "a")
    t.expect(first == [1], f"a child's first run was told it is attempt {first}")
    await t.restart()
    ctl = await t.ctl()
    await t.open(ctl, group)
    await t.started("a", 2)
    again = _attempts(t, "a")[1]
    t.expect(
        isinstance(again, int) and again > 1,
        f"the run after a crash was told it is attempt {again!r}, not a later one than 1",
    )
    t.release("a")
    await t.next_is(ctl, GroupHandle.from_json(saved), "a")
