"""The Restate tier against a real restate-server: the conformance suite, a crash of the
endpoint mid-group, an unbound target, and a CANCEL close that does not wait."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from group_support import group as effect_group
from group_support import race as race_group
from restate_stack import Stack, numbered_group, step
from suite_support import ENGINE_GAPS, assert_suite_passed

from effecthost.combinators import Scope, next_group_key, race, tool
from effecthost.conformance import (
    STEP,
    UNROUTABLE,
    run_suite,
    step_input,
)
from effecthost.contract import (
    CursorExhausted,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupHandle,
    InvalidEnvelope,
    LoserPolicy,
    ReplayMismatch,
    WakePolicy,
    group_key,
)
from effecthost.hosts.restate import CHILD, GROUP, OWNER, PAYLOAD, REPLAY_KEY, RestateController
from effecthost.hosts.restate._endpoint import COLLECT_FROM, COLLECT_SLICE
from effecthost.hosts.restate.testing import (
    UNBOUND_TARGET,
    factory,
    group_state,
    sealed_factory,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from untyped_calls import wrong_type_calls

pytestmark = pytest.mark.anyio
TIMEOUT = 20.0


@pytest.mark.idle
async def test_conformance_suite_passes() -> None:
    assert_suite_passed(await run_suite(factory, keep=True), may_miss=ENGINE_GAPS)


@pytest.mark.parametrize("host_factory", [factory, sealed_factory], ids=["plain", "sealed"])
async def test_conformance_G19_the_parked_await_check_runs_on_restate(host_factory: Any) -> None:
    """G-19: the Restate factories declare ``waiter_probe`` (the group object's recorded
    waiters), so cancelling an await while its read is parked at the engine is checked,
    not skipped."""
    report = await run_suite(host_factory, select="cancelling_a_parked_await_changes_nothing")
    assert [r.status for r in report.results] == ["passed"], report.table()


async def test_endpoint_crash_keeps_ranks_and_settles_the_rest_once(stack: Stack) -> None:
    n, k = 6, 3
    tags, group = numbered_group(group_key("crash", "batch", 0), "crash.c", n)
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    before = []
    for tag in reversed(tags[-k:]):  # settle k children, in an order unlike positions
        stack.lab.open(tag)
        before.append(await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT))
    for tag in tags[:-k]:
        await stack.lab.wait_for("started", tag, 1, TIMEOUT)
    saved = handle.to_json()

    ctl = await stack.crash_endpoint()

    reopened = await ctl.open_effect_group(group)
    again = [await asyncio.wait_for(ctl.await_next_settlement(reopened), TIMEOUT) for _ in range(k)]
    assert [s.model_dump_json() for s in again] == [s.model_dump_json() for s in before]

    restored = type(handle).from_json(saved)
    for tag in tags[:-k]:
        await stack.lab.wait_for("started", tag, 2, TIMEOUT)  # re-run by the restarted endpoint
        stack.lab.open(tag)
    rest = [
        await asyncio.wait_for(ctl.await_next_settlement(restored), TIMEOUT) for _ in range(n - k)
    ]
    assert [s.rank for s in rest] == list(range(k + 1, n + 1))
    assert sorted(s.replay_key for s in rest) == sorted(tags[:-k])
    assert all(s.outcome.ok for s in rest)
    with pytest.raises(CursorExhausted):
        await ctl.await_next_settlement(restored)
    for tag in tags:
        assert stack.lab.count("finished", tag) == 1, tag
    await ctl.close_effect_group(restored)


async def test_unbound_target_is_a_terminal_404_within_seconds(stack: Stack) -> None:
    group = effect_group(group_key("unbound", "batch", 0), [step("unbound.x", gate=False)])
    ctl = stack.controller
    started = time.monotonic()
    handle = await ctl.open_routed(group, {0: UNBOUND_TARGET})
    settlement = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    elapsed = time.monotonic() - started
    assert settlement.outcome.error is not None and settlement.outcome.error.code == 404
    assert elapsed < 5.0, f"took {elapsed:.1f}s"
    rows = await ctl.query(
        f"SELECT status, completion_failure, retry_count FROM sys_invocation "
        f"WHERE target_service_name = '{CHILD}' AND target_service_key IS NULL"
    )
    failures = [r for r in rows if "404" in str(r.get("completion_failure"))]
    assert failures and all(r["status"] == "completed" for r in failures), rows
    await ctl.close_effect_group(handle)


async def test_cancel_close_returns_while_the_loser_runs(stack: Stack) -> None:
    group = race_group(
        group_key("cancel", "batch", 0),
        [step("cancel.win", gate=False), step("cancel.lose", hold_cancel=True)],
    )
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == "cancel.win"
    await stack.lab.wait_for("started", "cancel.lose", 1, TIMEOUT)
    await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)
    # close returned; the loser received the cancel and is still holding (not finished)
    await stack.lab.wait_for("cancelled", "cancel.lose", 1, TIMEOUT)
    assert stack.lab.count("finished", "cancel.lose") == 0
    assert group.key not in await ctl.open_group_keys()
    stack.lab.open("cancel.lose/release")

    async def loser_status() -> list[dict[str, Any]]:
        return await ctl.query(
            f"SELECT status, completion_failure FROM sys_invocation "
            f"WHERE target_service_name = '{CHILD}' AND idempotency_key LIKE '%:cancel.lose:%'"
        )

    deadline = time.monotonic() + TIMEOUT
    rows = await loser_status()
    while not (rows and rows[0]["status"] == "completed") and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # polling an engine fact, not ordering anything
        rows = await loser_status()
    assert rows and rows[0]["status"] == "completed", rows
    assert (
        "409" in str(rows[0]["completion_failure"])
        or "cancel" in str(rows[0]["completion_failure"]).lower()
    ), rows


async def _rewrite_shape(stack: Stack, key: str, drop: tuple[str, ...]) -> None:
    """Make ``key`` look as the release before recorded it: its ``shape`` without
    ``drop``, through the admin API's state modification (applied asynchronously)."""
    ctl = stack.controller
    state = await group_state(ctl, key)
    shape = json.loads(state["shape"])
    for name in drop:
        shape.pop(name, None)
    state["shape"] = json.dumps(shape).encode("utf-8")
    async with httpx.AsyncClient(timeout=30.0) as client:
        answer = await client.post(
            f"{stack.local.admin_url}/services/{GROUP}/state",
            json={"object_key": key, "new_state": {k: list(v) for k, v in state.items()}},
        )
        answer.raise_for_status()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if json.loads((await group_state(ctl, key))["shape"]) == shape:
            return
        await asyncio.sleep(0.05)  # polling an engine fact, not ordering anything
    raise AssertionError("the state modification was not applied")


