"""Ranks are read in batches (G-44): one request serves every rank recorded after the
cursor, so reading a group costs requests per batch, not per rank."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from group_support import group as effect_group
from group_support import race as race_group
from temporalio.service import RPCError, RPCStatusCode

from effecthost.conformance._lab import Lab
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step


def _counted(ctl: TemporalEffectHost) -> Counter[str]:
    """Count the queries and updates ``ctl`` sends to its group workflows."""
    calls: Counter[str] = Counter()
    query, update = ctl._query, ctl._update

    async def counted_query(*args: Any, **kwargs: Any) -> Any:
        calls["query"] += 1
        return await query(*args, **kwargs)

    async def counted_update(*args: Any, **kwargs: Any) -> Any:
        calls["update"] += 1
        return await update(*args, **kwargs)

    ctl._query = counted_query  # type: ignore[method-assign]
    ctl._update = counted_update  # type: ignore[method-assign]
    return calls


@pytest.mark.timeout(120)
@on_host()
async def test_recorded_ranks_are_read_in_one_batch(host: TemporalHostUnderTest, lab: Lab) -> None:
    """G-44, G-15: a reader with only the handle reads 20 recorded ranks with one query
    (not one per rank), in rank order; the group's opener reads a race's first rank and
    closes without any query and with one update, the waiting one (its close is a
    signal, see test_signal_close.py); when the run's update budget is spent, a read
    waits by querying instead."""
    assert host.client is not None
    tags = [f"br.{i}" for i in range(20)]
    group = effect_group(
        "reads:group:batch:0", [step(tag, gate=False, result=i) for i, tag in enumerate(tags)]
    )
    opener = await host.controller()
    await opener.open_effect_group(group)
    wf = host.client.get_workflow_handle(group.key)
    last = await asyncio.wait_for(wf.execute_update("await_rank:20", id="test-last"), 30)
    assert last["rank"] == 20

    reader = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    calls = _counted(reader)
    handle = group.handle()
    read = [(await reader.await_next_settlement(handle)).replay_key for _ in tags]
    assert read == [s["replay_key"] for s in await reader.recorded_settlements(group.key)]
    assert sorted(read) == sorted(tags)
    assert calls == Counter(query=2), calls  # one batch, plus the settled listing
    await reader.close_effect_group(handle)

    race = race_group("reads:group:race:0", [step("br.win", gate=False), step("br.lose")])
    assert isinstance(opener, TemporalEffectHost)
    calls = _counted(opener)
    handle = await opener.open_effect_group(race)
    first = await asyncio.wait_for(opener.await_next_settlement(handle), 30)
    assert first.replay_key == "br.win"
    await opener.close_effect_group(handle)
    assert calls == Counter(update=1), calls

    # a run whose update budget is spent: the read falls back to queries
    spent = effect_group("reads:group:spent:0", [step("br.late", result=1)])
    handle = await opener.open_effect_group(spent)
    poller = TemporalEffectHost(host.client, host.task_queue, host.resolver())

    async def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise RPCError("update budget spent", RPCStatusCode.RESOURCE_EXHAUSTED, b"")

    poller._update = exhausted  # type: ignore[method-assign]
    waiter = asyncio.ensure_future(poller.await_next_settlement(handle.copy_cursor()))
    await lab.wait_for("started", "br.late", timeout=30)
    assert not waiter.done()
    lab.open("br.late")
    assert (await asyncio.wait_for(waiter, 30)).replay_key == "br.late"
    await opener.close_effect_group(handle)


@pytest.mark.timeout(120)
@on_host()
async def test_more_waiting_readers_than_in_flight_updates(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-44, R-4: every waiting read sends an update id of its own, so twelve readers
    waiting at once exceed the run's ten in-flight updates; the server refuses the extra
    ones (``RESOURCE_EXHAUSTED``), those wait by querying, and every reader gets rank 1."""
    assert host.client is not None
    group = effect_group("reads:group:crowd:0", [step("cr.late", result=1)])
    opener = await host.controller()
    handle = await opener.open_effect_group(group)
    refused: list[RPCStatusCode] = []
    two_refused = asyncio.Event()
    readers = [TemporalEffectHost(host.client, host.task_queue, host.resolver()) for _ in range(12)]
    for reader in readers:
        update = reader._update

        async def noted(*args: Any, _update: Any = update, **kwargs: Any) -> Any:
            try:
                return await _update(*args, **kwargs)
            except RPCError as exc:
                refused.append(exc.status)
                if len(refused) == 2:
                    two_refused.set()
                raise

        reader._update = noted  # type: ignore[method-assign]
    waiters = [
        asyncio.ensure_future(r.await_next_settlement(handle.copy_cursor())) for r in readers
    ]
    await lab.wait_for("started", "cr.late", timeout=30)
    await asyncio.wait_for(two_refused.wait(), 30)
    assert refused == [RPCStatusCode.RESOURCE_EXHAUSTED] * 2
    assert not any(w.done() for w in waiters)
    lab.open("cr.late")
    read = await asyncio.wait_for(asyncio.gather(*waiters), 30)
    assert [s.replay_key for s in read] == ["cr.late"] * 12
    await opener.close_effect_group(handle)
