"""Short-lived Temporal caller processes exit cleanly: the SDK's native threads can crash
the interpreter while it finalizes (exit -6 ``PyGILState_Release … finalizing``, upstream
temporalio/sdk-python#300); callers end with :func:`release_temporal_runtime`.

Measured here: without it 1 of 40 and 1 of 60 callers exited -6; with it 0 of 120.
``EFFECTHOST_EXIT_CALLERS=200`` runs more (about 0.4 s per caller);
``EFFECTHOST_EXIT_WITHOUT_RELEASE=1`` shows the crash rate without the workaround."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest

from ._support import running_host

ROOT = Path(__file__).parent.parent.parent
CALLERS = int(os.environ.get("EFFECTHOST_EXIT_CALLERS", "20"))


async def _run_callers(address: str, task_queue: str, lab: str, count: int) -> list[int]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    codes: list[int] = []
    for batch in range(0, count, 4):
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.temporal._short_caller",
                address,
                task_queue,
                lab,
                f"exit:{uuid.uuid4().hex[:8]}:{i}",
                env=env,
                cwd=ROOT,
                stderr=asyncio.subprocess.PIPE,
            )
            for i in range(batch, min(batch + 4, count))
        ]
        for proc in procs:
            _, err = await asyncio.wait_for(proc.communicate(), 120)
            if proc.returncode:
                print(f"exit {proc.returncode}: {err.decode()[-400:]}")
            codes.append(proc.returncode or 0)
    return codes


@pytest.mark.anyio
@pytest.mark.timeout(600)
async def test_short_lived_callers_exit_zero(tmp_path: Path) -> None:
    """G-44 (a fresh process holding only the handle reads its rank): every one of
    ``EFFECTHOST_EXIT_CALLERS`` (default 20) fresh caller processes that open a group,
    read both ranks and return from ``asyncio.run`` exits 0."""
    async with running_host(tmp_path) as (host, lab):
        codes = await _run_callers(host.address, host.task_queue, str(lab.path), CALLERS)
    assert codes == [0] * CALLERS, codes


def test_the_cli_releases_the_runtime_after_a_temporal_factory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue: Temporal short-lived callers crash at exit (sdk-python#300): ``effecthost
    conformance`` run against a Temporal factory drops the SDK's default runtime before
    it returns, as every short-lived caller must."""
    import temporalio.runtime

    from effecthost.cli import main

    code = main(
        [
            "conformance",
            "effecthost.hosts.temporal.testing:factory",
            "-k",
            "open_group_keys_are_inspectable",
        ]
    )
    assert code == 0, capsys.readouterr().out
    assert temporalio.runtime._runtime_ref._default_runtime is None
