"""Engine outages on Temporal (R-12): no exception type of the SDK leaves the API; an
await rides out a dead worker or a dead server and returns the right rank; an open, a
close or a ``deliver_event`` that cannot reach the server within the controller's
``outage_bound`` raises ``EngineUnavailable``, and a retry after the outage is fenced."""

from __future__ import annotations

import asyncio
import time
import uuid
from functools import partial
from typing import Any

import pytest
from group_support import group as effect_group

from effecthost.combinators import Scope, all_, next_group_key, race, tool
from effecthost.conformance import STEP, step_input
from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    EngineUnavailable,
    LoserPolicy,
)
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, running_host, step

WORKER_DOWN = 100.0
"""How long the worker stays dead: past the server's poller timeout, after which a read
of a group of its task queue was answered "no poller seen for task queue recently"."""


def _fresh(host: TemporalHostUnderTest, **options: Any) -> TemporalEffectHost:
    assert host.client is not None
    return TemporalEffectHost(host.client, host.task_queue, host.resolver(), **options)


@pytest.mark.timeout(120)
@on_host(partial(running_host, restart_server=True))
async def test_R12_open_close_and_deliver_raise_engine_unavailable_past_the_bound(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """R-12: with the dev server down, an open, a close and a ``deliver_event`` through a
    controller with ``outage_bound=1`` raise ``EngineUnavailable`` naming the group key and
    the operation, after trying about that long; an await with a caller deadline raises
    only ``TimeoutError``. After the restart the same calls succeed: the event reaches its
    child once, and the group whose open gave up opens and runs."""
    assert host.server is not None and host.client is not None
    ctl = _fresh(host, outage_bound=1.0)
    key = "r12:group:bounded:0"
    wait = EffectEnvelope(
        replay_key=f"{key}:0", kind=EffectKind.AWAIT_EVENT, name="ping", input=None
    )
    group = effect_group(key, [wait])
    handle = await ctl.open_effect_group(group)
    later = effect_group("r12:group:later:0", [step("r12.later", gate=False, result="L")])
    await host.server.kill()
    calls = {
        "open": lambda: ctl.open_effect_group(later),
        "close": lambda: ctl.close_effect_group(handle.copy_cursor()),
        "deliver_event": lambda: ctl.deliver_event(key, "ping", "P"),
    }
    for operation, call in calls.items():
        started = time.monotonic()
        with pytest.raises(EngineUnavailable) as down:
            await call()
        spent = time.monotonic() - started
        assert down.value.operation == operation
        assert down.value.group_key == (later.key if operation == "open" else key)
        assert 1.0 <= down.value.tried_for <= spent < 15.0, (operation, spent)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ctl.await_next_settlement(handle.copy_cursor()), 2)
    await host.server.restart(host.client)
    ctl = _fresh(host)  # the worker reconnects in its own time: the default bound
    assert await ctl.deliver_event(key, "ping", "P") == 1
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), 30)
    assert first.outcome.value == "P"
    await ctl.close_effect_group(handle)
    again = await ctl.open_effect_group(later)
    settled = await asyncio.wait_for(ctl.await_next_settlement(again), 30)
    assert settled.outcome.value == "L"
    await ctl.close_effect_group(again)


