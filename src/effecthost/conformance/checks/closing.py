"""Close, losers and the drain: G-26…G-30."""

from __future__ import annotations

import asyncio

from effecthost.contract import DispositionWidened, GroupClosed, GroupHandle, LoserPolicy

from .._context import CheckContext
from .._registry import check


@check("G-26")
async def check_close_is_idempotent(t: CheckContext) -> None:
    """A second close, and a close from a restored handle, are harmless."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a", gate=False), t.step("b")]))
    await t.next_is(ctl, handle, "a")
    restored = GroupHandle.from_json(handle.to_json())
    await ctl.close_effect_group(handle)
    await ctl.close_effect_group(handle)
    await ctl.close_effect_group(restored)
    t.expect(handle.group_key not in await ctl.open_group_keys(), "a closed group is listed")
    t.expect(t.count("cancelled", "b") == 0, "a RUN_TO_COMPLETION close cancelled a loser")


@check("G-26")
async def check_close_only_narrows(t: CheckContext) -> None:
    """``CANCEL`` cannot be widened (``DispositionWidened``, nothing changes);
    ``RUN_TO_COMPLETION`` can be narrowed to ``CANCEL`` at close."""
    ctl = await t.ctl()
    strict = await t.open(ctl, t.group("strict", [t.step("s")], disposition=LoserPolicy.CANCEL))
    await t.started("s")
    error = await t.refuses(
        DispositionWidened,
        ctl.close_effect_group(strict, LoserPolicy.RUN_TO_COMPLETION),
        "widening CANCEL",
    )
    t.expect(error.group_key == strict.group_key, "refusal must name the group")
    t.expect(strict.group_key in await ctl.open_group_keys(), "a refused close closed the group")
    t.expect(t.count("cancelled", "s") == 0, "a refused close cancelled a child")
    await ctl.close_effect_group(strict)
    await t.cancelled("s")
    await ctl.close_effect_group(strict, LoserPolicy.CANCEL)

    loose = await t.open(ctl, t.group("loose", [t.step("l")]))
    await t.started("l")
    await ctl.close_effect_group(loose, LoserPolicy.CANCEL)
    await t.cancelled("l")


@check("G-27")
async def check_cancel_close_does_not_wait_for_losers(t: CheckContext) -> None:
    """Under ``CANCEL`` the close returns while the loser is still winding down; the
    cancel reaches the loser."""
    ctl = await t.ctl()
    group = t.group(
        "g",
        [t.step("win", gate=False), t.step("lose", hold_cancel=True)],
        disposition=LoserPolicy.CANCEL,
    )
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "win")
    await t.started("lose")
    await asyncio.wait_for(ctl.close_effect_group(handle), t.timeout)
    await t.cancelled("lose")
    t.expect(t.count("finished", "lose") == 0, "the loser finished instead of being cancelled")
    t.lab.open(f"{t.tag('lose')}/release")
    await t.eventually(ctl.open_group_keys, lambda keys: group.key not in keys, "close")


@check("G-28")
async def check_run_to_completion_losers_finish_after_close(t: CheckContext) -> None:
    """Under ``RUN_TO_COMPLETION`` a loser keeps running after the caller closed and
    finishes under the host's ownership."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("win", gate=False), t.step("lose")]))
    await t.next_is(ctl, handle, "win")
    await ctl.close_effect_group(handle)
    await t.started("lose")
    t.release("lose")
    await t.finished("lose")
    t.expect(t.count("cancelled", "lose") == 0, "a RUN_TO_COMPLETION loser was cancelled")


