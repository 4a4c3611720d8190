"""``effecthost inspect --temporal ADDRESS`` against a real dev server: the columns and
rank table every tier shows, read through visibility, queries and history reads, which
add no event to the group's history."""

from __future__ import annotations

import asyncio

import pytest
from group_support import group as effect_group
from inspect_support import check_inspect, inspect

from effecthost.conformance import STEP
from effecthost.conformance._lab import Lab
from effecthost.contract import LoserPolicy, WakePolicy
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step


@pytest.mark.timeout(120)
@on_host()
async def test_inspect_temporal_lists_and_ranks_without_writing(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-30: inspect on Temporal shows the same columns and rank table as the SQL tiers;
    the group workflow's history has the same events before and after."""
    tags = ["inspect.t.hold", "inspect.t.quick"]
    group = effect_group(
        "inspect:group:temporal:0",
        [step(tags[0]), step(tags[1], gate=False, result="Q")],
        WakePolicy.ALL,
        LoserPolicy.CANCEL,
    )
    ctl = await host.controller()
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    assert first.position == 1
    await lab.wait_for("started", tags[0], timeout=20)
    assert host.client is not None
    wf = host.client.get_workflow_handle(group.key)
    opener = (await wf.query("status"))["opener"]
    await ctl.open_group_keys()  # visibility has caught up with the open

    async def history() -> list[int]:
        return [e.event_type async for e in wf.fetch_history_events()]

    before = await history()
    await asyncio.to_thread(
        check_inspect,
        ["--temporal", host.address, "--namespace", host.namespace],
        group.key,
        wake="all",
        disposition="cancel",
        owner=opener,
        children=[(t, STEP) for t in tags],
    )
    assert await history() == before

    down = await asyncio.to_thread(inspect, "--temporal", "127.0.0.1:1", "--connect-timeout", "5")
    assert down.returncode == 14 and down.stderr.count("\n") == 1, down.stderr