async def test_G41_close_clears_spilled_outcomes_also_of_a_group_of_the_layout_before(
    stack: Stack,
) -> None:
    """G-40, G-41: close clears the payload object when an outcome of the group spilled
    into it — also for a group recorded by the release before (its ``shape`` has neither
    ``layout`` nor ``spilled``: the in-flight upgrade) — and a group with nothing spilled
    sends no clear."""
    ctl = stack.controller
    big = {"blob": "x" * 6000}  # over the inline threshold

    async def rows(sql: str) -> list[dict[str, Any]]:
        return await ctl.query(sql)

    def payload_sql(key: str) -> str:
        return f"SELECT key FROM state WHERE service_name = '{PAYLOAD}' AND service_key = '{key}'"

    small = effect_group(
        group_key("spill", "none", 0), [step("spill.none", gate=False, result={"small": 1})]
    )
    handle = await ctl.open_effect_group(small)
    await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    await ctl.close_effect_group(handle)
    for name, legacy in (("new", False), ("legacy", True)):
        group = effect_group(
            group_key("spill", name, 0), [step(f"spill.{name}", gate=False, result=big)]
        )
        handle = await ctl.open_effect_group(group)
        settled = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        assert settled.outcome.value == big
        assert await rows(payload_sql(group.key)), "the outcome did not spill"
        if legacy:
            await _rewrite_shape(stack, group.key, ("layout", "spilled"))
        await ctl.close_effect_group(handle)
        deadline = time.monotonic() + TIMEOUT
        left = await rows(payload_sql(group.key))
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the clear is one-way: polling an engine fact
            left = await rows(payload_sql(group.key))
        assert left == [], name
    clears = await rows(
        f"SELECT id FROM sys_invocation WHERE target_service_name = '{PAYLOAD}' "
        f"AND target_handler_name = 'clear' AND target_service_key = '{small.key}'"
    )
    assert clears == []  # closed before the others, whose clears have run


