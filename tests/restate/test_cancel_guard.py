"""Issue 25 on one node: an attempt of a child of a group closed with ``CANCEL`` never
starts its tool, also when it is a re-run of an attempt that was cut off (the endpoint
SIGKILLed) and the re-run begins after the close returned (G-27, R-11)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from group_support import group as effect_group
from group_support import race as race_group
from restate_stack import Stack, eventually, running_stack, step

from effecthost.contract import (
    LoserPolicy,
    WakePolicy,
    group_key,
)
from effecthost.hosts.restate import CHILD, GROUP, RestateController
from effecthost.hosts.restate.testing import LocalRestate, free_port, group_state

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]
TIMEOUT = 20.0


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens: a dead node


def _two_dead_admins(local: LocalRestate) -> None:
    local.endpoint_admin_urls = [_dead_url(), local.admin_url, _dead_url()]


def _no_admin(local: LocalRestate) -> None:
    local.endpoint_admin_urls = [_dead_url(), _dead_url()]


async def _child(ctl: RestateController, tag: str) -> list[dict[str, Any]]:
    return await ctl.query(
        "SELECT id, status, completion_result, completion_failure FROM sys_invocation "
        f"WHERE target_service_name = '{CHILD}' AND idempotency_key LIKE '%:{tag}:%'"
    )


async def test_issue25_a_cancelled_losers_rerun_after_close_does_not_start_its_tool(
    stack: Stack,
) -> None:
    """G-27, issue 25: a ``CANCEL`` race's loser is running its tool when the endpoint is
    SIGKILLed; its invocation is held (paused) so that its re-run begins only after
    ``close(CANCEL)`` has returned; the re-run settles the child as cancelled without
    starting the tool again, and the group retires (R-11)."""
    ctl = stack.controller
    group = race_group(
        group_key("guard", "race", 0), [step("guard.win", gate=False), step("guard.lose")]
    )
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == "guard.win"
    await stack.lab.wait_for("started", "guard.lose", 1, TIMEOUT)
    (loser,) = await _child(ctl, "guard.lose")

    stack.local.kill_endpoint()
    async with httpx.AsyncClient(timeout=10.0) as client:
        paused = await client.patch(f"{stack.local.admin_url}/invocations/{loser['id']}/pause")
        assert paused.status_code < 300, paused.text
        await eventually(
            lambda: _child(ctl, "guard.lose"), lambda rows: rows[0]["status"] == "paused", "pause"
        )
        await stack.local.start_endpoint()
        await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)
        resumed = await client.patch(f"{stack.local.admin_url}/invocations/{loser['id']}/resume")
        assert resumed.status_code < 300 or resumed.status_code == 409, resumed.text

    rows = await eventually(
        lambda: _child(ctl, "guard.lose"), lambda rows: rows[0]["status"] == "completed", "settle"
    )
    await eventually(
        lambda: group_state(ctl, group.key), lambda state: set(state) == {"tombstone"}, "retire"
    )
    assert stack.lab.count("started", "guard.lose") == 1, rows
    assert stack.lab.count("finished", "guard.lose") == 0


@pytest.mark.parametrize("declared", [LoserPolicy.CANCEL, LoserPolicy.RUN_TO_COMPLETION])
async def test_issue25_a_rerun_whose_cancel_is_still_in_flight_does_not_start_its_tool(
    stack: Stack, declared: LoserPolicy
) -> None:
    """G-27, issue 25: the guard itself. On a cluster a re-run can begin after
    ``close(CANCEL)`` returned and before its cancel arrives. Modelled on one node: the
    loser's cut-off invocation is paused, the group object is given the state a close
    under ``CANCEL`` records before it issues any cancel (through the admin API), and the
    invocation is resumed with no cancel sent: its re-run reads the disposition in force
    and settles the child as cancelled without starting the tool; the group retires. Also
    for a group declaring ``RUN_TO_COMPLETION`` that a close narrowed to ``CANCEL`` (its
    children's first attempts read nothing; a re-run does)."""
    ctl = stack.controller
    tag = f"guard.{declared.value}"
    late = f"{tag}.late"
    group = effect_group(
        group_key("guard", declared.value, 0),
        [step(f"{tag}.first", gate=False), step(late)],
        WakePolicy.FIRST,
        declared,
    )
    handle = await ctl.open_effect_group(group)
    await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    await stack.lab.wait_for("started", late, 1, TIMEOUT)
    (loser,) = await _child(ctl, late)

    stack.local.kill_endpoint()
    async with httpx.AsyncClient(timeout=10.0) as client:
        paused = await client.patch(f"{stack.local.admin_url}/invocations/{loser['id']}/pause")
        assert paused.status_code < 300, paused.text
        await eventually(
            lambda: _child(ctl, late), lambda rows: rows[0]["status"] == "paused", "pause"
        )
        state = {k: json.loads(v) for k, v in (await group_state(ctl, group.key)).items()}
        shape = {**state.pop("shape"), "effective": "cancel"}
        state.pop("waiters", None)
        state["tombstone"] = {
            "effective": "cancel",
            "epoch": shape["epoch"],
            "pending": True,
            "shape": shape,
        }
        wanted = {k: list(json.dumps(v).encode("utf-8")) for k, v in state.items()}
        answer = await client.post(
            f"{stack.local.admin_url}/services/{GROUP}/state",
            json={"object_key": group.key, "new_state": wanted},
        )
        answer.raise_for_status()
        await eventually(
            lambda: group_state(ctl, group.key), lambda found: "tombstone" in found, "the state"
        )
        await stack.local.start_endpoint()
        resumed = await client.patch(f"{stack.local.admin_url}/invocations/{loser['id']}/resume")
        assert resumed.status_code < 300, resumed.text

    rows = await eventually(
        lambda: _child(ctl, late), lambda rows: rows[0]["status"] == "completed", "settle"
    )
    await eventually(
        lambda: group_state(ctl, group.key), lambda state: set(state) == {"tombstone"}, "retire"
    )
    assert stack.lab.count("started", late) == 1, rows
    assert stack.lab.count("finished", late) == 0


async def test_issue25_the_guard_and_the_target_check_fail_over_between_admin_urls(
    tmp_path: Path,
) -> None:
    """R-12, issue 25: the endpoint takes several admin URLs (the nodes of a cluster) and
    its admin reads fail over between them: with two of three URLs dead (the first
    and the last), a ``CANCEL``
    race's children still read their group's tombstone (the guard) and run their tools,
    and a routed child still finds its target unbound (G-14) instead of retrying while
    the node it was reading is gone."""
    async with running_stack(tmp_path, before_start=_two_dead_admins) as stack:
        ctl = stack.controller
        race = race_group(
            group_key("failover", "race", 0),
            [step("failover.win", gate=False), step("failover.lose")],
        )
        handle = await ctl.open_effect_group(race)
        first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        assert first.replay_key == "failover.win" and first.outcome.error is None, first
        await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)

        routed = effect_group(
            group_key("failover", "routed", 0), [step("failover.routed", gate=False)]
        )
        handle = await ctl.open_routed(routed, {0: "NoSuchService/handler"})
        settlement = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        assert settlement.outcome.error is not None, settlement
        assert settlement.outcome.error.code == 404, settlement
        await ctl.close_effect_group(handle)


