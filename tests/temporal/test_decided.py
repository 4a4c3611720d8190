"""R-13 on the engine tier: after a real worker SIGKILL, the losers of a decided CANCEL
race stay down. Temporal retries an activity cut off by a dead worker (attempt 2); that
attempt must not start its tool unless a caller awaits a rank that does not exist yet."""

from __future__ import annotations

import asyncio

import pytest
from group_support import group as effect_group
from temporalio.api.enums.v1 import PendingActivityState

from effecthost.conformance._lab import Lab
from effecthost.contract import EffectGroup, LoserPolicy, UnknownGroup, WakePolicy
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step

LOSERS = ("l1", "l2", "l3")


def _race(name: str) -> EffectGroup:
    return effect_group(
        f"decided:{name}",
        [step(f"{name}.w", gate=False), *(step(f"{name}.{x}") for x in LOSERS)],
        WakePolicy.FIRST,
        LoserPolicy.CANCEL,
    )


async def _retried(host: TemporalHostUnderTest, key: str) -> None:
    """Until every loser's second attempt runs on the new worker. A bounded poll of the
    engine's view (an external process reaching a state), not an ordering sleep."""
    assert host.client is not None
    handle = host.client.get_workflow_handle(key)
    for _ in range(300):
        pending = (await handle.describe()).raw_description.pending_activities
        if len(pending) == len(LOSERS) and all(
            p.attempt >= 2 and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            for p in pending
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the losers of {key!r} were not retried: {pending}")


async def _retired_or_ranked(caller: TemporalEffectHost, group: EffectGroup) -> None:
    for _ in range(300):  # bounded poll: the workflow records the cancels, then retires
        try:
            if len(await caller.settlement_order(group.key)) == len(group.children):
                return
        except UnknownGroup:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{group.key!r} never ranked every child")


@pytest.mark.timeout(180)
@on_host()
async def test_losers_of_a_decided_race_stay_down_after_a_worker_sigkill(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """R-13: a 4-child CANCEL race read to rank 1, its worker SIGKILLed with three
    losers running. After the losers' second attempts run on a new worker, a reopen, a
    re-read of rank 1 and the close start no loser's tool again; a second such race whose
    caller reads on gets every rank (the losers run once it awaits rank 2)."""
    down, on = _race("down"), _race("on")
    caller = await host.controller()
    for group in (down, on):
        handle = await caller.open_effect_group(group)
        first = await asyncio.wait_for(caller.await_next_settlement(handle), 20)
        assert first.replay_key == f"{group.key.split(':')[1]}.w"
        for loser in LOSERS:
            await lab.wait_for("started", f"{group.key.split(':')[1]}.{loser}", timeout=20)

    await host.restart()  # SIGKILL the worker; a new one starts
    fresh = await host.controller()
    assert isinstance(fresh, TemporalEffectHost)

    reopened = await fresh.open_effect_group(down)
    assert (await asyncio.wait_for(fresh.await_next_settlement(reopened), 20)).rank == 1
    await _retried(host, down.key)
    await fresh.close_effect_group(reopened)
    await _retired_or_ranked(fresh, down)
    starts = {x: lab.count("started", f"down.{x}") for x in LOSERS}
    assert starts == dict.fromkeys(LOSERS, 1), f"losers started again: {starts}"

    reading = await fresh.open_effect_group(on)
    assert (await asyncio.wait_for(fresh.await_next_settlement(reading), 20)).rank == 1
    await _retried(host, on.key)
    assert {x: lab.count("started", f"on.{x}") for x in LOSERS} == dict.fromkeys(LOSERS, 1)
    lab.open_all("on.")
    rest = [await asyncio.wait_for(fresh.await_next_settlement(reading), 30) for _ in LOSERS]
    assert sorted(s.replay_key for s in rest) == sorted(f"on.{x}" for x in LOSERS)
    assert all(s.outcome.status == "success" for s in rest), [s.outcome for s in rest]
    await fresh.close_effect_group(reading)
