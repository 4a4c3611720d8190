"""A memory host and a SQLite host behind one fixture, and tools the tests control, for
checks that must hold identically on both (R-8, R-9, G-26)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from effecthost.contract import EffectController, ToolError, ToolRegistry
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.sql import SqlEffectHost, sqlite_host


class Tools:
    """Tools whose results and failures the tests choose; ``slow`` waits on a gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = 0
        self.was_cancelled = asyncio.Event()
        self.results: dict[str, Any] = {}

    def registry(self) -> ToolRegistry:
        tools = ToolRegistry()

        @tools.tool("give")
        async def give(label: Any) -> Any:
            return self.results[label]

        @tools.tool("fail")
        async def fail(label: Any) -> Any:
            raise ToolError("Bad", "tool failed", data=self.results[label])

        @tools.tool("slow")
        async def slow(_input: Any) -> Any:
            self.started.set()
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                self.was_cancelled.set()
                raise
            return "slow"

        @tools.tool("fast")
        async def fast(_input: Any) -> Any:
            return "fast"

        return tools


class Tier:
    """A host of one tier plus what it has recorded (for "nothing changed")."""

    def __init__(self, name: str, host: EffectController, path: Path | None) -> None:
        self.name = name
        self.host = host
        self.path = path

    async def recorded(self) -> Any:
        keys = await self.host.open_group_keys()
        if self.path is None:
            return keys
        assert isinstance(self.host, SqlEffectHost)

        def dump() -> dict[str, list[Any]]:
            with sqlite3.connect(self.path) as c:
                names = [
                    r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                ]
                skip = {"lease_expires"}  # lease renewals
                out: dict[str, list[Any]] = {}
                for name in sorted(names):
                    cursor = c.execute(f"SELECT * FROM {name}")
                    columns = [d[0] for d in cursor.description]
                    out[name] = sorted(
                        (
                            tuple(v for col, v in zip(columns, row, strict=True) if col not in skip)
                            for row in cursor.fetchall()
                        ),
                        key=repr,
                    )
                return out

        return keys, await asyncio.to_thread(dump)


@pytest.fixture(name="tools")
def tools_fixture() -> Tools:
    return Tools()


@pytest.fixture(name="tier", params=["memory", "sqlite"])
async def tier_fixture(
    request: pytest.FixtureRequest, tools: Tools, tmp_path: Path
) -> AsyncIterator[Tier]:
    if request.param == "memory":
        memory = MemoryEffectHost(tools.registry())
        yield Tier("memory", memory, None)
        await memory.aclose()
    else:
        path = tmp_path / "limits.sqlite3"
        sql = await sqlite_host(path, tools.registry(), poll_interval=0.05)
        yield Tier("sqlite", sql, path)
        await sql.aclose()