async def test_R6_a_replay_key_is_held_by_one_group_until_it_closes(stack: Stack) -> None:
    """R-6 (and R-2's open order): a first open whose child reuses a replay key another
    group holds is ``ReplayMismatch`` naming both group keys, also when another child of
    it cannot be resolved; it records nothing, its partial claims included; the key is
    free again once the holder closes."""
    ctl = stack.controller
    one = effect_group(group_key("r6", "one", 0), [step("r6.shared", gate=False)])
    two = effect_group(
        group_key("r6", "two", 0), [step("r6.own", gate=False), step("r6.shared", gate=False)]
    )
    unresolvable = EffectEnvelope(
        replay_key="r6.nowhere", kind=EffectKind.TOOL_CALL, name=UNROUTABLE, input=None
    )
    three = effect_group(group_key("r6", "three", 0), [unresolvable, step("r6.shared", gate=False)])
    handle = await ctl.open_effect_group(one)
    await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    with pytest.raises(ReplayMismatch) as refused:
        await ctl.open_effect_group(two)
    assert one.key in str(refused.value) and two.key in str(refused.value)
    assert (refused.value.replay_key, refused.value.position) == ("r6.shared", 1)
    with pytest.raises(ReplayMismatch):
        await ctl.open_effect_group(three)
    assert await group_state(ctl, two.key) == {}

    async def claimed(replay_key: str) -> list[dict[str, Any]]:
        return await ctl.query(
            f"SELECT key FROM state WHERE service_name = '{REPLAY_KEY}' "
            f"AND service_key = '{replay_key}'"
        )

    deadline = time.monotonic() + TIMEOUT
    rows = await claimed("r6.own")
    while rows and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the release is one-way: polling an engine fact
        rows = await claimed("r6.own")
    assert rows == [], "a refused open kept a claim"
    assert stack.lab.count("started", "r6.own") == 0

    await ctl.close_effect_group(handle)
    reopened = await ctl.open_effect_group(two)
    first = await asyncio.wait_for(ctl.await_next_settlement(reopened), TIMEOUT)
    assert first.replay_key in ("r6.own", "r6.shared")
    await ctl.close_effect_group(reopened)


