"""R-13 on Restate: the losers of a decided ``CANCEL`` race whose endpoint was SIGKILLed
with the losers running stay down when Restate re-runs their invocations; a caller that
reads on still gets every rank."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from restate_stack import Stack, running_stack, step

from effecthost.contract import (
    EffectGroup,
    GroupHandle,
    LoserPolicy,
    UnknownGroup,
    WakePolicy,
    group_key,
)
from effecthost.hosts.restate import RestateController, file_payload_policy
from effecthost.hosts.restate.testing import group_state

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TIMEOUT = 20.0
LOSERS = ("l1", "l2", "l3")


@pytest.fixture(params=["plain", "sealed"])
async def stack(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    """A server and an endpoint; ``sealed``: with a payload policy on both sides (the
    settlements carry only sealed outcomes)."""
    payloads, args = None, []
    if request.param == "sealed":
        payload_dir, key_dir = tmp_path / "payloads", tmp_path / "keys"
        payloads = file_payload_policy(payload_dir, key_dir)
        args = ["--payload-dir", str(payload_dir), "--key-dir", str(key_dir)]
    async with running_stack(tmp_path, endpoint_args=args, payloads=payloads) as built:
        yield built


async def _crashed_race(
    stack: Stack, name: str, wake: WakePolicy, *, winner: dict[str, Any] | None = None
) -> EffectGroup:
    """A 4-child ``CANCEL`` race whose winner took rank 1 and whose three losers were
    running their tools when the endpoint was SIGKILLed; the endpoint is back and the
    caller is a new incarnation."""
    group = effect_group(
        group_key("decided", name, 0),
        [
            step(f"{name}.w", **(winner or {"gate": False, "result": "won"})),
            *(step(f"{name}.{x}") for x in LOSERS),
        ],
        wake,
        LoserPolicy.CANCEL,
    )
    handle = await stack.controller.open_effect_group(group)
    first = await asyncio.wait_for(stack.controller.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == f"{name}.w"
    for x in LOSERS:
        await stack.lab.wait_for("started", f"{name}.{x}", 1, TIMEOUT)
    stack.local.kill_endpoint()
    await stack.local.start_endpoint()
    await stack.reconnect()
    return group


async def _rerun_reached_the_tool(stack: Stack, group: EffectGroup, name: str) -> None:
    """Wait until Restate has re-run every loser up to its tool: the tool started again,
    or the attempt is held by the group object (its ``held`` list). A bounded poll of the
    engine's retries, which no gate of ours can order."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        state = await group_state(stack.controller, group.key)
        held = json.loads(state.get("held", b"[]"))
        rerun = sum(1 for x in LOSERS if stack.lab.count("started", f"{name}.{x}") >= 2)
        if rerun + len(held) >= len(LOSERS):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the losers were not re-run: held {held}, started again {rerun}")
        await asyncio.sleep(0.05)


async def _retired(ctl: RestateController, group: EffectGroup) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            ranked = len(await ctl.settlement_order(group.key))
        except UnknownGroup:  # retired: every child took a rank
            return
        if ranked == len(group.children) or time.monotonic() > deadline:
            assert ranked == len(group.children), ranked
            return
        await asyncio.sleep(0.05)  # the cancelled losers settle one-way: an engine fact


@pytest.mark.parametrize("wake", [WakePolicy.FIRST, WakePolicy.FIRST_SUCCESS])
async def test_R13_a_reopen_reread_and_close_start_no_loser_again(
    stack: Stack, wake: WakePolicy
) -> None:
    """R-13: a decided ``CANCEL`` race (``FIRST``: rank 1 exists; ``FIRST_SUCCESS``: a
    success holds it) whose endpoint was SIGKILLed with three losers running: Restate
    re-runs the losers' invocations when the endpoint is back, and none of them starts
    its tool again; the reopen, the re-read of rank 1 and the close start none either,
    and every loser still settles (cancelled) and takes a rank."""
    name = f"down.{wake.value}"
    group = await _crashed_race(stack, name, wake)
    await _rerun_reached_the_tool(stack, group, name)
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == f"{name}.w"
    await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)
    await _retired(ctl, group)
    starts = {x: stack.lab.count("started", f"{name}.{x}") for x in LOSERS}
    assert starts == dict.fromkeys(LOSERS, 1), f"losers started again: {starts}"


