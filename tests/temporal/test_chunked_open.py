"""A group whose encoded children exceed one workflow input opens in chunks: the run
starts with the group's shape and digests, the children follow in chunk updates, and no
child runs until every chunk is recorded (G-08, G-10, G-13, G-02, G-43).

The chunk size is a controller option, lowered here so a small group needs several chunks;
one test opens a group over Temporal's real 2 MiB payload limit with the defaults."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from group_support import group as effect_group
from temporalio.api.enums.v1 import EventType

from effecthost.conformance import STEP, step_input
from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupShapeMismatch,
    LoserPolicy,
    ReplayMismatch,
    UnknownGroup,
    WakePolicy,
)
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, rederived, step

_STARTED_WORK = (
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
    EventType.EVENT_TYPE_TIMER_STARTED,
)


def _group(key: str, count: int, *, pad: int = 0, changed: int | None = None) -> EffectGroup:
    children = []
    for i in range(count):
        tag = f"{key}.c{i}"
        data: Any = {"i": i, "pad": "p" * pad} if pad else i
        if i == changed:
            data = {"i": i, "changed": True}
        children.append(
            EffectEnvelope(
                replay_key=tag,
                kind=EffectKind.TOOL_CALL,
                name=STEP,
                input=step_input(tag, gate=False, result=data),
            )
        )
    return effect_group(f"chunked:group:{key}:0", children, WakePolicy.ALL, LoserPolicy.CANCEL)


async def _opens(wf: Any) -> list[str]:
    """The names of the open and chunk updates history accepted."""
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in (await wf.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        in ("open", "open_chunk")
    ]


async def _drain(ctl: TemporalEffectHost, group: EffectGroup) -> list[str]:
    handle = group.handle()
    keys = []
    for _ in range(group.child_count):
        settlement = await asyncio.wait_for(ctl.await_next_settlement(handle), 60)
        keys.append(settlement.replay_key)
    await ctl.close_effect_group(handle)
    return keys


@pytest.mark.timeout(180)
@on_host()
async def test_group_over_the_chunk_size_opens_in_chunks_and_replays(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """G-08, G-13, G-02, G-43: a group several chunks wide opens (the start input holds
    no child; the children arrive in chunk updates), runs in shards and ranks every child
    once; a reopen of the same group matches the fence; another shape is
    GroupShapeMismatch and another child ReplayMismatch naming its position, each leaving
    history unchanged; the group's history replays and re-derives the ranks."""
    assert host.client is not None
    group = _group("wide", 30, pad=200)
    ctl = TemporalEffectHost(
        host.client, host.task_queue, host.resolver(), shard_size=7, chunk_bytes=3000
    )
    handle = await ctl.open_effect_group(group)
    wf = host.client.get_workflow_handle(group.key)
    events = (await wf.fetch_history()).events
    start = events[0].workflow_execution_started_event_attributes
    assert start.input.payloads[0].ByteSize() < 3000
    assert (await _opens(wf)).count("open_chunk") >= 3

    other = TemporalEffectHost(host.client, host.task_queue, host.resolver(), chunk_bytes=5000)
    again = await other.open_effect_group(group)  # another chunking, same children
    assert again.child_count == group.child_count
    before = await _opens(wf)
    with pytest.raises(ReplayMismatch) as raised:
        await other.open_effect_group(_group("wide", 30, pad=200, changed=17))
    assert raised.value.position == 17
    with pytest.raises(GroupShapeMismatch):
        wider = _group("wide", 31, pad=200)
        await other.open_effect_group(wider)
    assert await _opens(wf) == before

    ranks = []
    for _ in range(group.child_count):
        settlement = await asyncio.wait_for(ctl.await_next_settlement(handle), 60)
        ranks.append(settlement.replay_key)
    assert sorted(ranks) == sorted(c.replay_key for c in group.children)
    await ctl.close_effect_group(handle)
    result = await asyncio.wait_for(wf.result(), 60)
    assert result["ranks"] == ranks

    assert (await rederived(await wf.fetch_history()))["ranks"] == ranks
    await ctl.aclose()
    await other.aclose()


class _CallerDied(Exception):
    pass


@pytest.mark.timeout(180)
@on_host()
async def test_partial_open_runs_nothing_until_the_same_open_completes_it(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-10, G-08, G-13: a caller that dies after recording part of a chunked open
    leaves a group that runs nothing and serves nothing (UnknownGroup); a worker SIGKILL
    then changes nothing; an open with other children is ReplayMismatch; a retry of the
    same open completes it and every child runs and ranks exactly once."""
    assert host.client is not None
    group = effect_group(
        "chunked:group:partial:0", [step(f"part.{i}", result=i, gate=False) for i in range(12)]
    )
    dying = TemporalEffectHost(
        host.client, host.task_queue, host.resolver(), shard_size=5, chunk_bytes=1500
    )
    sent = 0
    send = dying._send_chunk

    async def die_after_one(*args: Any) -> None:
        nonlocal sent
        if sent == 1:
            raise _CallerDied
        sent += 1
        await send(*args)

    dying._send_chunk = die_after_one  # type: ignore[method-assign]
    with pytest.raises(_CallerDied):
        await dying.open_effect_group(group)
    await dying.aclose()

    await host.restart()  # SIGKILL the worker mid-open; a new one starts
    assert host.client is not None
    retry = TemporalEffectHost(
        host.client, host.task_queue, host.resolver(), shard_size=5, chunk_bytes=1500
    )
    with pytest.raises(UnknownGroup):
        await asyncio.wait_for(retry.await_next_settlement(group.handle()), 30)
    with pytest.raises(UnknownGroup):
        await retry.close_effect_group(group.handle())
    changed = effect_group(
        group.key,
        [step(f"part.{i}", result=i + 100, gate=False) for i in range(12)],
        group.wake,
        group.disposition,
    )
    with pytest.raises(ReplayMismatch):
        await retry.open_effect_group(changed)
    wf = host.client.get_workflow_handle(group.key)
    events = (await wf.fetch_history()).events
    assert not [e for e in events if e.event_type in _STARTED_WORK]
    assert lab.count("started", "part.0") == 0

    handle = await retry.open_effect_group(group)
    keys = []
    for _ in range(group.child_count):
        keys.append((await asyncio.wait_for(retry.await_next_settlement(handle), 60)).replay_key)
    assert sorted(keys) == sorted(c.replay_key for c in group.children)
    for child in group.children:
        assert lab.count("started", child.replay_key) == 1
    await retry.close_effect_group(handle)
    await asyncio.wait_for(wf.result(), 60)
    await retry.aclose()


@pytest.mark.timeout(240)
@on_host()
async def test_group_over_the_payload_limit_opens_with_the_defaults(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """G-08, G-43: a group whose encoded children exceed Temporal's 2 MiB payload limit
    opens with the default controller, runs and ranks every child."""
    assert host.client is not None
    group = _group("big", 240, pad=10_000)
    assert len(group.model_dump_json()) > 2 * 1024 * 1024
    ctl = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    await ctl.open_effect_group(group)
    keys = await _drain(ctl, group)
    assert sorted(keys) == sorted(c.replay_key for c in group.children)
    await ctl.aclose()
