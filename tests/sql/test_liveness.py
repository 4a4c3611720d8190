"""Liveness of the SQL tiers: every claimed child ends in a recorded outcome or a released
lease, and renewal covers only children with a live driver (G-27, G-33, G-36)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
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

BOUND = 10.0  # a hang guard, never an ordering


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Callable[[], Store]]:
    if request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path / "liveness.sqlite3")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        yield lambda: PostgresStore(dsn, schema=pg_schema)


def tools_group(key: str, n: int = 2, disposition: LoserPolicy = LoserPolicy.CANCEL) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.FIRST,
        disposition=disposition,
        children=[
            EffectEnvelope(replay_key=f"{key}.c{i}", kind=EffectKind.TOOL_CALL, name="t", input=i)
            for i in range(n)
        ],
    )


async def never(_value: object) -> object:
    await asyncio.Event().wait()  # only a cancel ends it


async def until(probe: Callable[[], Awaitable[Any]], what: str, bound: float = BOUND) -> Any:
    """Poll ``probe`` until it returns something truthy (a bounded wait, not an ordering)."""
    async with asyncio.timeout(bound):
        while not (got := await probe()):  # noqa: ASYNC110 - polls the database
            await asyncio.sleep(0.02)
    assert got, what
    return got


def host(make: Callable[[], Store], fn: Any = never, **kw: Any) -> SqlEffectHost:
    kw.setdefault("lease_ttl", 1.2)
    kw.setdefault("renew_every", 0.2)
    kw.setdefault("poll_interval", 0.05)
    return SqlEffectHost(make(), ToolRegistry({"t": fn}), **kw)


async def test_G27_G36_children_cancelled_before_their_task_runs_settle(
    stores: Callable[[], Store],
) -> None:
    """G-27, G-36: a close under CANCEL right after the open, before the children's tasks
    first ran, still ends every child in a recorded cancelled outcome; the closed group
    retires and nothing stays leased or registered."""
    h = host(stores)
    await h.start()
    try:
        group = tools_group("live:cancel-early:0")
        handle = await h.open_effect_group(group)
        await h.close_effect_group(handle, LoserPolicy.CANCEL)  # no yield in between
        await until(lambda: h.store.retired(group.key), "the closed group never retired")
        assert not h._drivers
        assert await h.store.max_lease_expiry(h.owner) is None
    finally:
        await h.aclose()


async def test_G27_G33_claim_returning_a_cancel_settles_the_child(
    stores: Callable[[], Store],
) -> None:
    """G-27, G-33: a claim that returns with ``cancel_requested`` already set (a close
    committed between the drain's read and its claim) ends in a recorded cancelled
    outcome, not in a driver cancelled before it ran that the keeper renews forever."""
    dead = host(stores)
    await dead.start()
    other = host(stores)
    await other.start()
    orphans: list[asyncio.Task[None]] = []
    try:
        group = tools_group("live:cancel-claim:0", n=1, disposition=LoserPolicy.RUN_TO_COMPLETION)
        await dead.open_effect_group(group)
        orphans = await dead.abandon()
        await until(
            lambda: _all_expired(other.store, group.key), "the dead host's lease never expired"
        )
        real_claim = other.store.claim

        async def claim_after_close(*args: Any, **kw: Any) -> Any:
            await other.store.close(group.key, "cancel")  # marks cancel_requested
            return await real_claim(*args, **kw)

        other.store.claim = claim_after_close  # type: ignore[method-assign]
        await other.drain().run_pass()
        other.store.claim = real_claim  # type: ignore[method-assign]
        await until(lambda: other.store.retired(group.key), "the cancelled child never settled")
        assert not other._drivers
        assert await other.store.max_lease_expiry(other.owner) is None
    finally:
        await other.aclose()
        for task in orphans:
            task.cancel()


async def _all_expired(store: Store, group_key: str) -> bool:
    rows = await store.children(group_key)
    return all(r.lease_expired for r in rows if r.state != "settled")
