"""R-1 on Restate: a group's owner is live while its incarnation holds its lease in the
engine (the owner object), also when that incarnation is another process; a drain
leaves a live owner's group alone and takes over a SIGKILLed owner's once its lease
has lapsed."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from restate_live_owner import OWNER, OWNER_TTL

from effecthost.conformance import Lab, conformance_resolver
from effecthost.contract import DrainReport
from effecthost.hosts.restate import RestateController
from effecthost.hosts.restate.testing import LocalRestate

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
HERE = Path(__file__).parent
TIMEOUT = 20.0


def _touched(report: DrainReport, key: str) -> dict[str, list[str]]:
    return {
        "resumed": sorted(rk for k, rk in report.resumed if k == key),
        "cancelled": sorted(rk for k, rk in report.cancelled if k == key),
        "no_executor": sorted(e.replay_key for e in report.no_executor if e.group_key == key),
    }


async def _pass(ctl: RestateController, key: str) -> dict[str, list[str]]:
    return _touched(await asyncio.wait_for(ctl.drain().run_pass(), TIMEOUT), key)


async def test_R1_a_drain_beside_another_live_process_leaves_its_group(tmp_path: Path) -> None:
    """R-1, G-29, G-12: another process of the same owner name owns a ``CANCEL`` group
    (a running tool call, an event wait, a timer): a wired drain here cancels none of
    its children and an unwired one reports none as ``NoExecutor``. Once that process is
    SIGKILLed and its owner lease has lapsed, the wired drain cancels all three."""
    lab = Lab(tmp_path / "lab")
    await lab.start()
    local = LocalRestate(
        tmp_path / "restate", "effecthost.conformance:conformance_resolver", [str(lab.path)]
    )
    wired = unwired = None
    try:
        await local.start()
        key = f"owned:{uuid.uuid4().hex[:8]}"
        owner = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HERE / "restate_live_owner.py"),
            local.ingress_url,
            local.admin_url,
            str(lab.path),
            key,
            env=dict(os.environ),
            stdout=asyncio.subprocess.PIPE,
        )
        wired = local.controller(conformance_resolver(lab.path), owner=OWNER)
        unwired = local.controller(None, owner=OWNER)
        try:
            assert owner.stdout is not None
            line = await asyncio.wait_for(owner.stdout.readline(), 60)
            assert line.strip() == b"opened", line
            await lab.wait_for("started", f"{key}:tool", 1, TIMEOUT)
            nothing: dict[str, list[str]] = {"resumed": [], "cancelled": [], "no_executor": []}
            assert await _pass(wired, key) == nothing
            assert await _pass(unwired, key) == nothing
            assert lab.count("cancelled", f"{key}:tool") == 0
        finally:
            if owner.returncode is None:
                owner.kill()
            await owner.wait()
        # A bounded poll: the killed owner's lease lapses on the engine's timer, OWNER_TTL
        # seconds after its last beat; no event of ours marks that moment.
        deadline = time.monotonic() + OWNER_TTL + TIMEOUT
        while True:
            touched = await _pass(wired, key)
            if touched["cancelled"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert touched["cancelled"] == sorted(f"{key}:{x}" for x in ("tool", "ev", "nap"))
        await lab.wait_for("cancelled", f"{key}:tool", 1, TIMEOUT)
    finally:
        for controller in (wired, unwired):
            if controller is not None:
                await controller.aclose()
        lab.open_all("")
        await local.stop()
        await lab.stop()
