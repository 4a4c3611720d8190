"""The restate-server SIGKILLed and restarted on its ``--base-dir`` in the middle of a
group (issue 19, "engine restarts pinned"): the ranks recorded before the crash read back
the same from a fresh handle, the group completes, and every child takes one rank."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from group_support import race as race_group
from restate_stack import Stack, eventually, numbered_group, running_stack, step

from effecthost.contract import (
    CursorExhausted,
    GroupHandle,
    Settlement,
    group_key,
)
from effecthost.hosts.restate import CHILD, GROUP, RestateController
from effecthost.hosts.restate.testing import group_state

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]
TIMEOUT = 30.0


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path, owner="t") as built:
        yield built


async def _next(ctl: RestateController, handle: GroupHandle) -> Settlement:
    return await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)


def _dump(settlements: list[Settlement]) -> list[str]:
    return [s.model_dump_json() for s in settlements]


async def _idle(ctl: RestateController, key: str, prefix: str) -> list[dict[str, Any]]:
    """Poll until the engine runs nothing of the group (an engine fact, no ordering)."""
    sql = (
        "SELECT id, target_service_name AS svc, target_handler_name AS h, status "
        "FROM sys_invocation WHERE status != 'completed' AND ("
        f"(target_service_name = '{CHILD}' AND idempotency_key LIKE '%:{prefix}%') OR "
        f"(target_service_name = '{GROUP}' AND target_service_key = '{key}'))"
    )
    deadline = time.monotonic() + TIMEOUT
    rows = await ctl.query(sql)
    while rows and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        rows = await ctl.query(sql)
    return rows


async def _closed_and_retired(ctl: RestateController, handle: GroupHandle, prefix: str) -> None:
    """Close with the group's own disposition; the group retires (its tombstone alone
    remains) and the engine runs nothing of it."""
    key = handle.group_key
    await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)
    await eventually(
        lambda: group_state(ctl, key), lambda s: set(s) == {"tombstone"}, "retired", TIMEOUT
    )
    assert await _idle(ctl, key, prefix) == []


async def test_server_sigkill_mid_all_keeps_ranks_and_completes(stack: Stack) -> None:
    """G-15, G-35: a 20-child ``all`` (wake ALL, run to completion) with 10 ranks read;
    the restate-server is SIGKILLed while the other 10 children run and restarted on its
    data. A fresh handle reads the first 10 ranks byte-identical, the saved handle reads
    the other 10, each child holds exactly one rank, and nothing is left running."""
    n, k = 20, 10
    tags, group = numbered_group(group_key("sk", "all", 0), "sk.all.c", n)
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    before = []
    for tag in reversed(tags[:k]):  # ranks in an order unlike positions
        stack.lab.open(tag)
        before.append(await _next(ctl, handle))
    for tag in tags[k:]:
        await stack.lab.wait_for("started", tag, 1, TIMEOUT)
    saved = handle.to_json()

    ctl = await stack.crash_server()

    again = await ctl.open_effect_group(group)  # a reopen: a fresh cursor
    assert _dump([await _next(ctl, again) for _ in range(k)]) == _dump(before)
    restored = GroupHandle.from_json(saved)
    for tag in tags[k:]:
        await stack.lab.wait_for("started", tag, 2, TIMEOUT)  # re-run after the restart
    stack.lab.open_all("sk.all.")
    rest = [await _next(ctl, restored) for _ in range(n - k)]
    assert [s.rank for s in rest] == list(range(k + 1, n + 1))
    assert sorted(s.replay_key for s in before + rest) == sorted(tags)
    assert all(s.outcome.ok for s in rest)
    with pytest.raises(CursorExhausted):
        await ctl.await_next_settlement(restored)
    for tag in tags[:k]:
        assert stack.lab.count("finished", tag) == 1, tag  # journaled: never run again
    for tag in tags[k:]:  # cut off by the crash (cancelled in the endpoint), then re-run
        assert stack.lab.count("finished", tag) == 1, (tag, stack.lab.kinds(tag))
    await ctl.close_effect_group(restored)
    assert set(await group_state(ctl, group.key)) == {"tombstone"}
    assert await _idle(ctl, group.key, "sk.all.") == []


async def test_server_sigkill_mid_race_keeps_rank_one_and_the_loser_is_cancelled(
    stack: Stack,
) -> None:
    """G-15, G-27, R-11: a ``race`` (wake FIRST, ``CANCEL``) whose winner took rank 1 and
    whose loser runs; the restate-server is SIGKILLed and restarted on its data. Rank 1
    reads back byte-identical from a fresh handle; ``close(CANCEL)`` then cancels the
    loser, which never finishes its tool; the loser takes the group's second and last
    rank, the group retires and nothing is left running."""
    ctl = stack.controller
    group = race_group(
        group_key("sk", "race", 0), [step("sk.race.win", result="w"), step("sk.race.lose")]
    )
    handle = await ctl.open_effect_group(group)
    await stack.lab.wait_for("started", "sk.race.lose", 1, TIMEOUT)
    stack.lab.open("sk.race.win")
    first = await _next(ctl, handle)
    assert (first.rank, first.replay_key, first.outcome.value) == (1, "sk.race.win", "w")

    ctl = await stack.crash_server()

    again = await ctl.open_effect_group(group)
    assert _dump([await _next(ctl, again)]) == _dump([first])
    await _closed_and_retired(ctl, again, "sk.race.")
    assert stack.lab.count("finished", "sk.race.win") == 1
    assert stack.lab.count("finished", "sk.race.lose") == 0


async def test_server_sigkill_before_a_races_first_rank(stack: Stack) -> None:
    """G-15, G-27, R-11: the restate-server is SIGKILLed while both children of a
    ``race`` (wake FIRST, ``CANCEL``) run, before any rank, and restarted on its data.
    The children are re-run, the winner takes rank 1 once, ``close(CANCEL)`` cancels the
    loser (which never finishes its tool), the group retires and nothing is left
    running."""
    ctl = stack.controller
    group = race_group(
        group_key("sk", "early", 0), [step("sk.early.win", result="w"), step("sk.early.lose")]
    )
    handle = await ctl.open_effect_group(group)
    for tag in ("sk.early.win", "sk.early.lose"):
        await stack.lab.wait_for("started", tag, 1, TIMEOUT)

    ctl = await stack.crash_server()

    for tag in ("sk.early.win", "sk.early.lose"):
        await stack.lab.wait_for("started", tag, 2, TIMEOUT)  # re-run after the restart
    stack.lab.open("sk.early.win")
    first = await _next(ctl, handle)
    assert (first.rank, first.replay_key, first.outcome.value) == (1, "sk.early.win", "w")
    await _closed_and_retired(ctl, handle, "sk.early.")
    assert stack.lab.count("finished", "sk.early.lose") == 0
    # the attempts the crash cut off were cancelled in the endpoint: the winner's tool
    # finished once, in its re-run
    assert stack.lab.count("finished", "sk.early.win") == 1
