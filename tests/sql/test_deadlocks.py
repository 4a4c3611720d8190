"""G-32 on PostgreSQL: the host's own statements (the keeper's renewal, batched
finalizes in completion order, closes and retirements) never deadlock one another, and
nothing of the driver escapes a public method."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from sql_support import group as sql_group
from sql_support import tool as tool_call

from effecthost.contract import (
    EffectGroup,
    LoserPolicy,
    ToolRegistry,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost

pytestmark = pytest.mark.anyio

SECONDS = 6.0
CALLERS = 12
CHILDREN = 8


async def work(_value: object) -> str:
    await asyncio.sleep(random.uniform(0, 0.03))  # the tool's own work, of random length
    return "ok"


def _group(key: str, disposition: LoserPolicy) -> EffectGroup:
    return sql_group(
        key, [tool_call(f"{key}.{i:02d}", i) for i in range(CHILDREN)], disposition=disposition
    )


async def test_G32_no_deadlock_under_short_leases(
    pg_dsn: str, pg_schema: str, pg_log: Path | None
) -> None:
    """G-32, G-33: under short leases (TTL 1.2 s, renewal every 0.1 s) two hosts open,
    finalize (batched, in completion order), close under both dispositions and retire
    groups for a few seconds while their keepers renew: the server logs no deadlock and
    every public call either returns or raises a typed error."""
    if pg_log is None:
        pytest.skip("the server's log is not ours to read")
    offset = pg_log.stat().st_size  # noqa: ASYNC240 - before any task runs
    hosts = [
        SqlEffectHost(
            PostgresStore(pg_dsn, schema=pg_schema),
            ToolRegistry({"t": work}),
            lease_ttl=1.2,
            renew_every=0.1,
            poll_interval=0.05,
        )
        for _ in range(2)
    ]
    for h in hosts:
        await h.start()
    errors: list[BaseException] = []
    done = [0]
    stop = asyncio.get_running_loop().time() + SECONDS

    async def caller(n: int) -> None:
        h = hosts[n % 2]
        i = 0
        while asyncio.get_running_loop().time() < stop:
            i += 1
            cancel = i % 2 == 0
            group = _group(
                f"dl:{n}:{i}", LoserPolicy.CANCEL if cancel else LoserPolicy.RUN_TO_COMPLETION
            )
            try:
                handle = await h.open_effect_group(group)
                for _ in range(1 if cancel else CHILDREN):
                    await h.await_next_settlement(handle)
                await h.close_effect_group(handle)
                done[0] += 1
            except Exception as exc:
                errors.append(exc)

    try:
        await asyncio.wait_for(asyncio.gather(*(caller(n) for n in range(CALLERS))), 60)
    finally:
        for h in hosts:
            await h.aclose()
    with pg_log.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    deadlocks = text.count("deadlock detected")
    assert deadlocks == 0, f"{deadlocks} deadlocks in {SECONDS}s ({done[0]} groups)"
    assert not errors, errors[:3]
    assert done[0] > CALLERS


async def test_G32_a_finalize_takes_no_child_row_after_the_group_row(
    pg_dsn: str, pg_schema: str, pg_log: Path | None
) -> None:
    """G-32: every transaction touching both takes the child row, then the group row. A
    probe transaction in that order (one child row of a group held, then the group row
    asked for) while the host settles the group's other child: the host's finalize
    never holds the group row while waiting for the probe's child row, so no deadlock
    is detected (the probe is not its victim and the server logs none)."""
    import asyncpg

    release = asyncio.Event()

    async def tool(value: object) -> str:
        await (release.wait() if value == 0 else asyncio.Event().wait())
        return "ok"

    host = SqlEffectHost(PostgresStore(pg_dsn, schema=pg_schema), ToolRegistry({"t": tool}))
    await host.start()
    offset = pg_log.stat().st_size if pg_log is not None else 0  # noqa: ASYNC240
    key = "probe:group:g:0"
    group = sql_group(key, [tool_call(f"{key}.{i}", i) for i in range(2)])
    settings = {"search_path": pg_schema}
    probe = await asyncpg.connect(pg_dsn, server_settings=settings)
    watch = await asyncpg.connect(pg_dsn, server_settings=settings)
    deadlocked = False
    try:
        handle = await host.open_effect_group(group)
        transaction = probe.transaction()
        await transaction.start()
        await probe.execute(
            "SELECT 1 FROM eh_children WHERE replay_key = $1 FOR UPDATE", f"{key}.1"
        )
        release.set()
        settled = asyncio.ensure_future(host.await_next_settlement(handle))
        deadline = asyncio.get_running_loop().time() + 30
        # until the finalize committed, or a host transaction waits on the probe's row
        while not settled.done():
            blocked = await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                probe.get_server_pid(),
            )
            if blocked:
                break
            assert asyncio.get_running_loop().time() < deadline, "the finalize never ran"
            await asyncio.sleep(0.02)  # polling the server's view, a bounded wait
        try:
            await probe.execute("SELECT 1 FROM eh_groups WHERE group_key = $1 FOR UPDATE", key)
        except asyncpg.DeadlockDetectedError:
            deadlocked = True
        await transaction.rollback()
        first = await asyncio.wait_for(settled, 30)
        assert first.replay_key == f"{key}.0"
    finally:
        await probe.close()
        await watch.close()
        await host.aclose()
    assert not deadlocked, "the probe was a deadlock's victim"
    if pg_log is not None:
        with pg_log.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        assert "deadlock detected" not in text
