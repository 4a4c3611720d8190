"""PostgreSQL sends a NOTIFY only when a waiter in some process may need it (G-21): a
group whose every unsettled child its waiter's own host drives is woken in-process, so its
finalizes and close notify nobody; a group another process may settle is marked watched by
its waiter before it re-reads, and then every finalize and close notifies; a close that
leaves children unsettled always notifies (their drivers and waiters may be elsewhere)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from group_support import group as effect_group
from sql_support import event, parked_wait, running, tools_group

from effecthost.contract import (
    EffectGroup,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost

pytestmark = pytest.mark.anyio

SENTINEL = "sentinel"


class Listener:
    """A LISTEN of its own on the host's channel: every NOTIFY any session sends there."""

    def __init__(self, dsn: str, channel: str) -> None:
        self.dsn, self.channel = dsn, channel
        self.got: list[str] = []
        self._sentinel = asyncio.Event()

    async def start(self) -> None:
        import asyncpg

        self.conn = await asyncpg.connect(self.dsn)
        await self.conn.add_listener(self.channel, self._on)

    def _on(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == SENTINEL:
            self._sentinel.set()
        else:
            self.got.append(payload)

    async def settled(self) -> list[str]:
        """Every notification committed so far (they arrive in commit order: a sentinel
        sent now comes after them)."""
        self._sentinel.clear()
        await self.conn.execute("SELECT pg_notify($1, $2)", self.channel, SENTINEL)
        async with asyncio.timeout(10):
            await self._sentinel.wait()
        return list(self.got)

    async def aclose(self) -> None:
        await self.conn.close()


def tools(key: str, n: int) -> EffectGroup:
    return tools_group(key, n, LoserPolicy.RUN_TO_COMPLETION, WakePolicy.ALL)


async def test_G21_a_group_driven_by_its_waiters_host_notifies_nobody(
    pg_dsn: str, pg_schema: str
) -> None:
    """G-21: a group whose children all run on the waiter's own host settles, is read and
    closes (and retires) without a single NOTIFY: its waiter is woken in-process."""
    gate = asyncio.Event()

    async def tool(value: object) -> object:
        await gate.wait()
        return value

    store = PostgresStore(pg_dsn, schema=pg_schema)
    host = SqlEffectHost(store, ToolRegistry({"t": tool}))
    async with running(host, Listener(pg_dsn, store.channel)) as (_, listener):
        for key, n in (("quiet:one", 1), ("quiet:two", 2), ("quiet:wide", 40)):
            gate.clear()
            handle = await host.open_effect_group(tools(key, n))
            waiting = asyncio.ensure_future(host.await_next_settlement(handle))
            await asyncio.sleep(0)
            gate.set()
            async with asyncio.timeout(10):
                await waiting
                for _ in range(n - 1):
                    await host.await_next_settlement(handle)
            await host.close_effect_group(handle)
            assert await store.retired(key) is not None
        assert await listener.settled() == []


async def test_G21_a_watched_group_notifies_its_finalize_and_close(
    pg_dsn: str, pg_schema: str
) -> None:
    """G-21: a waiter parked on a group another process may settle (an event wait) marks
    it watched; the settlement by another host then notifies, and so does the close."""
    waiter = SqlEffectHost(PostgresStore(pg_dsn, schema=pg_schema), ToolRegistry({}))
    other = SqlEffectHost(PostgresStore(pg_dsn, schema=pg_schema), ToolRegistry({}))
    listener = Listener(pg_dsn, waiter.store.channel)  # type: ignore[attr-defined]
    async with running(waiter, other, listener):
        group = effect_group("loud:g", [event("loud:e", value=0)], WakePolicy.FIRST)
        handle = await waiter.open_effect_group(group)
        waiting = await parked_wait(waiter, handle)
        assert await other.deliver_event("loud:g", "go") == 1
        async with asyncio.timeout(10):
            assert (await waiting).rank == 1
        await waiter.close_effect_group(handle)
        assert await listener.settled() == ["s:loud:g", "c:loud:g"]


async def test_G27_a_cancel_close_of_unsettled_children_notifies(
    pg_dsn: str, pg_schema: str
) -> None:
    """G-27, G-21: a ``CANCEL`` close that marks unsettled children notifies though no
    waiter watches the group: a driver in another process learns of the cancel at once."""

    async def tool(_value: object) -> object:
        await asyncio.Event().wait()  # runs until cancelled
        return None

    store = PostgresStore(pg_dsn, schema=pg_schema)
    host = SqlEffectHost(store, ToolRegistry({"t": tool}))
    async with running(host, Listener(pg_dsn, store.channel)) as (_, listener):
        handle = await host.open_effect_group(tools("cancel:g", 2))
        await host.close_effect_group(handle, LoserPolicy.CANCEL)
        assert "c:cancel:g" in await listener.settled()


async def test_G21_G33_a_child_taken_over_elsewhere_wakes_the_waiter(
    pg_dsn: str, pg_schema: str
) -> None:
    """G-21, G-33: a group whose only child this host drove, so unwatched: the host's
    lease is lost (its renewals fail), another host takes the child over and settles it,
    and the waiter (poll bound far away) wakes by NOTIFY: the lost lease made it re-read
    and mark the group watched."""

    async def stuck(_value: object) -> object:
        await asyncio.Event().wait()
        return None

    async def quick(value: object) -> object:
        return value

    async def unreachable(*_a: Any, **_k: Any) -> Any:
        await asyncio.sleep(0.01)  # a refused connection still takes a round trip
        raise OSError("renewal refused")

    async def no_claim(*_a: Any, **_k: Any) -> None:
        return None

    ttl = 1.2
    async with running(
        SqlEffectHost(
            PostgresStore(pg_dsn, schema=pg_schema),
            ToolRegistry({"t": stuck}),
            lease_ttl=ttl,
            renew_every=0.5,
            poll_interval=60.0,
        ),
        SqlEffectHost(PostgresStore(pg_dsn, schema=pg_schema), ToolRegistry({"t": quick})),
    ) as (waiter, other):
        waiter.store.renew = unreachable  # type: ignore[method-assign]
        waiter.store.claim = no_claim  # type: ignore[method-assign]
        handle = await waiter.open_effect_group(tools("taken:g", 1))
        waiting = asyncio.ensure_future(waiter.await_next_settlement(handle))
        stop = asyncio.Event()
        drain = asyncio.ensure_future(other.drain().run(interval=0.05, stop=stop))
        try:
            async with asyncio.timeout(20):
                settlement = await waiting  # the poll bound is 600 s
        finally:
            stop.set()
            await drain
        assert settlement.rank == 1 and settlement.outcome.value == 0


async def test_R4_a_close_elsewhere_wakes_a_waiter_whose_children_run_here(
    pg_dsn: str, pg_schema: str
) -> None:
    """R-4, G-21: a waiter whose every unsettled child its own host drives (so it marks
    nothing watched) is parked when another process reopens the group and closes it
    ``RUN_TO_COMPLETION``: the close notifies (it leaves a child unsettled), and the waiter
    gets ``GroupClosed`` at once, not at its poll bound."""
    from effecthost.contract import GroupClosed

    async def stuck(_value: object) -> object:
        await asyncio.Event().wait()
        return None

    async with running(
        SqlEffectHost(
            PostgresStore(pg_dsn, schema=pg_schema), ToolRegistry({"t": stuck}), poll_interval=60.0
        ),
        SqlEffectHost(PostgresStore(pg_dsn, schema=pg_schema), ToolRegistry({"t": stuck})),
    ) as (waiter, other):
        group = tools("elsewhere:g", 1)
        handle = await waiter.open_effect_group(group)
        waiting = await parked_wait(waiter, handle)
        await other.close_effect_group(await other.open_effect_group(group))
        async with asyncio.timeout(10):  # the poll bound is 600 s
            with pytest.raises(GroupClosed):
                await waiting
