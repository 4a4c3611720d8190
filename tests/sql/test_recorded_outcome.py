"""A waiter returns what the child row records (G-15, G-49): the host may hand back the
outcome it finalized itself only while the row still holds the very text it wrote."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from group_support import group as effect_group
from sql_support import running
from sql_support import tool as tool_call

from effecthost.contract import (
    EffectGroup,
    EffectHostError,
    Outcome,
    ToolRegistry,
)
from effecthost.hosts.sql import SqlEffectHost, SqliteStore

pytestmark = pytest.mark.anyio


def group(key: str) -> EffectGroup:
    return effect_group(key, [tool_call(f"{key}.c", 7)])


def rewrite(path: Path, key: str, outcome: str) -> None:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("UPDATE eh_children SET outcome = ? WHERE group_key = ?", (outcome, key))
    finally:
        conn.close()


async def test_G15_a_row_changed_after_the_finalize_is_read_as_recorded(tmp_path: Path) -> None:
    """G-15, G-49: a child's row rewritten between its finalize and the waiter's read is
    read as it now stands: another outcome is returned as recorded, a malformed one is
    refused typed; what this host finalized is not handed back in its place."""

    async def tool(value: object) -> object:
        return value

    path = tmp_path / "rows.sqlite3"
    async with running(SqlEffectHost(SqliteStore(path), ToolRegistry({"t": tool}))) as (host,):
        handle = await host.open_effect_group(group("rows:a"))
        await host.idle()
        rewrite(path, "rows:a", Outcome.success(99).model_dump_json())
        assert (await host.await_next_settlement(handle)).outcome == Outcome.success(99)

        handle = await host.open_effect_group(group("rows:b"))
        await host.idle()
        rewrite(path, "rows:b", '{"status":"success","value":')
        with pytest.raises(EffectHostError):
            await host.await_next_settlement(handle)
        assert handle.consumed == 0
