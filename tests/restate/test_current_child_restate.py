"""Issue 25 on the Restate tier: a registry tool reads its child's identity with
``current_child()``; a child whose endpoint was SIGKILLed mid-tool is re-run with the same
replay key, group key and position and an attempt of at least 2."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from group_support import group as effect_group
from group_support import tool

from effecthost.contract import (
    group_key,
)
from effecthost.hosts.restate.testing import LocalRestate

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TESTS = Path(__file__).parent
TIMEOUT = 60.0


@pytest.mark.parametrize("admin", [True, False], ids=["admin-url", "no-admin-url"])
async def test_issue25_a_rerun_after_the_endpoint_was_killed_sees_a_later_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, admin: bool
) -> None:
    """Issue 25 (G-09): the first attempt of a child sees attempt 1; the endpoint is
    SIGKILLed while its tool runs; the re-run sees the same replay key, group key and
    position, and an attempt of at least 2: the invocation's retry count read through the
    admin API, or exactly 2 when the endpoint has no admin URL."""
    sys.path.insert(0, str(TESTS))
    from restate_identity_tools import WHO, registry

    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    marks = tmp_path / "marks"
    marks.mkdir()
    local = LocalRestate(tmp_path / "restate", "restate_identity_tools:registry")
    if not admin:
        local.endpoint_admin_urls = []
    try:
        await local.start()
        ctl = local.controller(registry, owner="tests")
        try:
            key = group_key("identity", "all", 0)
            child = tool("identity.0", {"dir": str(marks), "tag": "identity.0"}, name=WHO)
            group = effect_group(key, [child])
            handle = await ctl.open_effect_group(group)
            started = marks / "identity.0.started"
            deadline = time.monotonic() + TIMEOUT
            while not started.exists():  # the endpoint process reaching the tool (bounded)
                assert time.monotonic() < deadline, "the tool never started"
                await asyncio.sleep(0.05)
            assert started.read_text() == "1"
            local.kill_endpoint()
            await local.start_endpoint()
            settled = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
            value = settled.outcome.value
            assert isinstance(value, dict), settled
            assert value["attempt"] >= 2 if admin else value["attempt"] == 2, value
            assert {k: v for k, v in value.items() if k != "attempt"} == {
                "replay_key": "identity.0",
                "group_key": key,
                "position": 0,
            }
            await ctl.close_effect_group(handle)
        finally:
            await ctl.aclose()
    finally:
        await local.stop()
