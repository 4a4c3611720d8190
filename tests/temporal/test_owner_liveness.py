"""R-1 on Temporal: a group's owner is live while its incarnation holds its lease in the
engine, also when that incarnation is another process; a drain leaves a live owner's
group alone and takes over a SIGKILLed owner's once its lease has lapsed."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from owner_liveness import drain_beside_a_live_owner

from effecthost.contract import EffectController

from ._support import running_host

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
ROOT = Path(__file__).parent.parent.parent


async def test_R1_a_drain_beside_another_live_process_leaves_its_group(tmp_path: Path) -> None:
    """R-1, G-29, G-12: another process owns a ``CANCEL`` group (a running tool call, an
    event wait, a timer): a wired drain here cancels none of its children and an
    unwired one reports none as ``NoExecutor``. Once that process is SIGKILLed and its
    owner lease has lapsed, the wired drain cancels all three."""
    async with running_host(tmp_path) as (host, lab):
        key = f"owned:{uuid.uuid4().hex[:8]}"
        path = [str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]

        async def controllers() -> tuple[EffectController, EffectController]:
            return await host.controller(), await host.controller(wired=False)

        await drain_beside_a_live_owner(
            [
                sys.executable,
                "-m",
                "tests.temporal._live_owner",
                host.address,
                host.task_queue,
                str(lab.path),
                key,
            ],
            controllers,
            lab,
            key,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        )
