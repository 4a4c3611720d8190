"""``effecthost inspect`` on SQLite and PostgreSQL: the shared columns and rank table, and
nothing written."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from inspect_support import check_inspect, inspect

from effecthost.contract import (
    EffectEnvelope,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import SqlEffectHost, postgres_host, sqlite_host

pytestmark = pytest.mark.anyio
KEY = "inspect:group:a:0"
CHILDREN = [(f"{KEY}:hold", "hold"), (f"{KEY}:quick", "quick")]


def _registry() -> ToolRegistry:
    never = asyncio.Event()

    async def hold(value: Any) -> Any:
        await never.wait()

    async def quick(value: Any) -> Any:
        return value

    return ToolRegistry({"hold": hold, "quick": quick})


async def _one_settled_one_running(host: SqlEffectHost) -> None:
    """Open the group, take rank 1 (the quick child), then stop the host the way a dying
    process does: the held child stays recorded as running."""
    group = effect_group(
        KEY,
        [
            EffectEnvelope(replay_key=rk, kind="tool_call", name=tool, input=i)
            for i, (rk, tool) in enumerate(CHILDREN)
        ],
        WakePolicy.ALL,
        LoserPolicy.CANCEL,
    )
    handle = await host.open_effect_group(group)
    settlement = await asyncio.wait_for(host.await_next_settlement(handle), 20)
    assert settlement.position == 1
    await host.aclose()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_the_group(args: list[str], owner: str) -> None:
    """The group of :func:`_one_settled_one_running`, as inspect shows it."""
    check_inspect(
        args, KEY, wake="all", disposition="cancel", owner=owner, children=CHILDREN, starts=False
    )


async def test_inspect_sqlite_lists_and_ranks_without_writing(tmp_path: Path) -> None:
    """G-30, SPEC §7: inspect on SQLite shows the shared columns and rank table, and no
    byte of the database (or its WAL) changes."""
    db = tmp_path / "effects.sqlite3"
    await _one_settled_one_running(await sqlite_host(db, _registry()))
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        (owner,) = c.execute("SELECT owner FROM eh_groups").fetchone()
    c.close()
    before = _digest(db)
    _check_the_group(["--sqlite", str(db)], owner)
    assert _digest(db) == before
    # a WAL reader may leave an empty -wal beside the file, never a written one
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


async def test_inspect_postgres_lists_and_ranks_without_writing(
    pg_dsn: str, pg_schema: str
) -> None:
    """G-30, SPEC §7: inspect on PostgreSQL shows the same columns and rank table as on
    SQLite and leaves every row as it was."""
    import asyncpg

    host = await postgres_host(pg_dsn, _registry(), schema=pg_schema)
    await _one_settled_one_running(host)

    async def rows() -> tuple[list[Any], list[Any]]:
        conn = await asyncpg.connect(pg_dsn)
        try:
            groups = await conn.fetch(f"SELECT * FROM {pg_schema}.eh_groups ORDER BY 1")
            children = await conn.fetch(f"SELECT * FROM {pg_schema}.eh_children ORDER BY 1")
        finally:
            await conn.close()
        return [tuple(r) for r in groups], [tuple(r) for r in children]

    before = await rows()
    conn = await asyncpg.connect(pg_dsn)
    owner = await conn.fetchval(f"SELECT owner FROM {pg_schema}.eh_groups")
    await conn.close()
    assert owner
    _check_the_group(["--postgres", pg_dsn, "--schema", pg_schema], owner)
    assert await rows() == before
    unreachable = inspect("--postgres", "postgresql://nobody@127.0.0.1:1/none")
    assert unreachable.returncode == 14 and unreachable.stderr.count("\n") == 1
