"""Close under CANCEL returns while the loser still runs; the loser ends cancelled
(G-27, G-45)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from effecthost.contract import EffectGroup, LoserPolicy, WakePolicy

from ._support import running_host, step


@pytest.mark.timeout(90)
def test_cancel_close_returns_while_the_loser_runs(tmp_path: Path) -> None:
    asyncio.run(_cancel(tmp_path))


async def _cancel(root: Path) -> None:
    async with running_host(root) as (host, lab):
        group = EffectGroup(
            key="cancel:group:race:0",
            wake=WakePolicy.FIRST,
            disposition=LoserPolicy.CANCEL,
            children=[step("cc.win", gate=False, result="W"), step("cc.lose", hold_cancel=True)],
        )
        ctl = await host.controller()
        handle = await ctl.open_effect_group(group)
        first = await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
        assert first.replay_key == "cc.win" and first.outcome.value == "W"
        await lab.wait_for("started", "cc.lose", timeout=20)

        await asyncio.wait_for(ctl.close_effect_group(handle), 20)
        # The close has returned; the loser is still running (it holds in its cancel
        # handler until we release it) and the cancel reaches it through a heartbeat.
        await lab.wait_for("cancelled", "cc.lose", timeout=20)
        assert lab.count("finished", "cc.lose") == 0
        assert host.client is not None
        wf = host.client.get_workflow_handle(group.key)
        second = await wf.query("read", 2)
        assert second["settlement"]["replay_key"] == "cc.lose"
        assert second["settlement"]["outcome"]["status"] == "cancelled"

        lab.open("cc.lose/release")
        await asyncio.wait_for(wf.result(), 20)  # the run ends: closed, all settled
        assert lab.count("finished", "cc.lose") == 0
        assert group.key not in await ctl.open_group_keys()
