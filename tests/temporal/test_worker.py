"""The one-call worker (G-46): ``create_worker`` registers everything a group needs."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import activity, workflow

from effecthost.conformance._lab import Lab
from effecthost.contract import EffectGroup, LoserPolicy, WakePolicy
from effecthost.hosts.temporal import TemporalEffectHost, create_worker
from effecthost.hosts.temporal._shared import (
    CHILD_ACTIVITY,
    RELEASE_CLAIMS_ACTIVITY,
    RETIRE_ACTIVITY,
    SHARD_WORKFLOW_NAME,
    WORKFLOW_NAME,
)
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step


@pytest.mark.timeout(120)
@on_host()
async def test_G46_one_call_registers_everything_a_group_needs(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """G-46: one ``create_worker`` call builds a worker for the task queue with the group
    workflow, the shard workflow, the child activity and the retirement activities
    (payloads; the replay-key claims, R-11) registered; a group wider than its shard size runs and ranks on it alone."""
    assert host.client is not None
    queue = "g46-one-call"
    worker = create_worker(host.client, queue, host.resolver())
    config = worker.config()
    assert config["task_queue"] == queue
    workflows = {workflow._Definition.must_from_class(w).name for w in config["workflows"]}
    assert workflows == {WORKFLOW_NAME, SHARD_WORKFLOW_NAME}
    activities = {activity._Definition.must_from_callable(a).name for a in config["activities"]}
    assert activities == {CHILD_ACTIVITY, RETIRE_ACTIVITY, RELEASE_CLAIMS_ACTIVITY}

    group = EffectGroup(
        key="g46:group:sharded:0",
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[step(f"g46.{i}", gate=False, result=i) for i in range(3)],
    )
    async with worker:
        ctl = TemporalEffectHost(host.client, queue, host.resolver(), shard_size=2)
        handle = await ctl.open_effect_group(group)
        ranks = [await asyncio.wait_for(ctl.await_next_settlement(handle), 30) for _ in range(3)]
        await ctl.close_effect_group(handle)
    assert sorted(s.replay_key for s in ranks) == [f"g46.{i}" for i in range(3)]
