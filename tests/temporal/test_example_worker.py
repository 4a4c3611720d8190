"""examples/temporal_worker runs as its README says: a worker process registered with one
call, and a separate caller process running a race and an all."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from example_support import run_script, start_script, stop_script

from effecthost.hosts.temporal.testing import DevServer

pytestmark = pytest.mark.anyio


def _worker(address: str) -> subprocess.Popen[bytes]:
    return start_script(
        "temporal_worker", "worker.py", "--address", address, "--task-queue", "example"
    )


def _caller(address: str) -> subprocess.CompletedProcess[str]:
    return run_script(
        "temporal_worker", "caller.py", "--address", address, "--task-queue", "example"
    )


@pytest.mark.timeout(240)
async def test_the_temporal_example_runs_as_documented(tmp_path: Path) -> None:
    server = DevServer(tmp_path)
    await server.start()
    worker = await asyncio.to_thread(_worker, server.address)
    try:
        run = await asyncio.to_thread(_caller, server.address)
        assert run.returncode == 0, run.stderr
        assert "race -> " in run.stdout and "fast.example" in run.stdout
        assert "all  -> ['https://example.org/0'" in run.stdout
        assert "open groups: []" in run.stdout
        # G-15: it shuts down cleanly on SIGTERM (what container runtimes send)
        assert await asyncio.to_thread(stop_script, worker) == 0
    finally:
        await asyncio.to_thread(stop_script, worker)
        await server.stop()
