"""No blocked pipes: a worker started by ``testing.WorkerProcess`` keeps serving however
much it writes to stdout and stderr after its ``ready`` line (the SDK's core writes WARN
lines to stdout; a pipe nobody reads blocks the writer after about 64 KiB)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from group_support import group as effect_group

from effecthost.contract import EffectEnvelope, EffectKind
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import DevServer, WorkerProcess

from . import noisy_tools
from ._support import require_cli

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


@pytest.mark.timeout(120)
def test_a_worker_writing_megabytes_to_stdout_and_stderr_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 (no blocked pipes): each of three children makes the worker write 1.5 MiB
    to stdout and to stderr; the group completes, and the output is in the worker's log."""
    require_cli()
    paths = [str(HERE), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    asyncio.run(_noisy_group(tmp_path))


async def _noisy_group(root: Path) -> None:
    size = 3 * MIB // 2
    server = DevServer(root / "temporal")
    client = await server.start()
    queue = f"pipes-{uuid.uuid4().hex[:8]}"
    log = root / "worker.log"
    worker = WorkerProcess(server.address, "default", queue, root, log)
    at = worker.argv.index("--resolver")
    worker.argv[at + 1 : at + 4] = ["noisy_tools:registry", "--resolver-arg", str(size)]
    try:
        await worker.start()
        host = TemporalEffectHost(client, queue, noisy_tools.registry(str(size)))
        group = effect_group(
            f"pipes:group:{uuid.uuid4().hex[:8]}:0",
            [
                EffectEnvelope(
                    replay_key=f"pipes.{i}", kind=EffectKind.TOOL_CALL, name="noisy", input=i
                )
                for i in range(3)
            ],
        )
        handle = await host.open_effect_group(group)
        ranks = [await asyncio.wait_for(host.await_next_settlement(handle), 60) for _ in range(3)]
        await host.close_effect_group(handle)
        assert sorted(s.outcome.value for s in ranks) == [0, 1, 2]
    finally:
        await worker.terminate()
        await server.stop()
    assert log.stat().st_size >= 2 * 3 * size  # stdout and stderr of three children
