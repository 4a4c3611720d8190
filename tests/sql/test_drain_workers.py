"""G-34: drain workers in processes of their own finish the children of a caller that was
SIGKILLed while they ran."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sql_support import kill_once_running, running

from effecthost.hosts.sql import SqliteStore

TESTS = Path(__file__).parents[1]
WORKER = str(Path(__file__).with_name("_worker.py"))
CHILDREN = 3


async def _rows(path: Path, key: str) -> list[object]:
    async with running(SqliteStore(path)) as (store,):
        return list(await store.children(key))


async def _leases_expired(path: Path, key: str) -> None:
    """Until the killed caller's leases have expired on the database clock (bounded)."""
    async with running(SqliteStore(path)) as (store,):
        deadline = time.monotonic() + 30
        while not all(row.lease_expired for row in await store.unfinished()):
            assert time.monotonic() < deadline, "the killed caller's leases never expired"
            await asyncio.sleep(0.05)  # the database clock passing the TTL, not an ordering


@pytest.mark.timeout(120)
def test_G34_two_drain_workers_finish_a_killed_callers_children_once(tmp_path: Path) -> None:
    """G-34: a caller opens a ``RUN_TO_COMPLETION`` group and is SIGKILLed while every
    child runs under its lease. Once those leases have expired, two drain workers
    started together, each a process of its own (``effecthost drain --once``), finish
    the group: each child is claimed through a lease of its own exactly once more (the
    dead caller's claim, then one drain's), re-run through the registered resolver and
    settled once, with dense ranks."""
    path = tmp_path / "drain.sqlite3"
    key = "drain:group:g:0"
    kill_once_running([sys.executable, WORKER, "hold", str(path), key, str(CHILDREN)])
    asyncio.run(_leases_expired(path, key))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "effecthost.cli", "drain", "--sqlite", str(path)]
    drains = [
        subprocess.Popen(
            [*command, "--once", "--resolver", "cli_tools:registry"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for drain in drains:
        _out, err = drain.communicate(timeout=60)
        assert drain.returncode == 0, err
    rows = asyncio.run(_rows(path, key))
    states = {r.replay_key: (r.state, r.attempt) for r in rows}  # type: ignore[attr-defined]
    assert states == {f"{key}/{i}": ("settled", 2) for i in range(CHILDREN)}, states
    assert sorted(r.seq for r in rows) == list(range(1, CHILDREN + 1))  # type: ignore[attr-defined]
