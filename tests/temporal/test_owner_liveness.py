"""R-1 on Temporal: a group's owner is live while its incarnation holds its lease in the
engine, also when that incarnation is another process; a drain leaves a live owner's
group alone and takes over a SIGKILLed owner's once its lease has lapsed."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from effecthost.contract import DrainReport, EffectController

from ._live_owner import OWNER_TTL
from ._support import running_host

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
ROOT = Path(__file__).parent.parent.parent
TIMEOUT = 20.0


def _touched(report: DrainReport, key: str) -> dict[str, list[str]]:
    return {
        "resumed": sorted(rk for k, rk in report.resumed if k == key),
        "cancelled": sorted(rk for k, rk in report.cancelled if k == key),
        "no_executor": sorted(e.replay_key for e in report.no_executor if e.group_key == key),
    }


async def _pass(ctl: EffectController, key: str) -> dict[str, list[str]]:
    return _touched(await asyncio.wait_for(ctl.drain().run_pass(), TIMEOUT), key)


async def test_R1_a_drain_beside_another_live_process_leaves_its_group(tmp_path: Path) -> None:
    """R-1, G-29, G-12: another process owns a ``CANCEL`` group (a running tool call, an
    event wait, a timer): a wired drain here cancels none of its children and an
    unwired one reports none as ``NoExecutor``. Once that process is SIGKILLed and its
    owner lease has lapsed, the wired drain cancels all three."""
    async with running_host(tmp_path) as (host, lab):
        key = f"owned:{uuid.uuid4().hex[:8]}"
        path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        owner = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.temporal._live_owner",
            host.address,
            host.task_queue,
            str(lab.path),
            key,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert owner.stdout is not None
            line = await asyncio.wait_for(owner.stdout.readline(), 60)
            assert line.strip() == b"opened", line
            await lab.wait_for("started", f"{key}:tool", 1, TIMEOUT)
            wired = await host.controller()
            unwired = await host.controller(wired=False)
            nothing: dict[str, list[str]] = {"resumed": [], "cancelled": [], "no_executor": []}
            assert await _pass(wired, key) == nothing
            assert await _pass(unwired, key) == nothing
            assert lab.count("cancelled", f"{key}:tool") == 0
        finally:
            if owner.returncode is None:
                owner.kill()
            await owner.wait()
        # A bounded poll: the killed owner's lease lapses on the server's clock, OWNER_TTL
        # seconds after its last renewal; no event of ours marks that moment.
        deadline = time.monotonic() + OWNER_TTL + TIMEOUT
        while True:
            touched = await _pass(wired, key)
            if touched["cancelled"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert touched["cancelled"] == sorted(f"{key}:{x}" for x in ("tool", "ev", "nap"))
        await lab.wait_for("cancelled", f"{key}:tool", 1, TIMEOUT)
