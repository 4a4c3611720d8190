"""PostgreSQL round trips of a group's life: a first open, a batched finalize, a read of the
ranks and a close that retires are one call each, as the honest ceiling counts them."""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import aclosing
from typing import Any

import pytest
from sql_support import group as sql_group
from sql_support import tool as tool_call

from effecthost.contract import (
    ToolRegistry,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost

pytestmark = pytest.mark.anyio

_CALLS = ("fetch", "fetchrow", "fetchval", "execute", "executemany")
_LOOPS = ("effecthost-sql-keeper", "effecthost-sql-timers")  # background, not the group's


class _Counting:
    """The store's pool, counting every statement sent through it or a connection it
    lends."""

    def __init__(self, pool: Any, counts: Counter[str]) -> None:
        self._pool, self._counts = pool, counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pool, name)
        if name in _CALLS:

            async def counted(query: str, *args: Any, **kw: Any) -> Any:
                task = asyncio.current_task()
                if task is None or task.get_name() not in _LOOPS:
                    self._counts[query.split("(")[0]] += 1
                return await attr(query, *args, **kw)

            return counted
        if name == "acquire":
            return lambda *a, **kw: _Acquire(attr(*a, **kw), self._counts)
        return attr


class _Acquire:
    def __init__(self, inner: Any, counts: Counter[str]) -> None:
        self._inner, self._counts = inner, counts

    async def __aenter__(self) -> Any:
        return _Counting(await self._inner.__aenter__(), self._counts)

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


async def test_R7_G36_a_group_is_four_round_trips(pg_dsn: str, pg_schema: str) -> None:
    """R-7, G-31, G-36: on PostgreSQL a first open (group row, children, leases, tombstone
    and replay-key checks) is one statement, the two children's finalize one, the read of
    both ranks one, and the close that retires the settled group one."""
    both = asyncio.Event()
    started = 0

    async def tool(_value: object) -> object:
        nonlocal started
        started += 1
        if started == 2:
            both.set()
        await both.wait()  # both children settle together: one batched finalize
        return 1

    store = PostgresStore(pg_dsn, schema=pg_schema)
    host = SqlEffectHost(store, ToolRegistry({"t": tool}))
    await host.start()
    counts: Counter[str] = Counter()
    store._pool = _Counting(store._pool, counts)
    async with aclosing(host):
        group = sql_group("trips:g", [tool_call(f"trips:c{i}", i) for i in range(2)])
        handle = await host.open_effect_group(group)
        assert sum(counts.values()) == 1, counts
        async with asyncio.timeout(10):
            await host.await_next_settlement(handle)
            await host.await_next_settlement(handle)
        await host.close_effect_group(handle)
        assert sum(counts.values()) == 4, counts
        assert await host.store.retired("trips:g") is not None