async def test_R13_a_caller_reading_on_gets_every_rank(stack: Stack) -> None:
    """R-13: after the same crash, a caller that reopens, re-reads rank 1 and reads on
    gets every loser's rank, each a success: its await of rank 2, which does not exist
    yet, starts the held losers."""
    name = "on"
    group = await _crashed_race(stack, name, WakePolicy.FIRST)
    await _rerun_reached_the_tool(stack, group, name)
    ctl = stack.controller
    handle: GroupHandle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == f"{name}.w"
    early = {x: stack.lab.count("started", f"{name}.{x}") for x in LOSERS}
    assert early == dict.fromkeys(LOSERS, 1), f"started before any await: {early}"
    stack.lab.open_all(f"{name}.")
    served = [await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT) for _ in LOSERS]
    assert sorted(s.replay_key for s in served) == sorted(f"{name}.{x}" for x in LOSERS)
    assert all(s.outcome.status == "success" for s in served), served
    assert [s.rank for s in served] == [2, 3, 4]
    await ctl.close_effect_group(handle)


async def test_R13_a_drain_pass_before_the_reopen_cancels_the_held_losers(stack: Stack) -> None:
    """R-13, G-29: after the same crash, the owner's next incarnation runs a drain pass
    before it reopens: the held losers are cancelled without their tools starting again,
    and each takes a rank."""
    name = "drained"
    group = await _crashed_race(stack, name, WakePolicy.FIRST)
    await _rerun_reached_the_tool(stack, group, name)
    report = await asyncio.wait_for(stack.controller.drain().run_pass(), TIMEOUT)
    assert sorted(rk for key, rk in report.cancelled if key == group.key) == sorted(
        f"{name}.{x}" for x in LOSERS
    )
    assert not report.resumed
    handle = await stack.controller.open_effect_group(group)
    served = [
        await asyncio.wait_for(stack.controller.await_next_settlement(handle), TIMEOUT)
        for _ in group.children
    ]
    assert [s.outcome.status for s in served[1:]] == ["cancelled"] * len(LOSERS)
    await stack.controller.close_effect_group(handle)
    starts = {x: stack.lab.count("started", f"{name}.{x}") for x in LOSERS}
    assert starts == dict.fromkeys(LOSERS, 1), f"losers started again: {starts}"


@pytest.mark.parametrize(
    ("wake", "winner"),
    [
        (WakePolicy.FIRST_SUCCESS, {"gate": False, "error": "Boom"}),
        (WakePolicy.ALL, {"gate": False, "result": "won"}),
    ],
    ids=["first_success-after-a-failure", "all"],
)
async def test_R13_an_undecided_group_runs_its_losers_again(
    stack: Stack, wake: WakePolicy, winner: dict[str, Any]
) -> None:
    """R-13 leaves undecided groups as they were: a ``FIRST_SUCCESS`` race whose rank 1
    is a failure, and an ``ALL`` group (never decided), re-run their cut-off children when
    the endpoint is back, with no caller awaiting anything."""
    name = f"undecided.{wake.value}"
    group = await _crashed_race(stack, name, wake, winner=winner)
    for x in LOSERS:
        await stack.lab.wait_for("started", f"{name}.{x}", 2, TIMEOUT)
    assert json.loads((await group_state(stack.controller, group.key)).get("held", b"[]")) == []
    stack.lab.open_all(f"{name}.")
    handle = await stack.controller.open_effect_group(group)
    for _ in group.children:
        await asyncio.wait_for(stack.controller.await_next_settlement(handle), TIMEOUT)
    await stack.controller.close_effect_group(handle)