@check("G-28", "G-29", requires=("restart",))
async def check_drain_finishes_losers_of_a_gone_caller(t: CheckContext) -> None:
    """The caller closes under ``RUN_TO_COMPLETION`` and its process dies: after the
    restart the drain (or the engine) finishes the loser."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("win", gate=False), t.step("lose")]))
    await t.next_is(ctl, handle, "win")
    await ctl.close_effect_group(handle)
    await t.started("lose")
    await t.restart()
    ctl = await t.ctl()
    t.release("lose")
    await ctl.drain().run_pass()
    await t.finished("lose")
    t.expect(t.count("cancelled", "lose") == 0, "a RUN_TO_COMPLETION loser was cancelled")


@check("G-29", requires=("restart",))
async def check_drain_applies_a_declared_cancel(t: CheckContext) -> None:
    """A ``CANCEL`` group whose caller died before closing: the drain reads the declared
    disposition and cancels the unfinished children; they rank as cancelled."""
    ctl = await t.ctl()
    group = t.group(
        "g", [t.step("a"), t.step("b"), t.step("c", gate=False)], disposition=LoserPolicy.CANCEL
    )
    handle = await t.open(ctl, group)
    await t.next_is(ctl, handle, "c")
    saved = handle.to_json()
    await t.started("a")
    await t.started("b")
    await t.restart()
    ctl = await t.ctl()
    await ctl.drain().run_pass()
    reopened = await t.open(ctl, group)
    restored = GroupHandle.from_json(saved)
    t.expect(reopened.consumed == 0, "reopen must return consumed=0")
    for _ in range(2):
        settlement = await t.next(ctl, restored)
        t.expect(
            settlement.outcome.status == "cancelled",
            f"rank {settlement.rank} should be cancelled by the drain, got "
            f"{settlement.outcome.status}",
        )
    t.expect(t.count("finished", "a") + t.count("finished", "b") == 0, "a loser ran on")


@check("G-30")
async def check_open_group_keys_are_inspectable(t: CheckContext) -> None:
    """Open groups are listed until closed; nothing expires them."""
    ctl = await t.ctl()
    one = await t.open(ctl, t.group("one", [t.step("a")]))
    two = await t.open(ctl, t.group("two", [t.step("b")]))
    keys = await ctl.open_group_keys()
    t.expect({one.group_key, two.group_key} <= set(keys), "open groups must be listed")
    await ctl.close_effect_group(one, LoserPolicy.CANCEL)
    keys = await ctl.open_group_keys()
    t.expect(one.group_key not in keys and two.group_key in keys, "close must unlist only it")


@check("G-26", "G-17")
async def check_a_closed_key_stays_closed(t: CheckContext) -> None:
    """Ruling R-4 (and R-2's order): a closed group's key keeps a tombstone. Every later
    open of it (the same group, another shape, other inputs) and every await is
    ``GroupClosed`` — while a loser still runs (not retired yet) and once every child
    has settled (retired); a later close is a no-op; nothing runs again."""
    ctl = await t.ctl()
    running = t.group("running", [t.step("win", gate=False), t.step("lose")])
    settled = t.group("settled", [t.step("done", gate=False)])
    handles = [await t.open(ctl, running), await t.open(ctl, settled)]
    await t.next_is(ctl, handles[0], "win")
    await t.next_is(ctl, handles[1], "done")
    await t.started("lose")
    for handle in handles:
        await ctl.close_effect_group(handle)
    reopens = {
        "running": [
            running,
            t.group("running", [t.step("win", gate=False)]),
            t.group("running", [t.step("win", gate=False, result=1), t.step("lose")]),
        ],
        "settled": [
            settled,
            t.group("settled", [t.step("done", gate=False), t.step("more")]),
            t.group("settled", [t.step("done", gate=False, result=1)]),
        ],
    }
    for (label, groups), handle in zip(reopens.items(), handles, strict=True):
        phase = "a closed group a loser still runs in" if label == "running" else "a retired group"
        for group in groups:
            await t.refuses(GroupClosed, ctl.open_effect_group(group), f"reopen of {phase}")
        for cursor in (handle.copy_cursor(), groups[0].handle()):
            await t.refuses(GroupClosed, ctl.await_next_settlement(cursor), f"await on {phase}")
        await ctl.close_effect_group(handle)
        t.expect(handle.group_key not in await ctl.open_group_keys(), f"{phase} is listed")
    t.release("lose")
    await t.finished("lose")
    for label in ("win", "lose", "done"):
        t.expect(t.count("started", label) == 1, f"{label} ran again after its group closed")
    t.expect(t.count("started", "more") == 0, "a refused reopen ran a child")