@pytest.mark.idle
@pytest.mark.timeout(300)
@on_host()
async def test_R12_a_fresh_await_rides_out_a_worker_down_past_the_poller_timeout(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """R-12: the worker is SIGKILLed for 100 s while a fresh controller awaits rank 2 of a
    saved handle, with a caller deadline at the end of the outage (re-awaiting after
    anything raised before it); everything the caller saw meanwhile is that deadline's
    ``TimeoutError`` (a query there was answered "no poller seen for task queue recently"
    after about 30 s, again and again); once a worker is back the await returns the right
    rank (the child the dead worker was running)."""
    assert host.worker is not None
    opener = await host.controller()
    key = "r12:group:worker:0"
    group = effect_group(key, [step("r12w.a"), step("r12w.b")])
    saved = await opener.open_effect_group(group)
    await lab.wait_for("started", "r12w.b")
    lab.open("r12w.a")
    first = await asyncio.wait_for(opener.await_next_settlement(saved), 30)
    assert first.replay_key == "r12w.a"
    await host.worker.kill()
    lab.open("r12w.b")  # the dead worker's child: run again by the next worker
    reader = _fresh(host)
    failures: list[BaseException] = []
    down_until = time.monotonic() + WORKER_DOWN
    settled = None
    while time.monotonic() < down_until:
        try:
            settled = await asyncio.wait_for(
                reader.await_next_settlement(saved.copy_cursor()),
                max(0.1, down_until - time.monotonic()),
            )
        except BaseException as exc:  # every type is checked below
            failures.append(exc)
    assert settled is None, "a rank was served while no worker ran"
    seen = [f"{type(e).__module__}.{type(e).__name__}: {e}" for e in failures]
    assert failures and all(type(e) is TimeoutError for e in failures), seen
    restart = asyncio.create_task(host._start_worker())
    settled = await asyncio.wait_for(reader.await_next_settlement(saved), 120)
    await restart
    assert settled.rank == 2 and settled.replay_key == "r12w.b"
    await opener.close_effect_group(saved)


def _gated(tag: str) -> Any:
    return tool(STEP, step_input(tag, gate=True, result=tag))


@pytest.mark.timeout(240)
@on_host(partial(running_host, restart_server=True))
async def test_R12_a_server_restart_mid_group_keeps_ranks(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """R-12, G-15: the dev server is SIGKILLed and restarted on its database file in the
    middle of a 20-child ``all_`` (half its children settled) and of a ``race``
    (children running): both combinators complete, the all's results are in position
    order, each child holds exactly one rank, and the race is won by its first child."""
    assert host.server is not None and host.client is not None
    ctl = await host.controller()
    scope = Scope(scope_id=f"r12-{uuid.uuid4().hex[:8]}")
    tags = [f"r12s.{i}" for i in range(20)]
    racers = ["r12s.win", "r12s.lose"]
    calls = [_gated(t) for t in tags]
    racing = [_gated(t) for t in racers]
    keys = [next_group_key(scope, calls), next_group_key(scope, racing)]
    every = asyncio.create_task(all_(ctl, scope, calls))
    first = asyncio.create_task(race(ctl, scope, racing, disposition=LoserPolicy.CANCEL))
    for tag in tags[:10]:
        lab.open(tag)
    for tag in tags[:10]:
        await lab.wait_for("finished", tag, timeout=30)
    await lab.wait_for("started", racers[0], timeout=30)
    await host.server.kill()
    for tag in tags[10:]:
        lab.open(tag)
    await host.server.restart(host.client)
    lab.open(racers[0])
    assert await asyncio.wait_for(every, 120) == tags
    assert await asyncio.wait_for(first, 120) == racers[0]
    lab.open(racers[1])
    for key, width in zip(keys, (20, 2), strict=True):
        result = await asyncio.wait_for(host.client.get_workflow_handle(key).result(), 60)
        ranks = result["ranks"]
        assert len(ranks) == width and len(set(ranks)) == width, result


@pytest.mark.anyio
async def test_an_update_the_server_rejected_as_unprocessed_is_sent_again() -> None:
    """R-12: a restarted worker can end a workflow task without taking an update up (the
    server then rejects it as ``UnprocessedUpdate``); nothing was applied, so the call is
    sent again instead of leaking an untyped ``RuntimeError`` out of an open or a close."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError

    from effecthost.hosts.temporal._controller import _call

    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise WorkflowUpdateFailedError(
                ApplicationError(
                    "Workflow Update is rejected because it wasn't processed by worker.",
                    type="UnprocessedUpdate",
                    non_retryable=True,
                )
            )
        return "applied"

    assert await _call(flaky) == "applied"
    assert calls == 3
