"""A waiter on a group this host has just created waits for the group's first commit
without reading first (G-21); that shortcut must still let it see what another host does
to the group: a close (GroupClosed) and a rank committed elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from sql_support import running, tools_group

from effecthost.contract import (
    GroupClosed,
    LoserPolicy,
    ToolRegistry,
)
from effecthost.hosts.sql import SqlEffectHost, Store

pytestmark = pytest.mark.anyio


async def test_waiter_on_a_fresh_group_sees_a_close_by_another_host(
    stores: Callable[[], Store],
) -> None:
    started = asyncio.Event()

    async def blocked(_value: object) -> object:
        started.set()
        await asyncio.Event().wait()  # never returns: only a cancel ends it

    async with running(
        SqlEffectHost(stores(), ToolRegistry({"t": blocked}), poll_interval=0.05),
        SqlEffectHost(stores(), ToolRegistry({"t": blocked}), poll_interval=0.05),
    ) as (opener, other):
        handle = await opener.open_effect_group(tools_group("fresh:group:closed:0"))
        assert "fresh:group:closed:0" in opener._fresh
        waiting = asyncio.create_task(opener.await_next_settlement(handle))
        await started.wait()
        await other.close_effect_group(handle.copy_cursor(), LoserPolicy.CANCEL)
        with pytest.raises(GroupClosed):
            await asyncio.wait_for(waiting, 30)
        assert handle.consumed == 0
