"""A group wider than its shard size runs in shards (child workflows); its run ranks the
settlements as it records the shards' reports, and a replay of its history re-derives
the same ranks (G-43, G-15)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from group_support import group as effect_group
from group_support import timer
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from effecthost.conformance._lab import Lab
from effecthost.contract import EffectEnvelope, EffectGroup, EffectKind, LoserPolicy, WakePolicy
from effecthost.hosts.temporal import (
    CHILD_ACTIVITY,
    SHARD_CHILDREN,
    WIDE_SHARD_CHILDREN,
    EffectGroupWorkflow,
    EffectShardWorkflow,
    TemporalEffectHost,
    workflow_runner,
)
from effecthost.hosts.temporal._shared import shard_id
from effecthost.hosts.temporal._worker import create_worker
from effecthost.hosts.temporal._workflow import shard_starts
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, rederived, replays_clean, step

_ADMITTED = UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED


def _wide(count: int) -> EffectGroup:
    return effect_group(
        f"shards:plan:{count}",
        [step(f"p.{i}") for i in range(count)],
        WakePolicy.ALL,
        LoserPolicy.CANCEL,
    )


def test_wide_group_shards_are_listed_in_the_start_input() -> None:
    """G-43: by default a group of up to ``SHARD_CHILDREN`` runs in one workflow and a
    wider one in shards of ``WIDE_SHARD_CHILDREN`` (its own constant: the shard size that
    keeps a wide group's cost per child flat is not the widest group one run holds); an
    explicit ``shard_size`` keeps cutting at that size. The start input lists the
    shards, as the run reads them."""
    ctl = TemporalEffectHost(object(), "plan")  # type: ignore[arg-type]  # plans only
    narrow = ctl._group_spec(_wide(SHARD_CHILDREN))
    assert shard_starts(narrow, SHARD_CHILDREN) == []
    count = SHARD_CHILDREN + 1
    wide = ctl._group_spec(_wide(count))
    assert shard_starts(wide, count) == list(range(0, count, WIDE_SHARD_CHILDREN))
    chunked = TemporalEffectHost(object(), "plan", chunk_bytes=200_000)
    spec = chunked._group_spec(_wide(count))
    starts = spec["shards"]
    assert spec["chunks"]
    assert max(b - a for a, b in zip(starts, [*starts[1:], count], strict=True)) <= (
        WIDE_SHARD_CHILDREN
    )
    explicit = TemporalEffectHost(object(), "plan", shard_size=3)
    assert shard_starts(explicit._group_spec(_wide(7)), 7) == [0, 3, 6]


@pytest.mark.timeout(120)
@on_host()
async def test_sharded_group_ranks_in_report_order_and_replays(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-43, G-15: seven children in shards of three, released in a chosen order across
    the shards, take ranks in that order; a CANCEL close cancels the unsettled ones in
    every shard; each shard is a child workflow; the group's history replays (sandboxed)
    and re-derives the ranks the caller read."""
    assert host.client is not None
    tags = [f"sh.{i}" for i in range(7)]
    group = effect_group(
        "shards:group:seven:0",
        [step(tag, result=i) for i, tag in enumerate(tags)],
        WakePolicy.ALL,
        LoserPolicy.CANCEL,
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

    assert (await rederived(await wf.fetch_history()))["ranks"] == expected


@pytest.mark.timeout(120)
@on_host()
async def test_event_delivered_before_the_shards_start_reaches_its_waiter(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """R-5, G-51: an event delivered to a sharded group before the shard holding its
    waiter has started still settles that waiter. The open and the delivery are both
    admitted before any worker polls, so the run applies them in its first workflow task,
    before it starts a shard: the event must wait for its shard, not be signalled to a
    workflow that does not exist yet. One child per shard: an ``await_event`` child and a
    gated tool call; the event takes rank 1, and the run's history replays."""
    client = host.client
    assert client is not None
    queue = f"{host.task_queue}-early"
    ctl = TemporalEffectHost(client, queue, host.resolver(), shard_size=1)
    group = EffectGroup(
        key="shards:early-event:0",
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[
            EffectEnvelope(replay_key="ev", kind=EffectKind.AWAIT_EVENT, name="go", input=None),
            step("held"),
        ],
    )
    opening = asyncio.create_task(ctl.open_effect_group(group))
    wf = client.get_workflow_handle(group.key)
    await _eventually(wf.describe)
    delivering = asyncio.create_task(
        wf.execute_update(
            EffectGroupWorkflow.deliver,
            args=["go", {"n": 1}],
            id="early-event",
        )
    )
    await _eventually(lambda: _admitted(client, group.key, "early-event"))
    async with create_worker(client, queue, host.resolver()):
        handle = await asyncio.wait_for(opening, 30)
        assert await asyncio.wait_for(delivering, 30) == 1
        try:
            first = await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
        except TimeoutError:
            pytest.fail("the event delivered before the shards started settled nothing")
        assert (first.replay_key, first.rank) == ("ev", 1)
        assert first.outcome.value == {"n": 1}
        await asyncio.wait_for(ctl.close_effect_group(handle), 30)
        await asyncio.wait_for(wf.result(), 30)
        await ctl.aclose()
    await replays_clean(await wf.fetch_history())


async def _admitted(client: Client, key: str, update_id: str) -> None:
    """Returns once the server has admitted update ``update_id`` of ``key``."""
    await client.workflow_service.poll_workflow_execution_update(
        PollWorkflowExecutionUpdateRequest(
            namespace=client.namespace,
            update_ref=UpdateRef(
                workflow_execution=WorkflowExecution(workflow_id=key), update_id=update_id
            ),
            wait_policy=WaitPolicy(lifecycle_stage=_ADMITTED),
        ),
        timeout=timedelta(seconds=2),
    )


async def _eventually(probe: Callable[[], Awaitable[Any]], bound: float = 30.0) -> None:
    """Hang guard: ``probe`` retried (while it raises "not found") until it answers."""
    deadline = time.monotonic() + bound
    while True:
        try:
            await probe()
            return
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.DEADLINE_EXCEEDED):
                raise
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
@on_host()
async def test_a_shard_reports_at_once_then_gathers_its_reports(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-21, G-43, G-15: with ``shard_signal_interval`` a shard's first settlement still
    reaches the group at once, the settlements it observes within the interval after a
    report go to the group together (one signal), its last report goes as soon as its
    children end, and a settlement left alone in the interval goes at the interval's end
    while the shard's other children still run. The group's history replays and
    re-derives the ranks the caller read."""
    client = host.client
    assert client is not None

    def group(key: str, prefix: str) -> EffectGroup:
        return EffectGroup(
            key=key,
            wake=WakePolicy.ALL,
            disposition=LoserPolicy.CANCEL,
            children=[step(f"{prefix}.{i}", result=i) for i in range(5)],
        )

    async def next_key(ctl: TemporalEffectHost, handle: Any) -> str:
        return (await asyncio.wait_for(ctl.await_next_settlement(handle), 20)).replay_key

    # An interval longer than every wait below: a report that waited for it would
    # time the read out.
    slow = TemporalEffectHost(
        client, host.task_queue, host.resolver(), shard_size=4, shard_signal_interval=50
    )
    gathered = group("shards:gathered:0", "ga")
    handle = await slow.open_effect_group(gathered)
    lab.open("ga.0")
    assert await next_key(slow, handle) == "ga.0"  # the first report: at once
    for tag in ("ga.1", "ga.2"):
        lab.open(tag)
        await lab.wait_for("finished", tag, timeout=20)
    lab.open("ga.3")  # the shard's last child: its end sends what it gathered
    assert [await next_key(slow, handle) for _ in range(3)] == ["ga.1", "ga.2", "ga.3"]
    lab.open("ga.4")
    assert await next_key(slow, handle) == "ga.4"
    await asyncio.wait_for(slow.close_effect_group(handle), 30)
    wf = client.get_workflow_handle(gathered.key)
    result = await asyncio.wait_for(wf.result(), 30)
    shard = await client.get_workflow_handle(shard_id(gathered.key, 0)).fetch_history()
    signals = [
        e
        for e in shard.events
        if e.HasField("signal_external_workflow_execution_initiated_event_attributes")
    ]
    assert len(signals) == 2  # [ga.0], then [ga.1, ga.2, ga.3]
    assert (await rederived(await wf.fetch_history()))["ranks"] == result["ranks"]

    paced = TemporalEffectHost(
        client, host.task_queue, host.resolver(), shard_size=4, shard_signal_interval=5
    )
    alone = group("shards:gathered:1", "gb")
    handle = await paced.open_effect_group(alone)
    lab.open("gb.0")
    assert await next_key(paced, handle) == "gb.0"
    lab.open("gb.1")  # within the interval after the first report; gb.2, gb.3 still run
    assert await next_key(paced, handle) == "gb.1"
    lab.open_all("gb.")
    assert {await next_key(paced, handle) for _ in range(3)} == {"gb.2", "gb.3", "gb.4"}
    await asyncio.wait_for(paced.close_effect_group(handle), 30)
    await asyncio.wait_for(client.get_workflow_handle(alone.key).result(), 30)
    shard = await client.get_workflow_handle(shard_id(alone.key, 0)).fetch_history()
    # gb.1 went when the interval's timer fired, not with the shard's end
    assert any(e.HasField("timer_fired_event_attributes") for e in shard.events)
    for ctl in (slow, paced):
        await ctl.aclose()


def _scheduled_per_task(history: Any) -> list[int]:
    """How many children's activities each completed workflow task of ``history``
    scheduled (not the retirement's)."""
    counts: list[int] = []
    for event in history.events:
        if event.HasField("workflow_task_completed_event_attributes"):
            counts.append(0)
        elif event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            counts[-1] += scheduled.activity_type.name == CHILD_ACTIVITY
    return counts


@pytest.mark.timeout(180)
@on_host()
async def test_a_shard_starts_its_children_a_slice_per_workflow_task(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-43 (a wide group must not stall its worker): a shard starts at most
    ``shard_start_slice`` children per workflow task, so a wide group's shards do not
    each schedule their whole slice in their first task at once (ten shards of 1,000 did,
    and those tasks ran past the server's task timeout under load, and past the SDK's
    deadlock detector, whose failed evictions left shards stalled for good). Every
    child still runs and ranks, and the shards' histories replay."""
    client = host.client
    assert client is not None
    ctl = TemporalEffectHost(
        client, host.task_queue, host.resolver(), shard_size=5, shard_start_slice=2
    )
    group = effect_group(
        "shards:sliced:0",
        [step(f"sl.{i}", gate=False, result=i) for i in range(10)],
        WakePolicy.ALL,
        LoserPolicy.RUN_TO_COMPLETION,
    )
    handle = await ctl.open_effect_group(group)
    got = {
        (await asyncio.wait_for(ctl.await_next_settlement(handle), 30)).replay_key
        for _ in range(10)
    }
    assert got == {f"sl.{i}" for i in range(10)}
    await asyncio.wait_for(ctl.close_effect_group(handle), 30)
    await asyncio.wait_for(client.get_workflow_handle(group.key).result(), 30)
    replayer = Replayer(workflows=[EffectShardWorkflow], workflow_runner=workflow_runner())
    for index in range(2):
        history = await client.get_workflow_handle(shard_id(group.key, index)).fetch_history()
        per_task = _scheduled_per_task(history)
        assert sum(per_task) == 5 and max(per_task) <= 2, per_task
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


def test_a_start_slice_below_one_is_refused() -> None:
    """G-43: a shard must start at least one child per workflow task."""
    with pytest.raises(ValueError, match="shard_start_slice"):
        TemporalEffectHost(object(), "plan", shard_start_slice=0)  # type: ignore[arg-type]


@pytest.mark.timeout(180)
@on_host()
async def test_a_group_run_starts_its_children_a_slice_per_workflow_task(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-43 (as for shards): a group in one workflow starts at most ``shard_start_slice``
    children per workflow task too; every child runs and ranks, and a replay of the
    group's history re-derives the ranks the caller read."""
    client = host.client
    assert client is not None
    ctl = TemporalEffectHost(client, host.task_queue, host.resolver(), shard_start_slice=2)
    group = effect_group(
        "shards:sliced-run:0",
        [step(f"sr.{i}", gate=False, result=i) for i in range(5)],
        WakePolicy.ALL,
        LoserPolicy.RUN_TO_COMPLETION,
    )
    handle = await ctl.open_effect_group(group)
    got = [
        (await asyncio.wait_for(ctl.await_next_settlement(handle), 30)).replay_key for _ in range(5)
    ]
    assert sorted(got) == [f"sr.{i}" for i in range(5)]
    await asyncio.wait_for(ctl.close_effect_group(handle), 30)
    wf = client.get_workflow_handle(group.key)
    result = await asyncio.wait_for(wf.result(), 30)
    assert result["ranks"] == got
    history = await wf.fetch_history()
    per_task = _scheduled_per_task(history)
    assert sum(per_task) == 5 and max(per_task) <= 2, per_task
    assert (await rederived(history))["ranks"] == got


@pytest.mark.timeout(180)
@on_host()
async def test_a_cancel_close_ranks_the_children_of_slices_not_started(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-27, G-43: a ``CANCEL`` close while a group's later slices wait to start ranks
    their children as cancelled in the close, and they never start; the run then ends
    without waiting out the pace. (The pace between slices is stretched to an hour
    through the recorded option, so the close surely comes first.)"""
    client = host.client
    assert client is not None
    ctl = TemporalEffectHost(client, host.task_queue, host.resolver(), shard_start_slice=2)
    ctl._options["start_pace"] = 3600.0
    tags = [f"sp.{i}" for i in range(5)]
    group = effect_group(
        "shards:sliced-cancel:0", [step(t) for t in tags], WakePolicy.ALL, LoserPolicy.CANCEL
    )
    handle = await ctl.open_effect_group(group)
    for tag in tags[:2]:
        await lab.wait_for("started", tag, timeout=30)
    await asyncio.wait_for(ctl.close_effect_group(handle), 30)
    wf = client.get_workflow_handle(group.key)
    result = await asyncio.wait_for(wf.result(), 60)
    assert sorted(result["ranks"]) == tags
    assert [lab.count("started", t) for t in tags] == [1, 1, 0, 0, 0]
    history = await wf.fetch_history()
    assert sum(_scheduled_per_task(history)) == 2
    assert (await rederived(history))["ranks"] == result["ranks"]


@pytest.mark.timeout(180)
@on_host()
async def test_a_cancel_close_reaches_the_children_of_shard_slices_not_started(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-27, G-43: a ``CANCEL`` close while each shard's later slices wait to start ranks
    their children as cancelled, they never start, and the shards end without waiting
    out the pace (stretched to an hour through the recorded option, so the close surely
    comes first)."""
    client = host.client
    assert client is not None
    ctl = TemporalEffectHost(
        client, host.task_queue, host.resolver(), shard_size=5, shard_start_slice=2
    )
    ctl._options["start_pace"] = 3600.0
    tags = [f"sq.{i}" for i in range(10)]
    group = effect_group(
        "shards:sliced-cancel:1", [step(t) for t in tags], WakePolicy.ALL, LoserPolicy.CANCEL
    )
    handle = await ctl.open_effect_group(group)
    first = ["sq.0", "sq.1", "sq.5", "sq.6"]  # each shard's first slice
    for tag in first:
        await lab.wait_for("started", tag, timeout=30)
    await asyncio.wait_for(ctl.close_effect_group(handle), 30)
    result = await asyncio.wait_for(client.get_workflow_handle(group.key).result(), 60)
    assert sorted(result["ranks"]) == sorted(tags)
    assert [t for t in tags if lab.count("started", t)] == first
    for index in range(2):
        history = await client.get_workflow_handle(shard_id(group.key, index)).fetch_history()
        assert sum(_scheduled_per_task(history)) == 2


@pytest.mark.timeout(180)
@on_host()
async def test_a_timer_of_a_later_slice_keeps_its_deadline(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-43: a ``sleep`` child that a paced run starts in a later slice fires when it
    would have, had every child started at once: its timer is its duration less the time
    since the run started its first slice (read from the run's history: every timer a
    child started ends at the same instant, within the server's timer granularity)."""
    client = host.client
    assert client is not None
    ctl = TemporalEffectHost(client, host.task_queue, host.resolver(), shard_start_slice=1)
    group = effect_group(
        "shards:sliced-timers:0",
        [timer(f"st.{i}", seconds=3.0) for i in range(3)],
        WakePolicy.ALL,
        LoserPolicy.RUN_TO_COMPLETION,
    )
    handle = await ctl.open_effect_group(group)
    for _ in range(3):
        await asyncio.wait_for(ctl.await_next_settlement(handle), 30)
    await asyncio.wait_for(ctl.close_effect_group(handle), 30)
    history = await client.get_workflow_handle(group.key).fetch_history()
    deadlines = []
    for event in history.events:
        if event.HasField("timer_started_event_attributes"):
            if b"next slice" in event.user_metadata.summary.data:
                continue  # the pace's own timer, not a child's
            fire = event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            deadlines.append(event.event_time.ToDatetime() + fire)
    assert len(deadlines) == 3, deadlines
    assert max(deadlines) - min(deadlines) < timedelta(seconds=0.5), deadlines
