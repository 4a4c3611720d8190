"""G-31 / G-33 against real PostgreSQL: a stalled driver whose lease was taken over
cannot advance the counter or write its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from group_support import group as effect_group
from sql_support import running, spec

from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    Outcome,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SchemaVersionError, SqlEffectHost

pytestmark = pytest.mark.anyio


async def test_G31_taken_over_finalize_is_a_no_op_without_a_counter_bump(
    pg_dsn: str, pg_schema: str
) -> None:
    async with running(PostgresStore(pg_dsn, schema=pg_schema)) as (store,):
        await store.create_group("g", "all", "run_to_completion", 1)
        await store.insert_children("g", [spec("c")], "nobody", 1.0)
        # A claims with a lease that is already expired (a driver stalled past its TTL)
        a = await store.claim("c", "node-a:1", -1.0)
        assert a is not None and a.fence == 1
        b = await store.claim("c", "node-b:2", 30.0)  # takeover bumps the fence (G-33)
        assert b is not None and b.fence == 2
        assert await store.claim("c", "node-c:3", 30.0) is None  # unexpired: never taken
        stale = await store.finalize("c", "h", "node-a:1", a.fence, '{"status":"success"}')
        assert stale is None
        group = await store.get_group("g")
        assert group is not None and group.counter == 0  # no burned number
        seq = await store.finalize(
            "c", "h", "node-b:2", b.fence, Outcome.success("B").model_dump_json()
        )
        assert seq == 1
        read = await store.read_rank("g", 1)
        assert read is not None and read.replay_key == "c"
        assert read.outcome is not None and Outcome.model_validate_json(read.outcome).value == "B"
        again = await store.finalize("c", "h", "node-a:1", a.fence, '{"status":"success"}')
        assert again is None
        group = await store.get_group("g")
        assert group is not None and group.counter == 1


async def test_G31_G33_stalled_host_driver_loses_to_a_drain_takeover(
    pg_dsn: str, pg_schema: str
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def stall(_value: object) -> str:
        started.set()
        await release.wait()
        return "A"

    async def quick(_value: object) -> str:
        return "B"

    def node(node_id: str, tool: Callable[[object], Awaitable[str]]) -> SqlEffectHost:
        store = PostgresStore(pg_dsn, schema=pg_schema)
        registry = ToolRegistry({"t": tool})
        return SqlEffectHost(store, registry, node_id=node_id, lease_ttl=0.6, renew_every=0.1)

    async with running(node("a", stall), node("b", quick)) as (a, b):
        group = effect_group(
            "s:group:g:0",
            [EffectEnvelope(replay_key="s.c", kind=EffectKind.TOOL_CALL, name="t")],
            WakePolicy.FIRST,
        )
        handle = await a.open_effect_group(group)
        await started.wait()
        driver = a._drivers["s.c"]
        stalled = asyncio.Event()

        async def stuck_renew(*_args: object) -> tuple[list[object], list[str]]:
            await stalled.wait()  # the store stalls for A: no renewal is confirmed
            return [], []

        a.store.renew = stuck_renew  # type: ignore[method-assign,assignment]
        while True:  # the lease and A's ownership of the group expire (database clock)
            rows = [r for r in await b.store.unfinished() if r.group_key == group.key]
            if rows[0].lease_expired and not rows[0].owner_live:
                break
            await asyncio.sleep(0.05)
        report = await b.drain().run_pass()
        assert report.resumed == ((group.key, "s.c"),)
        settlement = await asyncio.wait_for(b.await_next_settlement(handle), 10)
        assert settlement.outcome.value == "B"
        release.set()  # the stalled driver wakes up past its self-fencing deadline
        assert driver.task is not None
        await asyncio.wait_for(asyncio.gather(driver.task, return_exceptions=True), 10)
        # and even a write that ignored the deadline would match no row
        stale = await a.store.finalize("s.c", driver.envelope_hash, a.owner, driver.fence, "{}")
        assert stale is None
        record = await b.store.get_group(group.key)
        assert record is not None and record.counter == 1
        read = await b.store.read_rank(group.key, 1)
        assert read is not None and read.outcome is not None
        assert Outcome.model_validate_json(read.outcome).value == "B"


async def test_newer_schema_version_is_refused_at_start_up(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresStore(pg_dsn, schema=pg_schema)
    await store.start()
    await store._pool.execute("UPDATE eh_schema SET version = version + 1")
    await store.aclose()
    with pytest.raises(SchemaVersionError):
        await PostgresStore(pg_dsn, schema=pg_schema).start()


async def test_start_up_replaces_a_function_another_release_left(
    pg_dsn: str, pg_schema: str
) -> None:
    """Functions are code over a versioned layout: a schema of the same version whose
    function differs (another release's) gets this release's at start-up; a schema whose
    functions match keeps them untouched."""
    store = PostgresStore(pg_dsn, schema=pg_schema)
    await store.start()
    query = (
        "SELECT proname, xmin::text, prosrc FROM pg_proc "
        "WHERE pronamespace = $1::regnamespace ORDER BY proname"
    )
    before = await store._pool.fetch(query, pg_schema)
    await store._pool.execute(
        "CREATE OR REPLACE FUNCTION eh_retire(p_key text) RETURNS boolean "
        "LANGUAGE sql AS $$ SELECT false $$"
    )
    await store.aclose()
    async with running(PostgresStore(pg_dsn, schema=pg_schema)) as (again,):
        after = {r["proname"]: r for r in await again._pool.fetch(query, pg_schema)}
        assert (
            after["eh_retire"]["prosrc"] == {r["proname"]: r for r in before}["eh_retire"]["prosrc"]
        )
        untouched = [r for r in before if r["proname"] != "eh_retire"]
        assert all(after[r["proname"]]["xmin"] == r["xmin"] for r in untouched)
