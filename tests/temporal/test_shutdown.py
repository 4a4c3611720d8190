"""SIGTERM stops ``python -m effecthost.hosts.temporal.worker`` within its grace (the
worker's graceful shutdown), and a child it cut off is retried by Temporal on the next
worker: each child settles once, ranks intact (G-15)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from group_support import group as effect_group
from stubborn_tools import STUBBORN
from stubborn_tools import registry as stubborn_registry
from temporalio.client import Client

from effecthost.conformance import Lab, conformance_resolver
from effecthost.contract import (
    CursorExhausted,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupExecutors,
)
from effecthost.hosts._shutdown import DEFAULT_GRACE, FORCE_AFTER
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import DevServer, WorkerProcess

from ._support import require_cli, step

TESTS = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TIMEOUT = 30.0
GRACE = 1.0
MARGIN = 5.0
"""How long past its grace a worker may take to exit (the SDK's own teardown)."""


@dataclass
class Stack:
    lab: Lab
    server: DevServer
    client: Client
    work: Path
    task_queue: str = field(default_factory=lambda: f"term-{uuid.uuid4().hex[:8]}")
    workers: list[WorkerProcess] = field(default_factory=list)

    async def worker(self, *args: str, resolver: str = "") -> WorkerProcess:
        process = WorkerProcess(
            self.server.address,
            "default",
            self.task_queue,
            self.lab.path,
            self.work / f"worker-{len(self.workers)}.log",
            list(args),
        )
        if resolver:  # another resolver, given the lab directory
            process.argv += ["--resolver", resolver]
            at = process.argv.index("--resolver-arg")
            del process.argv[at : at + 2]
            process.argv += ["--resolver-arg", str(self.lab.path)]
        self.workers.append(process)
        await process.start()
        return process

    def host(self, resolver: GroupExecutors) -> TemporalEffectHost:
        return TemporalEffectHost(self.client, self.task_queue, resolver)


@pytest.fixture
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    require_cli()
    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    lab = Lab(tmp_path / "lab")
    await lab.start()
    server = DevServer(tmp_path / "temporal")
    workers: list[WorkerProcess] = []
    try:
        yield Stack(lab, server, await server.start(), tmp_path, workers=workers)
    finally:
        lab.open_all("")
        for worker in workers:
            await worker.kill()
        await server.stop()
        await lab.stop()


async def _terminate(worker: WorkerProcess, bound: float) -> int:
    """SIGTERM the worker; its exit code (a hang guard of ``bound``)."""
    process = worker.process
    assert process is not None and process.poll() is None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        return await asyncio.to_thread(process.wait, bound)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the worker still ran {time.monotonic() - started:.1f}s after SIGTERM"
        ) from None


def _group(name: str, *children: EffectEnvelope) -> EffectGroup:
    return effect_group(f"term:{name}:batch:0", list(children))


async def test_sigterm_stops_a_polling_worker(stack: Stack) -> None:
    """G-15: a worker that ran a child exits 0 on SIGTERM within its default grace."""
    worker = await stack.worker()
    host = stack.host(conformance_resolver(stack.lab.path))
    group = _group("idle", step("term.idle", gate=False))
    handle = await host.open_effect_group(group)
    settled = await asyncio.wait_for(host.await_next_settlement(handle), TIMEOUT)
    assert settled.outcome.ok
    await host.close_effect_group(handle)
    await host.aclose()
    assert await _terminate(worker, DEFAULT_GRACE + MARGIN) == 0


async def test_sigterm_mid_child_is_retried_by_the_next_worker(stack: Stack) -> None:
    """G-15, G-35: SIGTERM while a child runs past the grace: the worker exits 0, Temporal
    retries the activity on the next worker, and the group gets one settlement per child,
    the rank recorded before the stop unchanged."""
    worker = await stack.worker("--grace", str(GRACE))
    host = stack.host(conformance_resolver(stack.lab.path))
    group = _group("busy", step("term.done", gate=False, result=0), step("term.held", result=1))
    handle = await host.open_effect_group(group)
    first = await asyncio.wait_for(host.await_next_settlement(handle), TIMEOUT)
    assert (first.rank, first.replay_key) == (1, "term.done")
    await stack.lab.wait_for("started", "term.held", 1, TIMEOUT)

    assert await _terminate(worker, GRACE + MARGIN) == 0
    assert stack.lab.count("cancelled", "term.held") == 1  # cut off at the grace
    assert stack.lab.count("finished", "term.held") == 0

    await stack.worker()
    await stack.lab.wait_for("started", "term.held", 2, TIMEOUT)
    stack.lab.open("term.held")
    second = await asyncio.wait_for(host.await_next_settlement(handle), TIMEOUT)
    assert (second.rank, second.replay_key, second.outcome.ok) == (2, "term.held", True)
    assert second.outcome.value == 1
    with pytest.raises(CursorExhausted):
        await host.await_next_settlement(handle)
    assert await host.settlement_order(group.key) == [0, 1]
    assert stack.lab.count("finished", "term.held") == 1
    await host.close_effect_group(handle)
    await host.aclose()


async def test_sigterm_lets_a_child_finish_within_the_grace(stack: Stack) -> None:
    """G-15: a child that finishes while the worker drains is recorded once (no retry);
    the worker still exits 0 within its grace."""
    worker = await stack.worker("--grace", "20")
    host = stack.host(conformance_resolver(stack.lab.path))
    handle = await host.open_effect_group(_group("finish", step("term.finish", result=7)))
    await stack.lab.wait_for("started", "term.finish", 1, TIMEOUT)
    process = worker.process
    assert process is not None
    process.send_signal(signal.SIGTERM)
    stack.lab.open("term.finish")
    assert await asyncio.to_thread(process.wait, 20 + MARGIN) == 0
    await stack.worker()  # the workflow task recording the result runs here
    settled = await asyncio.wait_for(host.await_next_settlement(handle), TIMEOUT)
    assert (settled.rank, settled.outcome.ok, settled.outcome.value) == (1, True, 7)
    assert stack.lab.count("started", "term.finish") == 1
    assert stack.lab.count("cancelled", "term.finish") == 0
    await host.close_effect_group(handle)
    await host.aclose()


async def test_sigterm_leaves_a_child_blocking_a_thread(stack: Stack) -> None:
    """G-15: a tool whose work goes on in a thread after the cut-off cannot hold the
    worker: it exits 0 a bounded time after its grace, and the next worker re-runs the
    child, which settles once."""
    resolver = "stubborn_tools:registry"
    worker = await stack.worker("--grace", str(GRACE), resolver=resolver)
    host = stack.host(stubborn_registry(str(stack.lab.path)))
    child = EffectEnvelope(
        replay_key="term.stubborn",
        kind=EffectKind.TOOL_CALL,
        name=STUBBORN,
        input={"tag": "term.stubborn", "result": 3},
    )
    handle = await host.open_effect_group(_group("stubborn", child))
    await stack.lab.wait_for("started", "term.stubborn", 1, TIMEOUT)

    assert await _terminate(worker, GRACE + FORCE_AFTER + MARGIN) == 0
    assert stack.lab.count("cancelled", "term.stubborn") == 1

    await stack.worker(resolver=resolver)
    await stack.lab.wait_for("started", "term.stubborn", 2, TIMEOUT)
    stack.lab.open("term.stubborn")
    settled = await asyncio.wait_for(host.await_next_settlement(handle), TIMEOUT)
    assert (settled.rank, settled.outcome.ok, settled.outcome.value) == (1, True, 3)
    assert stack.lab.count("finished", "term.stubborn") == 1
    await host.close_effect_group(handle)
    await host.aclose()