async def test_R6_keys_of_one_prefix_are_claimed_in_one_call(stack: Stack) -> None:
    """R-6, R-2: replay keys of the form ``{prefix}:{n}`` (what the combinators give a
    group's children) are claimed on one object per prefix, in one call per open; a
    first open reusing one of them is ``ReplayMismatch`` naming both group keys and the
    child, also when another child cannot be resolved, and leaves no claim behind; the
    keys are free once the holder closes."""
    ctl = stack.controller

    def group(name: str, keys: list[str], *extra: EffectEnvelope) -> EffectGroup:
        return effect_group(
            group_key("r6p", name, 0), [*extra, *(step(k, gate=False) for k in keys)]
        )

    one = group("one", ["r6p.a:0", "r6p.a:1", "r6p.a:2"])
    two = group("two", ["r6p.b:0", "r6p.a:2"])
    unresolvable = EffectEnvelope(
        replay_key="r6p.c:0", kind=EffectKind.TOOL_CALL, name=UNROUTABLE, input=None
    )
    three = group("three", ["r6p.a:1"], unresolvable)
    handle = await ctl.open_effect_group(one)
    claims = await ctl.query(
        f"SELECT target_handler_name AS h, target_service_key AS k FROM sys_invocation "
        f"WHERE target_service_name = '{REPLAY_KEY}' AND target_service_key LIKE 'r6p.%'"
    )
    assert claims == [{"h": "claim_keys", "k": "r6p.a"}]
    with pytest.raises(ReplayMismatch) as refused:
        await ctl.open_effect_group(two)
    assert one.key in str(refused.value) and two.key in str(refused.value)
    assert (refused.value.replay_key, refused.value.position) == ("r6p.a:2", 1)
    with pytest.raises(ReplayMismatch) as refused:
        await ctl.open_effect_group(three)
    assert (refused.value.replay_key, refused.value.position) == ("r6p.a:1", 1)
    assert await group_state(ctl, two.key) == {}

    deadline = time.monotonic() + TIMEOUT
    sql = f"SELECT key FROM state WHERE service_name = '{REPLAY_KEY}' AND service_key = 'r6p.b'"
    rows = await ctl.query(sql)
    while rows and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the release is one-way: polling an engine fact
        rows = await ctl.query(sql)
    assert rows == [], "a refused open kept a claim"
    assert stack.lab.count("started", "r6p.b:0") == 0

    for _ in range(3):
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    await ctl.close_effect_group(handle)
    reopened = await ctl.open_effect_group(two)
    await asyncio.wait_for(ctl.await_next_settlement(reopened), TIMEOUT)
    await ctl.close_effect_group(reopened)


async def test_R6_concurrent_opens_sharing_a_prefixed_key_record_one_group(stack: Stack) -> None:
    """R-6: first opens of different groups racing for one replay key of the form
    ``{prefix}:{n}`` (each group with a key of its own beside it): exactly one is recorded,
    the others are ``ReplayMismatch``, and no child of a refused group runs."""
    ctl = stack.controller
    groups = [
        effect_group(
            group_key("r6q", f"g{i}", 0),
            [step(f"r6q.own{i}:0", gate=False), step("r6q.shared:0", gate=False)],
        )
        for i in range(4)
    ]
    answers = await asyncio.wait_for(
        asyncio.gather(*(ctl.open_effect_group(g) for g in groups), return_exceptions=True),
        TIMEOUT,
    )
    opened = [i for i, a in enumerate(answers) if not isinstance(a, BaseException)]
    assert len(opened) == 1, answers
    assert all(isinstance(a, ReplayMismatch) for i, a in enumerate(answers) if i not in opened)
    handle = answers[opened[0]]
    assert isinstance(handle, GroupHandle)
    for _ in range(2):
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    await ctl.close_effect_group(handle)
    for i in range(4):
        assert stack.lab.count("started", f"r6q.own{i}:0") == (1 if i in opened else 0)


async def test_R6_a_closed_groups_replay_keys_are_free_as_soon_as_close_returns(
    stack: Stack,
) -> None:
    """R-6, R-4, R-11: once close of a group whose children have all settled has
    returned, the group is retired and holds none of its replay keys: a group opened
    right after it with the same keys is recorded, every time (nothing the close left to
    run in the background can refuse it), and close spends no invocation per child on
    it. (A group closed with a child still running keeps its keys until that child
    settles: see ``test_retirement.py``.)"""
    ctl = stack.controller
    for n in range(12):
        keys = [f"r6.reuse.{n}.a", f"r6.reuse.{n}.b"]
        handles = []
        for side in ("first", "second"):
            group = effect_group(
                group_key("r6-reuse", side, n),
                [step(k, gate=False) for k in keys],
                WakePolicy.FIRST,
            )
            handle = await ctl.open_effect_group(group)
            for _ in keys:
                await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
            await ctl.close_effect_group(handle)
            handles.append(handle)
        assert handles[0].group_key != handles[1].group_key
    releases = await ctl.query(
        f"SELECT id FROM sys_invocation WHERE target_service_name = '{REPLAY_KEY}' "
        "AND target_handler_name = 'release' AND target_service_key LIKE 'r6.reuse.%'"
    )
    assert releases == [], "retiring a group costs an invocation per child"


