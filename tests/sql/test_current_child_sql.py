"""Issue 25 on the SQL tier: a registry tool reads its child's identity with
``current_child()``, and a child re-run after its driver was SIGKILLed (its lease expired)
sees the same replay key, group key and position with attempt 2."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from sql_support import drain_until_settled, kill_once_running, running
from sql_support import tool as tool_call

from effecthost.contract import (
    EffectGroup,
    ToolRegistry,
    current_child,
)
from effecthost.hosts.sql import SqlEffectHost, SqliteStore

WORKER = str(Path(__file__).with_name("_worker.py"))


async def who(_value: object) -> dict[str, Any]:
    child = current_child()
    return {
        "replay_key": child.replay_key,
        "group_key": child.group_key,
        "position": child.position,
        "attempt": child.attempt,
    }


def one_child(key: str) -> EffectGroup:
    """The group ``_worker.py hold`` opens with one child (same envelope, same hash)."""
    return effect_group(key, [tool_call(f"{key}/0", 0, "echo")])


async def identity_after(path: Path, key: str, *, drain: bool) -> Any:
    async with running(
        SqlEffectHost(
            SqliteStore(path), ToolRegistry({"echo": who}), lease_ttl=0.6, renew_every=0.1
        )
    ) as (host,):
        handle = await host.open_effect_group(one_child(key))
        if drain:
            await drain_until_settled(host, key, "the killed driver's child never re-ran")
        settlement = await asyncio.wait_for(host.await_next_settlement(handle), 30)
        return settlement.outcome.value


@pytest.mark.timeout(120)
def test_a_rerun_after_sigkill_sees_attempt_two(tmp_path: Path) -> None:
    """Issue 25 (G-09): the first run of a child sees attempt 1; after its driver is
    SIGKILLed mid-tool and the lease expires, the re-run sees the same replay key, group
    key and position with attempt 2 (the child row's attempt)."""
    path = tmp_path / "identity.sqlite3"
    fresh = asyncio.run(identity_after(path, "id:group:fresh:0", drain=False))
    assert fresh == {
        "replay_key": "id:group:fresh:0/0",
        "group_key": "id:group:fresh:0",
        "position": 0,
        "attempt": 1,
    }
    key = "id:group:killed:0"
    kill_once_running([sys.executable, WORKER, "hold", str(path), key, "1"])
    rerun = asyncio.run(identity_after(path, key, drain=True))
    assert rerun == {"replay_key": f"{key}/0", "group_key": key, "position": 0, "attempt": 2}
