"""SIGTERM stops ``python -m effecthost.hosts.restate.serve`` within its grace, and what
it cut off is re-invoked by Restate on the next endpoint: each child settles once, ranks
intact (G-15)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from group_support import group as effect_group
from group_support import tool
from restate_stack import Stack, running_stack, step
from stubborn_tools import STUBBORN
from stubborn_tools import registry as stubborn_registry

from effecthost.contract import (
    CursorExhausted,
    group_key,
)
from effecthost.hosts._shutdown import FORCE_AFTER

TESTS = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
TIMEOUT = 20.0
GRACE = 1.0
MARGIN = 4.0
"""How long past its grace an endpoint may take to exit (interpreter teardown)."""


@pytest.fixture
async def short_grace(tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path, endpoint_args=["--grace", str(GRACE)]) as built:
        yield built


@pytest.fixture
async def stubborn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    """An endpoint serving a tool that a cancel cannot stop."""
    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    async with running_stack(
        tmp_path,
        resolver="stubborn_tools:registry",
        endpoint_args=["--grace", str(GRACE)],
        executors=stubborn_registry(str(tmp_path / "lab")),
    ) as built:
        yield built


async def _terminate(process: subprocess.Popen[bytes] | None, bound: float) -> tuple[int, float]:
    """SIGTERM ``process``; its exit code and how long it took (a hang guard of ``bound``)."""
    assert process is not None and process.poll() is None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(process.wait, bound)
    except subprocess.TimeoutExpired:
        process.kill()
        await asyncio.to_thread(process.wait, 10.0)
        raise AssertionError(f"the endpoint still ran {bound}s after SIGTERM") from None
    return code, time.monotonic() - started


async def test_sigterm_stops_a_serving_endpoint(stack: Stack) -> None:
    """G-15: a serving endpoint (one child ran through it) exits 0 on SIGTERM, within its
    default grace: what container runtimes and process managers send."""
    group = effect_group(group_key("term", "idle", 0), [step("term.idle", gate=False)])
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    settled = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert settled.outcome.ok
    await ctl.close_effect_group(handle)

    code, took = await _terminate(stack.local.endpoint, 5.0 + MARGIN)
    assert code == 0, (code, took)


async def test_sigterm_mid_child_is_retried_by_the_next_endpoint(short_grace: Stack) -> None:
    """G-15, G-35: SIGTERM while a child runs; the endpoint exits 0 within its grace
    (abandoning the child); Restate re-invokes it on the next endpoint, and the group gets
    exactly one settlement per child, the rank recorded before the stop unchanged."""
    stack = short_grace
    group = effect_group(
        group_key("term", "busy", 0),
        [step("term.done", gate=False, result=0), step("term.held", result=1)],
    )
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (first.rank, first.replay_key) == (1, "term.done")
    await stack.lab.wait_for("started", "term.held", 1, TIMEOUT)

    code, took = await _terminate(stack.local.endpoint, GRACE + MARGIN)
    assert code == 0, (code, took)
    assert stack.lab.count("finished", "term.held") == 0

    await stack.local.start_endpoint()  # same URI: the registration holds
    await stack.lab.wait_for("started", "term.held", 2, TIMEOUT)
    stack.lab.open("term.held")
    second = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (second.rank, second.replay_key, second.outcome.ok) == (2, "term.held", True)
    with pytest.raises(CursorExhausted):
        await ctl.await_next_settlement(handle)
    again = await ctl.open_effect_group(group)  # a fresh cursor reads the same ranks
    ranks = [await asyncio.wait_for(ctl.await_next_settlement(again), TIMEOUT) for _ in range(2)]
    assert [(s.rank, s.replay_key) for s in ranks] == [(1, "term.done"), (2, "term.held")]
    assert stack.lab.count("finished", "term.held") == 1
    assert stack.lab.count("finished", "term.done") == 1
    await ctl.close_effect_group(again)


async def test_sigterm_lets_a_child_finish_within_the_grace(short_grace: Stack) -> None:
    """G-15: a child that finishes while the endpoint drains is recorded once by that
    endpoint; the process still exits 0 within its grace."""
    stack = short_grace
    group = effect_group(group_key("term", "finish", 0), [step("term.finish", result=7)])
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    await stack.lab.wait_for("started", "term.finish", 1, TIMEOUT)
    endpoint = stack.local.endpoint
    assert endpoint is not None
    endpoint.send_signal(signal.SIGTERM)
    stack.lab.open("term.finish")
    await stack.lab.wait_for("finished", "term.finish", 1, TIMEOUT)
    code = await asyncio.to_thread(endpoint.wait, GRACE + MARGIN)
    assert code == 0
    await stack.local.start_endpoint()
    settled = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (settled.rank, settled.outcome.ok) == (1, True)
    assert stack.lab.count("started", "term.finish") == 1
    await ctl.close_effect_group(handle)


async def test_sigterm_leaves_a_child_blocking_a_thread(stubborn: Stack) -> None:
    """G-15: a tool whose work goes on in a thread after the cut-off (as a blocking client
    call does) cannot hold the endpoint: it exits 0 a bounded time after its grace, and
    the next endpoint re-runs the child, which settles once."""
    stack = stubborn
    child = tool("term.stubborn", {"tag": "term.stubborn", "result": 3}, name=STUBBORN)
    group = effect_group(group_key("term", "stubborn", 0), [child])
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    await stack.lab.wait_for("started", "term.stubborn", 1, TIMEOUT)

    code, took = await _terminate(stack.local.endpoint, GRACE + FORCE_AFTER + MARGIN)
    assert code == 0, (code, took)
    assert stack.lab.count("cancelled", "term.stubborn") == 1  # cut off; its thread held on

    await stack.local.start_endpoint()
    await stack.lab.wait_for("started", "term.stubborn", 2, TIMEOUT)
    stack.lab.open("term.stubborn")
    settled = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (settled.rank, settled.outcome.ok) == (1, True)
    with pytest.raises(CursorExhausted):
        await ctl.await_next_settlement(handle)
    assert stack.lab.count("finished", "term.stubborn") == 1
    await ctl.close_effect_group(handle)
