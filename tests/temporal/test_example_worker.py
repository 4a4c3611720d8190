"""examples/temporal_worker runs as its README says: a worker process registered with one
call, and a separate caller process running a race and an all."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from effecthost.hosts.temporal.testing import DevServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "temporal_worker"

pytestmark = pytest.mark.anyio


def _worker(address: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "worker.py", "--address", address, "--task-queue", "example"],
        cwd=EXAMPLE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _caller(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "caller.py", "--address", address, "--task-queue", "example"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as a process manager stops it; its exit code (SIGKILL after a bound)."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError("the example worker still ran 15 s after SIGTERM") from None


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
        assert await asyncio.to_thread(_stop, worker) == 0
    finally:
        await asyncio.to_thread(_stop, worker)
        await server.stop()
