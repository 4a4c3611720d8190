"""R-11 on Restate: a closed group retires only when its last child settles. Until then
its replay keys stay claimed and ``deliver_event`` still reaches its pending waits; at
retirement the group object's state goes (the tombstone stays) and nothing is left
running in the engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from group_support import group as effect_group
from restate_stack import Stack, eventually, step

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupClosed,
    ReplayMismatch,
    WakePolicy,
    group_key,
)
from effecthost.hosts.restate import CHILD, GROUP, RestateController
from effecthost.hosts.restate.testing import group_state

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TIMEOUT = 20.0


def _event(tag: str, name: str) -> EffectEnvelope:
    return EffectEnvelope(replay_key=tag, kind=EffectKind.AWAIT_EVENT, name=name, input=None)


def _won_race_and_a_wait(prefix: str, name: str) -> EffectGroup:
    """A ``RUN_TO_COMPLETION`` race of a step that settles at once (``{prefix}.win``) and
    a wait for event ``go`` (``{prefix}.wait``)."""
    children = [step(f"{prefix}.win", gate=False), _event(f"{prefix}.wait", "go")]
    return effect_group(group_key(prefix, name, 0), children, WakePolicy.FIRST)


async def running_children(ctl: RestateController, key: str) -> list[dict[str, Any]]:
    """The group's children (their replay keys start with the group key's first part) and
    calls to its object that the engine has not completed."""
    return await ctl.query(
        "SELECT id, target_service_name AS svc, target_handler_name AS h, status "
        "FROM sys_invocation WHERE status != 'completed' AND ("
        f"(target_service_name = '{CHILD}' AND idempotency_key LIKE '%:{key.split(':')[0]}%')"
        f" OR (target_service_name = '{GROUP}' AND target_service_key = '{key}'))"
    )


async def set_state(stack: Stack, key: str, values: dict[str, Any]) -> None:
    """Replace the group object's state through the admin API (what the release before
    left after a close), and wait until the state view shows it (applied asynchronously)."""
    wanted = {name: json.dumps(value).encode("utf-8") for name, value in values.items()}
    async with httpx.AsyncClient(timeout=30.0) as client:
        answer = await client.post(
            f"{stack.local.admin_url}/services/{GROUP}/state",
            json={"object_key": key, "new_state": {k: list(v) for k, v in wanted.items()}},
        )
        answer.raise_for_status()
    await eventually(lambda: state_keys(stack.controller, key), lambda k: k == set(wanted), "state")


async def state_keys(ctl: RestateController, key: str) -> set[str]:
    return set(await group_state(ctl, key))


async def test_R11_deliver_reaches_a_closed_groups_pending_wait_then_the_group_retires(
    stack: Stack,
) -> None:
    """R-11, R-5, R-4: a closed ``RUN_TO_COMPLETION`` race whose loser is a pending
    ``await_event`` child keeps its state (not retired): ``deliver_event`` returns 1, the
    child settles, the group retires (only the tombstone is left, nothing runs); then
    ``deliver_event`` returns 0 and every await stays ``GroupClosed``."""
    ctl = stack.controller
    group = _won_race_and_a_wait("r11ev", "race")
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == "r11ev.win"
    await ctl.close_effect_group(handle)
    assert group.key not in await ctl.open_group_keys()
    with pytest.raises(GroupClosed):
        await ctl.await_next_settlement(group.handle())
    assert "children" in await state_keys(ctl, group.key), "retired before its child settled"

    assert await ctl.deliver_event(group.key, "go", {"n": 1}) == 1
    await eventually(
        lambda: state_keys(ctl, group.key), lambda keys: keys == {"tombstone"}, "retirement"
    )
    assert await ctl.deliver_event(group.key, "go", {"n": 2}) == 0
    with pytest.raises(GroupClosed):
        await ctl.await_next_settlement(group.handle())
    assert await eventually(lambda: running_children(ctl, group.key), lambda r: not r, "idle") == []


async def test_R11_a_closed_groups_replay_keys_stay_claimed_until_its_loser_settles(
    stack: Stack,
) -> None:
    """R-11, R-6: a closed ``RUN_TO_COMPLETION`` race whose loser is a slow (gated) tool
    still holds its replay keys: a new group claiming them is ``ReplayMismatch`` naming the
    closed group, until the loser settles and the group retires; then it is recorded."""
    ctl = stack.controller
    keys = ["r11rk.win", "r11rk.slow"]
    first = effect_group(
        group_key("r11rk", "first", 0), [step(keys[0], gate=False), step(keys[1])], WakePolicy.FIRST
    )
    second = effect_group(group_key("r11rk", "second", 0), [step(k, gate=False) for k in keys])
    handle = await ctl.open_effect_group(first)
    await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    await stack.lab.wait_for("started", keys[1], 1, TIMEOUT)
    await ctl.close_effect_group(handle)
    for _ in range(3):
        with pytest.raises(ReplayMismatch) as refused:
            await ctl.open_effect_group(second)
        assert first.key in str(refused.value) and second.key in str(refused.value)
    assert await group_state(ctl, second.key) == {}
    assert stack.lab.count("finished", keys[1]) == 0

    stack.lab.open(keys[1])
    await stack.lab.wait_for("finished", keys[1], 1, TIMEOUT)
    await eventually(
        lambda: state_keys(ctl, first.key), lambda found: found == {"tombstone"}, "retirement"
    )
    reopened = await ctl.open_effect_group(second)
    for _ in range(2):
        await asyncio.wait_for(ctl.await_next_settlement(reopened), TIMEOUT)
    await ctl.close_effect_group(reopened)
    assert stack.lab.count("finished", keys[1]) == 2  # once per group, not more
    for key in (first.key, second.key):
        assert (
            await eventually(lambda k=key: running_children(ctl, k), lambda r: not r, "idle") == []
        )


async def test_R11_a_group_closed_by_the_release_before_stays_closed(stack: Stack) -> None:
    """R-4, R-11 (the in-flight upgrade): a group closed by the release before holds only
    its tombstone (its state went at close); it is closed for opens, awaits and closes,
    ``deliver_event`` reaches nothing, and its replay keys are free."""
    ctl = stack.controller
    group = _won_race_and_a_wait("r11old", "closed")
    handle = await ctl.open_effect_group(group)
    await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    state = await group_state(ctl, group.key)
    epoch = json.loads(state["shape"])["epoch"]
    await set_state(
        stack, group.key, {"tombstone": {"effective": "run_to_completion", "epoch": epoch}}
    )
    with pytest.raises(GroupClosed):
        await ctl.open_effect_group(group)
    with pytest.raises(GroupClosed):
        await ctl.await_next_settlement(group.handle())
    await ctl.close_effect_group(handle)
    assert await ctl.deliver_event(group.key, "go", 1) == 0
    again = effect_group(group_key("r11old", "again", 0), [step("r11old.win", gate=False)])
    reopened = await ctl.open_effect_group(again)
    await asyncio.wait_for(ctl.await_next_settlement(reopened), TIMEOUT)
    await ctl.close_effect_group(reopened)
