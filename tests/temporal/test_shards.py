"""A group wider than its shard size runs in shards (child workflows); its run ranks the
settlements as it records the shards' reports, and a replay of its history re-derives
the same ranks (G-43, G-15)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.worker import Replayer

from effecthost.contract import EffectGroup, LoserPolicy, WakePolicy
from effecthost.hosts.temporal import EffectGroupWorkflow, TemporalEffectHost, workflow_runner
from effecthost.hosts.temporal._shared import shard_id

from ._support import running_host, step
from .test_replay import _Capture


@pytest.mark.timeout(120)
def test_sharded_group_ranks_in_report_order_and_replays(tmp_path: Path) -> None:
    """G-43, G-15: seven children in shards of three, released in a chosen order across
    the shards, take ranks in that order; a CANCEL close cancels the unsettled ones in
    every shard; each shard is a child workflow; the group's history replays (sandboxed)
    and re-derives the ranks the caller read."""
    asyncio.run(_sharded(tmp_path))


async def _sharded(root: Path) -> None:
    async with running_host(root) as (host, lab):
        assert host.client is not None
        tags = [f"sh.{i}" for i in range(7)]
        group = EffectGroup(
            key="shards:group:seven:0",
            wake=WakePolicy.ALL,
            disposition=LoserPolicy.CANCEL,
            children=[step(tag, result=i) for i, tag in enumerate(tags)],
        )
        ctl = TemporalEffectHost(host.client, host.task_queue, host.resolver(), shard_size=3)
        handle = await ctl.open_effect_group(group)
        order = ["sh.6", "sh.1", "sh.4", "sh.0"]
        for tag in order:
            lab.open(tag)
            settlement = await asyncio.wait_for(ctl.await_next_settlement(handle), 30)
            assert settlement.replay_key == tag
        for tag in ("sh.2", "sh.3", "sh.5"):
            await lab.wait_for("started", tag, timeout=30)
        await asyncio.wait_for(ctl.close_effect_group(handle), 30)
        for tag in ("sh.2", "sh.3", "sh.5"):
            await lab.wait_for("cancelled", tag, timeout=30)

        wf = host.client.get_workflow_handle(group.key)
        result = await asyncio.wait_for(wf.result(), 30)
        expected = [*order, "sh.2", "sh.3", "sh.5"]  # the cancelled, in position order
        assert result["ranks"] == expected
        for index in range(3):
            shard = await host.client.get_workflow_handle(shard_id(group.key, index)).describe()
            assert shard.parent_id == group.key

        history = await wf.fetch_history()
        replayed = await Replayer(
            workflows=[EffectGroupWorkflow], workflow_runner=workflow_runner()
        ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
        capture = _Capture()
        await Replayer(workflows=[EffectGroupWorkflow], interceptors=[capture]).replay_workflow(
            history
        )
        rederived: Any = capture.results[0]
        assert rederived["ranks"] == expected