async def test_r9_race_cancelled_from_outside_closes_its_group(stack: Stack) -> None:
    """R-9: a ``race`` declaring ``CANCEL``, cancelled from outside, closes its group
    (shielded) before the cancellation propagates, so its losers are cancelled; G-26: a
    close disposition that is not a ``LoserPolicy`` value is refused before any call."""
    ctl = stack.controller
    with pytest.raises(InvalidEnvelope):
        await ctl.close_effect_group(
            GroupHandle(
                group_key="r9:group:none:0",
                child_count=1,
                consumed=0,
                wake=WakePolicy.FIRST,
                disposition=LoserPolicy.CANCEL,
            ),
            "bogus",  # type: ignore[arg-type]
        )
    calls = [tool(STEP, step_input(tag)) for tag in ("r9.a", "r9.b")]
    scope = Scope(scope_id="r9")
    key = next_group_key(scope, calls)
    task = asyncio.ensure_future(race(ctl, scope, calls, disposition=LoserPolicy.CANCEL))
    for tag in ("r9.a", "r9.b"):
        await stack.lab.wait_for("started", tag, 1, TIMEOUT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, TIMEOUT)
    assert key not in await ctl.open_group_keys()
    for tag in ("r9.a", "r9.b"):
        await stack.lab.wait_for("cancelled", tag, 1, TIMEOUT)
        assert stack.lab.count("finished", tag) == 0


async def test_wrong_argument_types_are_typed_refusals(stack: Stack) -> None:
    """SPEC §7, R-2: an argument of the wrong type (``None``, a string, a handle built
    without validation, a key that is not a storable string) is a typed ``EffectHostError``
    on every method, refused before any call to the engine, as on memory and SQL."""
    from effecthost.contract import EffectHostError

    ctl = stack.controller
    for _name, call in wrong_type_calls(ctl):
        with pytest.raises(EffectHostError):
            await asyncio.wait_for(call(), TIMEOUT)


async def test_G37_a_reused_replay_key_runs_as_a_new_invocation(stack: Stack) -> None:
    """G-37: each child is an invocation of its own whose idempotency key is derived from
    its replay key and its group's epoch: when a later group reuses a replay key a closed
    group held (R-6 frees it), at the same position and tool, the child runs again as a
    new invocation rather than attaching to the finished one."""
    ctl = stack.controller
    results = []
    invocations = []
    for name in ("first", "second"):
        group = effect_group(
            group_key("g37", name, 0), [step("g37.reused", gate=False, result=name)]
        )
        handle = await ctl.open_effect_group(group)
        results.append(await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT))
        await ctl.close_effect_group(handle)
        found = await ctl.query(
            f"SELECT id FROM sys_invocation WHERE target_service_name = '{CHILD}' "
            "AND idempotency_key LIKE '%g37.reused%'"
        )
        invocations.extend(row["id"] for row in found if row["id"] not in invocations)
        assert len(invocations) == len(results), "attached to the finished child"
    assert [s.outcome.value for s in results] == ["first", "second"]
    assert stack.lab.count("started", "g37.reused") == 2


