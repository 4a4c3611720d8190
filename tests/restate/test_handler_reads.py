"""The read path of a caller inside Restate (``HandlerController``): one awakeable per
read, answered by the group object with the recorded ranks from there on, against a real
restate-server and an endpoint registered over HTTP."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from effecthost.hosts.restate import register_deployment
from effecthost.hosts.restate.testing import LocalRestate, _spawn, _stop, _wait_until

APP = Path(__file__).resolve().parent / "restate_reader_app.py"
pytestmark = pytest.mark.anyio


@pytest.fixture
async def ingress(tmp_path: Path) -> AsyncIterator[str]:
    local = LocalRestate(tmp_path, "unused:unused")
    await local.start_server()
    log = (tmp_path / "reader.log").open("ab")
    app = _spawn([sys.executable, str(APP), f"127.0.0.1:{local.endpoint_port}"], log)
    try:

        async def up() -> bool:
            _, writer = await asyncio.open_connection("127.0.0.1", local.endpoint_port)
            writer.close()
            return True

        await _wait_until(up, "reader endpoint")
        await register_deployment(local.admin_url, local.endpoint_uri, force=True)
        yield local.ingress_url
    finally:
        _stop(app, 9)
        log.close()
        await local.stop()


@pytest.mark.timeout(120)
async def test_G18_G39_R2_R4_reads_inside_a_handler(ingress: str) -> None:
    """G-18, G-39, R-2, R-4: inside a handler, every rank is served once and in order
    (whether a read parked or came with an earlier read's batch); a handle claiming
    another child count is ``HandleMismatch``, a read past the last rank
    ``CursorExhausted``; a restored cursor reads rank 1 again; after close, a read is
    ``GroupClosed``."""
    n = 12
    async with httpx.AsyncClient(timeout=90.0) as client:
        answer = await client.post(
            f"{ingress}/Reader/read_all", json={"n": n, "key": "reads.handler.g1"}
        )
    answer.raise_for_status()
    assert answer.json() == {
        "ranks": list(range(1, n + 1)),
        "values": list(range(n)),
        "mismatch": "HandleMismatch",
        "exhausted": "CursorExhausted",
        "reread": 1,
        "closed": "GroupClosed",
    }
