"""Issue 25 on the Temporal tier: a registry tool reads its child's identity with
``current_child()``; a child whose worker was SIGKILLed mid-tool is retried by the engine
(an activity retry) with the same replay key, group key and position and attempt 2."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from group_support import group as effect_group
from group_support import tool

from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import DevServer, WorkerProcess

from . import identity_tools
from ._support import require_cli

HERE = Path(__file__).resolve().parent
TIMEOUT = 60.0


@pytest.mark.timeout(180)
def test_issue25_an_activity_retry_after_a_worker_sigkill_sees_attempt_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25 (G-09): the first attempt of a child sees attempt 1; its worker is
    SIGKILLed while the tool runs and a new worker starts; the activity's retry sees the
    same replay key, group key and position with attempt 2 (``activity.info().attempt``)."""
    require_cli()
    paths = [str(HERE), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    asyncio.run(_rerun(tmp_path))


def _worker(server: DevServer, queue: str, root: Path, marks: Path) -> WorkerProcess:
    worker = WorkerProcess(server.address, "default", queue, root, root / "worker.log")
    at = worker.argv.index("--resolver")
    worker.argv[at + 1 : at + 4] = ["identity_tools:registry", "--resolver-arg", str(marks)]
    return worker


async def _rerun(root: Path) -> None:
    marks = root / "marks"
    marks.mkdir()
    server = DevServer(root / "temporal")
    client = await server.start()
    queue = f"identity-{uuid.uuid4().hex[:8]}"
    worker = _worker(server, queue, root, marks)
    try:
        await worker.start()
        host = TemporalEffectHost(client, queue, identity_tools.registry(str(marks)))
        key = f"identity:group:{uuid.uuid4().hex[:8]}:0"
        group = effect_group(key, [tool("identity.0", "identity.0", name=identity_tools.WHO)])
        handle = await host.open_effect_group(group)
        started = marks / "identity.0.started"
        deadline = time.monotonic() + TIMEOUT
        # the worker process reaching the tool (bounded); the mark is created before its
        # attempt is written in it, so an empty mark is not there yet
        while not (started.exists() and started.read_text()):
            assert time.monotonic() < deadline, "the tool never started"
            await asyncio.sleep(0.05)
        assert started.read_text() == "1"
        await worker.kill()
        worker = _worker(server, queue, root, marks)
        await worker.start()
        settled = await asyncio.wait_for(host.await_next_settlement(handle), TIMEOUT)
        assert settled.outcome.value == {
            "replay_key": "identity.0",
            "group_key": key,
            "position": 0,
            "attempt": 2,
        }
        await host.close_effect_group(handle)
        await host.aclose()
    finally:
        await worker.terminate()
        await server.stop()