async def test_G26_G27_a_run_to_completion_group_narrowed_at_close_cancels_its_child(
    stack: Stack,
) -> None:
    """G-26, G-27, G-30: a group declaring ``RUN_TO_COMPLETION`` keeps no invocation ids
    at open; a close narrowing it to ``CANCEL`` finds the running child's invocation by
    its idempotency key and cancels that one (it does not run again), and inspection
    still shows when each child began and settled."""
    from effecthost.hosts.restate._inspect import RestateInspector

    ctl = stack.controller
    group = effect_group(
        group_key("g27", "narrowed", 0),
        [step("g27.quick", gate=False), step("g27.held")],
        WakePolicy.FIRST,
    )
    handle = await ctl.open_effect_group(group)
    await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    await stack.lab.wait_for("started", "g27.held", 1, TIMEOUT)
    assert "invs" not in await group_state(ctl, group.key)
    inspector = RestateInspector(stack.local.admin_url)
    try:
        _, children = await inspector.group(group.key)
    finally:
        await inspector.aclose()
    assert [c.started_at is not None for c in children] == [True, True]
    assert [c.settled_at is not None for c in children if c.rank] == [True]
    await ctl.close_effect_group(handle, LoserPolicy.CANCEL)
    await stack.lab.wait_for("cancelled", "g27.held", 1, TIMEOUT)
    found = await ctl.query(
        f"SELECT id FROM sys_invocation WHERE target_service_name = '{CHILD}' "
        "AND idempotency_key LIKE '%g27.held%'"
    )
    assert len(found) == 1
    assert stack.lab.count("started", "g27.held") == 1


async def test_G38_a_duplicate_settlement_takes_no_rank(stack: Stack) -> None:
    """G-38: the group object's settle is idempotent on the replay key: a second delivery
    of a child's settlement (at-least-once transport, a re-sent message) takes no rank,
    and the next child to settle takes rank 2."""
    ctl = stack.controller
    group = effect_group(
        group_key("g38", "dup", 0),
        [step("g38.a", gate=False, result="a"), step("g38.b", result="b")],
    )
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == "g38.a"
    state = await group_state(ctl, group.key)
    epoch = json.loads(state["shape"])["epoch"]
    duplicate = {
        "replay_key": "g38.a",
        "position": 0,
        "epoch": epoch,
        "outcome": first.outcome.model_dump(mode="json"),
    }
    await ctl._call(group.key, "settle", duplicate)  # returns once the handler has run
    stack.lab.open("g38.b")
    second = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (second.rank, second.replay_key, second.outcome.value) == (2, "g38.b", "b")
    assert json.loads((await group_state(ctl, group.key))["counter"]) == 2
    await ctl.close_effect_group(handle)


async def test_G39_a_parked_read_holds_no_lock(stack: Stack) -> None:
    """G-39: a read of a rank not yet recorded parks without holding the group object's
    exclusive lock: its waiter is registered (nothing queues behind the read on the
    object), and the settlement that comes later wakes it."""
    ctl = stack.controller
    group = effect_group(group_key("g39", "parked", 0), [step("g39.x", result="x")])
    handle = await ctl.open_effect_group(group)
    read = asyncio.ensure_future(ctl.await_next_settlement(handle))
    queued: list[dict[str, Any]] = []
    waiting = False
    deadline = time.monotonic() + TIMEOUT
    try:
        while not (waiting or queued) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polling engine facts: the waiter or a queued call
            waiters = (await group_state(ctl, group.key)).get("waiters")
            waiting = bool(waiters and json.loads(waiters).get("1"))
            queued = await ctl.query(
                f"SELECT target_handler_name, status FROM sys_invocation "
                f"WHERE target_service_name = '{GROUP}' AND target_service_key = '{group.key}' "
                f"AND status = 'pending'"  # queued behind the object's lock
            )
        assert not queued, f"calls queued behind a parked read: {queued}"
        assert waiting and not read.done()
    except BaseException:
        read.cancel()
        raise
    stack.lab.open("g39.x")
    settled = await asyncio.wait_for(read, TIMEOUT)
    assert settled.outcome.value == "x"
    await ctl.close_effect_group(handle)


