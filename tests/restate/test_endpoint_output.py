"""No blocked pipes (issue 19): an endpoint started by ``testing.LocalRestate`` writes
more than a pipe buffer holds to its stdout and its stderr while serving a group, and
the group completes (its streams go to a log file, nothing waits for a reader)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from group_support import group as effect_group
from group_support import tool

from effecthost.contract import (
    group_key,
)
from effecthost.hosts.restate.testing import LocalRestate

TESTS = Path(__file__).resolve().parents[0]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TIMEOUT = 60.0
MIB = 1 << 20


async def test_an_endpoint_printing_over_a_mib_to_each_stream_serves_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 ("no blocked pipes"), G-15: four children each print 512 KiB to stdout
    and to stderr of the endpoint (2 MiB per stream, 32 times a pipe's buffer); every
    child settles, and the endpoint's log holds all of it."""
    import sys

    sys.path.insert(0, str(TESTS))
    from restate_noisy_tools import NOISY, registry

    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    local = LocalRestate(tmp_path / "restate", "restate_noisy_tools:registry")
    try:
        await local.start()
        ctl = local.controller(registry, owner="tests")
        try:
            n = 4
            children = [tool(f"noisy.{i}", {"tag": i, "bytes": MIB // 2}, NOISY) for i in range(n)]
            group = effect_group(group_key("noisy", "all", 0), children)
            handle = await ctl.open_effect_group(group)
            ranks = [
                await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT) for _ in range(n)
            ]
            assert sorted(s.outcome.value for s in ranks) == list(range(n))
            await ctl.close_effect_group(handle)
        finally:
            await ctl.aclose()
        assert local.endpoint is not None and local.endpoint.poll() is None
    finally:
        await local.stop()
    assert (tmp_path / "restate" / "endpoint.log").stat().st_size >= 2 * n * (MIB // 2) - 8192
