"""``effecthost inspect --restate ADMIN_URL`` against a real restate-server: the columns
and rank table every tier shows, read through the admin SQL API without changing state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from group_support import group as effect_group
from group_support import tool
from inspect_support import check_inspect, inspect
from restate_stack import running_stack

from effecthost.conformance import step_input
from effecthost.contract import (
    LoserPolicy,
    group_key,
)
from effecthost.hosts.restate.testing import group_state

pytestmark = pytest.mark.anyio
STEP = "conformance.step"


async def test_inspect_restate_lists_and_ranks_without_writing(tmp_path: Path) -> None:
    """G-30: inspect reads a Restate deployment through the admin SQL API only: the
    group's state and the server's invocations are the same before and after."""
    async with running_stack(tmp_path, owner="inspector-test") as stack:
        ctl, lab, local = stack.controller, stack.lab, stack.local
        key = group_key("inspect", "restate", 0)
        tags = ["inspect.r.hold", "inspect.r.quick"]
        children = [tool(t, step_input(t), name=STEP) for t in tags]
        group = effect_group(key, children, disposition=LoserPolicy.CANCEL)
        handle = await ctl.open_effect_group(group)
        lab.open(tags[1])
        first = await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
        assert first.position == 1
        await lab.wait_for("started", tags[0], 1, 20)

        invocations = (  # the controller's owner lease renews itself meanwhile
            "SELECT id, status, modified_at FROM sys_invocation "
            "WHERE target_service_name != 'EffecthostOwner' ORDER BY id"
        )
        before = (await group_state(ctl, key), await ctl.query(invocations))
        await asyncio.to_thread(
            check_inspect,
            ["--restate", local.admin_url],
            key,
            wake="all",
            disposition="cancel",
            owner="inspector-test",
            children=[(t, STEP) for t in tags],
        )
        assert (await group_state(ctl, key), await ctl.query(invocations)) == before

        down = await asyncio.to_thread(inspect, "--restate", "http://127.0.0.1:1")
        assert down.returncode == 14 and down.stderr.count("\n") == 1, down.stderr
