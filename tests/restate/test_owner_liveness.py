"""R-1 on Restate: a group's owner is live while its incarnation holds its lease in the
engine (the owner object), also when that incarnation is another process; a drain
leaves a live owner's group alone and takes over a SIGKILLed owner's once its lease
has lapsed."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from owner_liveness import OWNER, drain_beside_a_live_owner

from effecthost.conformance import Lab, conformance_resolver
from effecthost.contract import EffectController
from effecthost.hosts.restate.testing import LocalRestate

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
HERE = Path(__file__).parent


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
        wired = local.controller(conformance_resolver(lab.path), owner=OWNER)
        unwired = local.controller(None, owner=OWNER)

        async def controllers() -> tuple[EffectController, EffectController]:
            assert wired is not None and unwired is not None
            return wired, unwired

        path = [str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        await drain_beside_a_live_owner(
            [
                sys.executable,
                str(HERE / "restate_live_owner.py"),
                local.ingress_url,
                local.admin_url,
                str(lab.path),
                key,
            ],
            controllers,
            lab,
            key,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        )
    finally:
        for controller in (wired, unwired):
            if controller is not None:
                await controller.aclose()
        lab.open_all("")
        await local.stop()
        await lab.stop()
