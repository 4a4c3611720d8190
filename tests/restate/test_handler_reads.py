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

from effecthost.hosts.restate.testing import LocalRestate

APP = Path(__file__).resolve().parent / "restate_reader_app.py"
pytestmark = pytest.mark.anyio


@pytest.fixture
async def reader(tmp_path: Path) -> AsyncIterator[LocalRestate]:
    local = LocalRestate(tmp_path, "unused:unused")
    try:
        await local.start_app([sys.executable, str(APP)], "reader")
        yield local
    finally:
        await local.stop()


@pytest.mark.timeout(120)
async def test_G18_G39_R2_R4_reads_inside_a_handler(reader: LocalRestate) -> None:
    """G-18, G-39, R-2, R-4: inside a handler, every rank is served once and in order
    (whether a read parked or came with an earlier read's batch); a handle claiming
    another child count is ``HandleMismatch``, a read past the last rank
    ``CursorExhausted``; a restored cursor reads rank 1 again; after close, a read is
    ``GroupClosed``."""
    n = 12
    async with httpx.AsyncClient(timeout=90.0) as client:
        answer = await client.post(
            f"{reader.ingress_url}/Reader/read_all", json={"n": n, "key": "reads.handler.g1"}
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


@pytest.mark.timeout(120)
async def test_G37_G38_R6_a_race_inside_a_handler_costs_eight_invocations(
    reader: LocalRestate,
) -> None:
    """G-37, G-38, R-6: a 2-child ``race`` run by a caller inside Restate costs eight
    invocations: the caller, the open, one claim call for both replay keys (they share
    their group's prefix), the two children, their two settles, the close. The read of
    rank 1 is parked by the open and costs none of its own."""
    async with httpx.AsyncClient(timeout=90.0) as client:
        answer = await client.post(f"{reader.ingress_url}/Reader/race_two", json={"scope": "cost"})
        answer.raise_for_status()
        assert answer.json() in (1, 2)
        sql = "SELECT target_service_name AS s, target_handler_name AS h FROM sys_invocation"
        targets: list[tuple[str, str]] = []
        for _ in range(400):  # the loser's settle is one-way: wait for the engine to go idle
            found = await client.post(
                f"{reader.admin_url}/query",
                json={"query": sql},
                headers={"Accept": "application/json"},
            )
            targets = sorted((row["s"], row["h"]) for row in found.json()["rows"])
            if targets.count(("EffecthostGroup", "settle")) == 2:
                break
            await asyncio.sleep(0.05)
    assert targets == sorted(
        [
            ("Reader", "race_two"),
            ("EffecthostGroup", "open"),
            ("EffecthostReplayKey", "claim_keys"),
            ("EffecthostChild", "run"),
            ("EffecthostChild", "run"),
            ("EffecthostGroup", "settle"),
            ("EffecthostGroup", "settle"),
            ("EffecthostGroup", "close"),
        ]
    ), targets
