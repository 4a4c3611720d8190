"""SIGKILL the worker after k of n children ranked: a fresh caller holding only the
serialised handle sees ranks 1..k unchanged, and the rest settle exactly once (G-35
shape on the engine tier, G-15)."""

from __future__ import annotations

import asyncio

import pytest
from group_support import group as effect_group

from effecthost.conformance._lab import Lab
from effecthost.contract import (
    CursorExhausted,
    GroupHandle,
)
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest, connect

from ._support import on_host, step


@pytest.mark.timeout(120)
@on_host()
async def test_ranks_survive_a_worker_sigkill(host: TemporalHostUnderTest, lab: Lab) -> None:
    tags = [f"crash.c{i}" for i in range(5)]
    group = effect_group("crash:group:batch:0", [step(tag, result=i) for i, tag in enumerate(tags)])
    caller = await host.controller()
    handle = await caller.open_effect_group(group)
    for tag in tags:
        await lab.wait_for("started", tag, timeout=20)
    first_k = []
    for tag in (tags[3], tags[0]):  # k = 2, in an order unrelated to positions
        lab.open(tag)
        first_k.append(await asyncio.wait_for(caller.await_next_settlement(handle), 20))
    saved = handle.to_json()

    await host.restart()  # SIGKILL the worker; a new one starts

    assert host.client is not None
    fresh_client = await connect(host.address)
    fresh = TemporalEffectHost(fresh_client, host.task_queue, host.resolver())
    replayed = GroupHandle.from_json(saved).model_copy(update={"consumed": 0})
    for expected in first_k:
        assert await asyncio.wait_for(fresh.await_next_settlement(replayed), 20) == expected
    restored = GroupHandle.from_json(saved)
    rest = []
    for tag in (tags[4], tags[1], tags[2]):
        await lab.wait_for("started", tag, count=2, timeout=30)  # re-run on the new worker
        lab.open(tag)
        rest.append(await asyncio.wait_for(fresh.await_next_settlement(restored), 30))
    assert [s.rank for s in rest] == [3, 4, 5]
    settled = [s.replay_key for s in first_k + rest]
    assert sorted(settled) == sorted(tags), "every child settles exactly once"
    assert [s.outcome.value for s in rest] == [4, 1, 2]
    with pytest.raises(CursorExhausted):
        await fresh.await_next_settlement(restored)
    assert await fresh.settlement_order(group.key) == [3, 0, 4, 1, 2]
    await fresh.close_effect_group(restored)
    await fresh.aclose()