async def test_issue25_no_admin_api_answering_holds_the_tool_in_retries(tmp_path: Path) -> None:
    """G-27, issue 25: when none of the endpoint's admin URLs answers, the guard's read
    fails and the attempt is retried; the tool of a child of a ``CANCEL`` group never
    starts on a guess."""
    async with running_stack(tmp_path, before_start=_no_admin) as stack:
        ctl = stack.controller
        race = race_group(
            group_key("noadmin", "race", 0),
            [step("noadmin.a", gate=False), step("noadmin.b", gate=False)],
        )
        await ctl.open_effect_group(race)

        async def retried() -> list[dict[str, Any]]:
            return await ctl.query(
                "SELECT retry_count, last_failure FROM sys_invocation "
                f"WHERE target_service_name = '{CHILD}' "
                "AND idempotency_key LIKE '%:noadmin.%'"
            )

        # retry_count 2: the first attempt failed (its read took ADMIN_BOUND, 10 s)
        deadline = time.monotonic() + 60.0
        rows = await retried()
        while not (len(rows) == 2 and all(r["retry_count"] >= 2 for r in rows)):
            assert time.monotonic() < deadline, rows
            await asyncio.sleep(0.2)  # a bounded poll of the engine's state
            rows = await retried()
        assert all("admin" in str(r.get("last_failure")) for r in rows), rows
        assert stack.lab.count("started", "noadmin.a") == 0
        assert stack.lab.count("started", "noadmin.b") == 0
