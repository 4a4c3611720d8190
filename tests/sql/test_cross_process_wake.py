"""A waiter learns of a commit made through another connection to its database without
waiting out its poll bound (G-21): PostgreSQL by NOTIFY, SQLite by watching the database's
change counter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store

pytestmark = pytest.mark.anyio

POLL = 30.0  # the waiter's poll bound: far beyond the wait below


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str) -> Callable[[], Store]:
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "wake.sqlite3")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresStore(dsn, schema=pg_schema)


def event_group(key: str) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[
            EffectEnvelope(replay_key=f"{key}.e", kind=EffectKind.AWAIT_EVENT, name="go", input=0)
        ],
    )


async def test_G21_a_commit_by_another_host_wakes_a_parked_waiter(
    stores: Callable[[], Store],
) -> None:
    """G-21: a waiter parked on rank 1 wakes when another host (its own connections, as a
    second process has) records the rank, long before its poll bound; once for a group with
    nothing read ahead and once again for a second group."""
    waiter = SqlEffectHost(stores(), ToolRegistry({}), poll_interval=POLL)
    other = SqlEffectHost(stores(), ToolRegistry({}), poll_interval=POLL)
    await waiter.start()
    await other.start()
    try:
        for key in ("wake:g1", "wake:g2"):
            handle = await waiter.open_effect_group(event_group(key))
            parked = asyncio.Event()
            real_sleep = waiter._sleep

            async def sleep(
                w: asyncio.Future[None], real: Any = real_sleep, parked: asyncio.Event = parked
            ) -> None:
                parked.set()
                await real(w)

            waiter._sleep = sleep  # type: ignore[method-assign]
            waiting = asyncio.ensure_future(waiter.await_next_settlement(handle))
            async with asyncio.timeout(10):
                await parked.wait()
            assert await other.deliver_event(key, "go") == 1
            async with asyncio.timeout(2):  # the poll bound is 30 s
                settlement = await waiting
            assert settlement.rank == 1
            waiter._sleep = real_sleep  # type: ignore[method-assign]
            await waiter.close_effect_group(handle)
    finally:
        await other.aclose()
        await waiter.aclose()
