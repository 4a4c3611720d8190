"""Close under CANCEL returns while the loser still runs; the loser ends cancelled
(G-27, G-45)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from group_support import group as effect_group

from effecthost.combinators import Scope, next_group_key, race, tool
from effecthost.conformance import STEP, step_input
from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectHostError,
    GroupHandle,
    InvalidEnvelope,
    LoserPolicy,
    WakePolicy,
)
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from untyped_calls import wrong_type_calls


async def _unlisted(ctl: TemporalEffectHost, key: str) -> bool:
    """Whether ``key`` leaves ``ctl``'s listing of open groups within 10 s: a bounded
    poll of the server's visibility index, which trails the run's memo."""
    for _ in range(100):
        if key not in await ctl.open_group_keys():
            return True
        await asyncio.sleep(0.1)
    return False


@pytest.mark.timeout(90)
@on_host()
async def test_cancel_close_returns_while_the_loser_runs(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    group = effect_group(
        "cancel:group:race:0",
        [step("cc.win", gate=False, result="W"), step("cc.lose", hold_cancel=True)],
        WakePolicy.FIRST,
        LoserPolicy.CANCEL,
    )
    ctl = await host.controller()
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    assert first.replay_key == "cc.win" and first.outcome.value == "W"
    await lab.wait_for("started", "cc.lose", timeout=20)

    await asyncio.wait_for(ctl.close_effect_group(handle), 20)
    # The close has returned; the loser is still running (it holds in its cancel
    # handler until we release it) and the cancel reaches it through a heartbeat.
    await lab.wait_for("cancelled", "cc.lose", timeout=20)
    assert lab.count("finished", "cc.lose") == 0
    assert host.client is not None
    wf = host.client.get_workflow_handle(group.key)
    second = await wf.query("read", 2)
    assert second["settlement"]["replay_key"] == "cc.lose"
    assert second["settlement"]["outcome"]["status"] == "cancelled"
    # closed, though its run goes on until the loser ends: no longer listed as open,
    # by the closer and by a controller that did not close it (the run's memo says
    # closed; the visibility index follows it within moments)
    assert group.key not in await ctl.open_group_keys()
    assert host.client is not None
    assert await _unlisted(TemporalEffectHost(host.client, host.task_queue), group.key)

    lab.open("cc.lose/release")
    await asyncio.wait_for(wf.result(), 20)  # the run ends: closed, all settled
    assert lab.count("finished", "cc.lose") == 0
    assert group.key not in await ctl.open_group_keys()


@pytest.mark.timeout(90)
@on_host()
async def test_r9_race_cancelled_from_outside_closes_its_group(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """R-9: a ``race`` declaring ``CANCEL``, cancelled from outside while it waits, closes
    its group (shielded) before the cancellation propagates: the losers are cancelled and
    the group is no longer open; G-26: a close disposition that is not a ``LoserPolicy``
    value is refused."""
    ctl = await host.controller()
    with pytest.raises(InvalidEnvelope):
        await ctl.close_effect_group(
            GroupHandle(
                group_key="r9:group:none:0",
                child_count=1,
                consumed=0,
                wake=WakePolicy.FIRST,
                disposition=LoserPolicy.CANCEL,
            ),
            "bogus",  # type: ignore[arg-type]
        )
    tags = ("r9.a", "r9.b")
    calls = [tool(STEP, step_input(tag, hold_cancel=False)) for tag in tags]
    scope = Scope(scope_id="r9")
    key = next_group_key(scope, calls)
    task = asyncio.ensure_future(race(ctl, scope, calls, disposition=LoserPolicy.CANCEL))
    for tag in tags:
        await lab.wait_for("started", tag, timeout=20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 20)
    for tag in tags:
        await lab.wait_for("cancelled", tag, timeout=20)
        assert lab.count("finished", tag) == 0
    assert key not in await ctl.open_group_keys()


@pytest.mark.timeout(90)
@on_host()
async def test_wrong_argument_types_are_typed_refusals(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """SPEC §7, R-2: an argument of the wrong type (``None``, a string, a handle built
    without validation, a key that is not a storable string) is a typed ``EffectHostError``
    on every method, refused before any request to the server, as on memory and SQL."""
    ctl = await host.controller()
    for _name, call in wrong_type_calls(ctl):
        with pytest.raises(EffectHostError):
            await asyncio.wait_for(call(), 20)
