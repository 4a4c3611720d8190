"""R-1 beside another process, the same scenario on each engine tier: a caller process
opens a ``CANCEL`` group and holds its owner lease; a drain here leaves the group alone
while that process lives and cancels its children once it is SIGKILLed and the lease has
lapsed. The engines' tests and their caller processes share it from here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from group_support import event, group, tool

from effecthost.conformance import STEP, Lab, step_input
from effecthost.contract import (
    DrainReport,
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    WakePolicy,
    sleep_input,
)

OWNER = "tests"
OWNER_TTL = 2.0
"""Short, so a test sees a killed caller's lease lapse soon after the SIGKILL."""
TIMEOUT = 20.0


def owned_group(key: str) -> EffectGroup:
    """A ``CANCEL`` race of a gated tool call, an event wait and a long timer: what a live
    owner's drain must leave alone and a gone owner's drain cancels (R-1)."""
    nap = EffectEnvelope(
        replay_key=f"{key}:nap", kind=EffectKind.SLEEP, name="sleep", input=sleep_input(600.0)
    )
    children = [tool(f"{key}:tool", step_input(f"{key}:tool"), STEP), event(f"{key}:ev"), nap]
    return group(key, children, WakePolicy.FIRST, LoserPolicy.CANCEL)


def _touched(report: DrainReport, key: str) -> dict[str, list[str]]:
    return {
        "resumed": sorted(rk for k, rk in report.resumed if k == key),
        "cancelled": sorted(rk for k, rk in report.cancelled if k == key),
        "no_executor": sorted(e.replay_key for e in report.no_executor if e.group_key == key),
    }


async def _pass(ctl: EffectController, key: str) -> dict[str, list[str]]:
    return _touched(await asyncio.wait_for(ctl.drain().run_pass(), TIMEOUT), key)


async def drain_beside_a_live_owner(
    owner_command: list[str],
    controllers: Callable[[], Awaitable[tuple[EffectController, EffectController]]],
    lab: Lab,
    key: str,
    **spawn: Any,
) -> None:
    """Start the caller process ``owner_command`` (it opens :func:`owned_group` ``key``
    and prints ``opened``); a wired and an unwired drain (``controllers``) touch nothing
    while it lives; once it is SIGKILLed and its lease has lapsed the wired drain cancels
    all three children."""
    owner = await asyncio.create_subprocess_exec(
        *owner_command, stdout=asyncio.subprocess.PIPE, **spawn
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(owner.stdout.readline(), 60)
        assert line.strip() == b"opened", line
        await lab.wait_for("started", f"{key}:tool", 1, TIMEOUT)
        wired, unwired = await controllers()
        nothing: dict[str, list[str]] = {"resumed": [], "cancelled": [], "no_executor": []}
        assert await _pass(wired, key) == nothing
        assert await _pass(unwired, key) == nothing
        assert lab.count("cancelled", f"{key}:tool") == 0
    finally:
        if owner.returncode is None:
            owner.kill()
        await owner.wait()
    # A bounded poll: the killed owner's lease lapses on the engine's clock, OWNER_TTL
    # seconds after its last renewal; no event of ours marks that moment.
    deadline = time.monotonic() + OWNER_TTL + TIMEOUT
    while True:
        touched = await _pass(wired, key)
        if touched["cancelled"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert touched["cancelled"] == sorted(f"{key}:{x}" for x in ("tool", "ev", "nap"))
    await lab.wait_for("cancelled", f"{key}:tool", 1, TIMEOUT)