async def test_G41_close_leaves_only_the_tombstone(stack: Stack) -> None:
    """G-41: close deletes the group object's state — shape, children, counter, every
    rank record, the per-child keys — leaving only the tombstone, and a second close
    changes nothing."""
    ctl = stack.controller
    group = effect_group(
        group_key("g41", "clear", 0), [step(f"g41.{i}", gate=False) for i in range(3)]
    )
    handle = await ctl.open_effect_group(group)
    for _ in range(3):
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert {"shape", "children", "counter", "rank:3"} <= set(await group_state(ctl, group.key))
    await ctl.close_effect_group(handle)
    state = await group_state(ctl, group.key)
    deadline = time.monotonic() + TIMEOUT
    while "tombstone" not in state and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the SQL view of the committed close: an engine fact
        state = await group_state(ctl, group.key)
    assert set(state) == {"tombstone"}, sorted(state)
    await ctl.close_effect_group(handle)
    assert await group_state(ctl, group.key) == state


async def _idle(ctl: RestateController) -> list[dict[str, Any]]:
    """Invocations the engine has not completed, re-read until none is left or TIMEOUT
    (a retirement and the collector's end have no event to wait on). The owner lease's
    delayed lapse is pending by design while the controller lives (R-1): not counted."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        rows = await ctl.query(
            "SELECT id FROM sys_invocation WHERE status != 'completed' "
            f"AND target_service_name != '{OWNER}'"
        )
        if not rows or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)


async def test_G38_a_wide_all_group_is_collected_and_each_child_takes_one_rank(
    stack: Stack,
) -> None:
    """G-37, G-38, R-11: a group of ``COLLECT_FROM`` children or more that waits for all
    and runs its losers to completion has its children started by collectors (three
    here) and settled in batches: every child runs once and takes exactly one rank, ranks
    1..n are served in order, the close retires the group and nothing is left running."""
    n = 2 * COLLECT_SLICE + 5  # three collectors
    tags = [f"wide.c{i}" for i in range(n)]
    group = effect_group(
        group_key("wide", "all", 0),
        [step(tag, gate=False, result={"i": i}) for i, tag in enumerate(tags)],
    )
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    got = [await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT) for _ in tags]
    assert [s.rank for s in got] == list(range(1, n + 1))
    assert sorted(s.replay_key for s in got) == sorted(tags)
    wrong = [
        (s.replay_key, s.outcome)
        for s in got
        if not (s.outcome.ok and s.outcome.value == {"i": tags.index(s.replay_key)})
    ]
    assert wrong == []
    with pytest.raises(CursorExhausted):
        await ctl.await_next_settlement(handle)
    await ctl.close_effect_group(handle)
    assert set(await group_state(ctl, group.key)) == {"tombstone"}
    assert await _idle(ctl) == []
    for tag in tags:
        assert stack.lab.count("finished", tag) == 1, tag


async def test_G41_a_wide_collected_group_narrowed_to_cancel_cancels_its_losers(
    stack: Stack,
) -> None:
    """G-41, R-11: a collected group closed with ``CANCEL`` while some children hold
    cancels those (found by idempotency key); they settle themselves as cancelled, the
    group retires, the collector ends and the held tools never finish."""
    n, held = max(COLLECT_FROM, 40), 3
    tags = [f"widec.c{i}" for i in range(n)]
    group = effect_group(
        group_key("widec", "all", 0), [step(tag, gate=i < held) for i, tag in enumerate(tags)]
    )
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    for _ in range(n - held):
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    for tag in tags[:held]:
        await stack.lab.wait_for("started", tag, 1, TIMEOUT)
    await ctl.close_effect_group(handle, LoserPolicy.CANCEL)
    assert await _idle(ctl) == []
    assert set(await group_state(ctl, group.key)) == {"tombstone"}
    stack.lab.open_all("")
    for tag in tags[:held]:
        assert stack.lab.count("finished", tag) == 0, tag


async def test_G38_an_endpoint_crash_mid_collected_group_keeps_ranks_and_settles_once(
    stack: Stack,
) -> None:
    """G-38, G-40: SIGKILL of the endpoint (and the server) while a collected group's
    last children hold: the ranks recorded read back byte-identical from a fresh handle,
    the collector and the held children resume from their journals and each of those
    takes exactly one of the remaining ranks; every tool finishes once."""
    n, k = max(COLLECT_FROM, 40), 3
    tags = [f"widek.c{i}" for i in range(n)]
    group = effect_group(
        group_key("widek", "all", 0),
        [step(tag, gate=i < k, result={"i": i}) for i, tag in enumerate(tags)],
    )
    ctl = stack.controller
    handle = await ctl.open_effect_group(group)
    before = [
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT) for _ in range(n - k)
    ]
    for tag in tags[:k]:
        await stack.lab.wait_for("started", tag, 1, TIMEOUT)
    saved = handle.to_json()

    ctl = await stack.crash_endpoint()

    reopened = await ctl.open_effect_group(group)
    again = [
        await asyncio.wait_for(ctl.await_next_settlement(reopened), TIMEOUT) for _ in range(n - k)
    ]
    assert [s.model_dump_json() for s in again] == [s.model_dump_json() for s in before]
    restored = type(handle).from_json(saved)
    for tag in tags[:k]:
        await stack.lab.wait_for("started", tag, 2, TIMEOUT)  # re-run by the new endpoint
        stack.lab.open(tag)
    rest = [await asyncio.wait_for(ctl.await_next_settlement(restored), TIMEOUT) for _ in range(k)]
    assert [s.rank for s in rest] == list(range(n - k + 1, n + 1))
    assert sorted(s.replay_key for s in rest) == sorted(tags[:k])
    for tag in tags:
        assert stack.lab.count("finished", tag) == 1, tag
    await ctl.close_effect_group(restored)
    assert await _idle(ctl) == []
    assert set(await group_state(ctl, group.key)) == {"tombstone"}


async def _group_calls(ctl: RestateController, key: str) -> dict[str, int]:
    rows = await ctl.query(
        "SELECT target_handler_name AS h, count(*) AS n FROM sys_invocation "
        f"WHERE target_service_name = '{GROUP}' AND target_service_key = '{key}' "
        "GROUP BY target_handler_name"
    )
    return {row["h"]: int(row["n"]) for row in rows}


async def test_an_open_without_collect_of_the_release_before_sends_its_children_itself(
    stack: Stack,
) -> None:
    """Upgrade (issue 26): an ``ALL`` group opened by a request of the release before (no
    ``collect`` in it) is not collected: its open sends the children, each settles with
    its own ``settle`` as it did, so such an open replays its journal unchanged; this
    release's controller's open of the same shape is collected (``collect`` once per
    slice, ``settle_batch``, no ``settle``)."""
    ctl = stack.controller
    n = 5
    old, new = (
        effect_group(
            group_key(name, "all", 0), [step(f"{name}.c{i}", gate=False) for i in range(n)]
        )
        for name in ("oldopen", "newopen")
    )
    body = {
        "child_count": n,
        "wake": old.wake.value,
        "disposition": old.disposition.value,
        "children": [child.model_dump(mode="json") for child in old.children],
        "hashes": [child.envelope_hash() for child in old.children],
        "targets": {},
        "owner": "tests",
        "incarnation": "before",
    }
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        answer = await client.post(f"{stack.local.ingress_url}/{GROUP}/{old.key}/open", json=body)
        answer.raise_for_status()
        assert answer.json()["ok"], answer.text
    await ctl.open_effect_group(new)
    for group in (old, new):
        handle = group.handle()
        got = [await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT) for _ in range(n)]
        assert [s.rank for s in got] == list(range(1, n + 1))
        await ctl.close_effect_group(handle)
    assert await _idle(ctl) == []
    calls_old, calls_new = await _group_calls(ctl, old.key), await _group_calls(ctl, new.key)
    assert calls_old.get("settle") == n and "collect" not in calls_old, calls_old
    assert calls_new.get("collect") == 1 and "settle" not in calls_new, calls_new
    assert calls_new.get("settle_batch", 0) >= 1, calls_new
