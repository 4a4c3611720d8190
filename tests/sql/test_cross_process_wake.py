"""A waiter learns of a commit made through another connection to its database without
waiting out its poll bound (G-21): PostgreSQL by NOTIFY, SQLite by watching the database's
change counter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from sql_support import event_group, parked_wait, running

from effecthost.contract import (
    ToolRegistry,
)
from effecthost.hosts.sql import SqlEffectHost, Store

pytestmark = pytest.mark.anyio

POLL = 30.0  # the waiter's poll bound: far beyond the wait below


async def test_G21_a_commit_by_another_host_wakes_a_parked_waiter(
    stores: Callable[[], Store],
) -> None:
    """G-21: a waiter parked on rank 1 wakes when another host (its own connections, as a
    second process has) records the rank, long before its poll bound; once for a group with
    nothing read ahead and once again for a second group."""
    async with running(
        SqlEffectHost(stores(), ToolRegistry({}), poll_interval=POLL),
        SqlEffectHost(stores(), ToolRegistry({}), poll_interval=POLL),
    ) as (waiter, other):
        for key in ("wake:g1", "wake:g2"):
            handle = await waiter.open_effect_group(event_group(key))
            waiting = await parked_wait(waiter, handle)
            assert await other.deliver_event(key, "go") == 1
            async with asyncio.timeout(2):  # the poll bound is 30 s
                settlement = await waiting
            assert settlement.rank == 1
            await waiter.close_effect_group(handle)
