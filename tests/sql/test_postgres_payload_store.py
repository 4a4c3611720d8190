"""``PostgresPayloadStore``: the payload store the Restate and Temporal hosts can be
configured with, against the real PostgreSQL of the SQL tests (G-47)."""

from __future__ import annotations

import asyncio
import secrets
from contextlib import aclosing

import pytest
from group_support import group as effect_group

from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    PayloadMissing,
    ToolRegistry,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.payloads import (
    AesGcmSealer,
    InMemoryKeyStore,
    PayloadPolicy,
    PayloadRef,
    PostgresPayloadStore,
)

pytestmark = pytest.mark.anyio


async def test_put_get_delete_and_missing_payloads(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresPayloadStore(pg_dsn, schema=pg_schema)
    other = PostgresPayloadStore(pg_dsn, schema=pg_schema)  # another process, same table
    async with aclosing(other), aclosing(store):
        data = secrets.token_bytes(100_000)
        ref = await store.put("s:group:g:0", "s.x", data)
        again = await store.put("s:group:g:0", "s.x", data)
        assert ref.name != again.name  # a fresh name per write
        assert await other.get(ref) == data
        assert await store.group_keys() == ["s:group:g:0"]
        assert "postgresql://" not in repr(store)

        forged = PayloadRef(**{**ref.model_dump(), "name": secrets.token_hex(16)})
        with pytest.raises(PayloadMissing) as raised:
            await store.get(forged)
        assert (raised.value.group_key, raised.value.replay_key) == ("s:group:g:0", "s.x")

        pool = await store._ready()  # someone flips the stored bytes
        await pool.execute("UPDATE eh_payload_store SET data = $1 WHERE name = $2", b"x", ref.name)
        with pytest.raises(PayloadMissing):
            await store.get(ref)

        await store.delete_group("s:group:g:0")
        await store.delete_group("s:group:g:0")  # idempotent
        with pytest.raises(PayloadMissing):
            await other.get(again)
        assert await store.group_keys() == []


async def test_a_host_configured_with_it_stores_only_envelopes_and_reads_them_back(
    pg_dsn: str, pg_schema: str
) -> None:
    secret = f"plain-{secrets.token_hex(8)}"

    async def big(_: object) -> object:
        return {"secret": secret, "blob": "B" * 50_000}

    store = PostgresPayloadStore(pg_dsn, schema=pg_schema)
    policy = PayloadPolicy(store=store, sealer=AesGcmSealer(InMemoryKeyStore()))
    host = MemoryEffectHost(ToolRegistry({"big": big}), payloads=policy)
    key = "pgstore:group:g:0"
    group = effect_group(
        key, [EffectEnvelope(replay_key=f"{key}.x", kind=EffectKind.TOOL_CALL, name="big")]
    )
    async with aclosing(store), aclosing(host):
        handle = await host.open_effect_group(group)
        settlement = await asyncio.wait_for(host.await_next_settlement(handle), 10)
        assert settlement.outcome.value == {"secret": secret, "blob": "B" * 50_000}
        pool = await store._ready()
        rows = await pool.fetch("SELECT data FROM eh_payload_store WHERE group_key = $1", key)
        assert len(rows) == 1
        assert b"effecthost.sealed/2" in bytes(rows[0][0])
        assert secret.encode() not in bytes(rows[0][0])
        await host.close_effect_group(handle)  # retired: its payloads are deleted (by a task)
        for _ in range(200):
            if not await store.group_keys():
                break
            await asyncio.sleep(0.01)
        assert await store.group_keys() == []
