"""``current_child()``: a registry tool reads its child's identity while it runs (issue 25),
set once by the base executor so every tier gets it through the same place."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from effecthost.contract import (
    ChildInfo,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    ExecutionInput,
    FunctionExecutor,
    LoserPolicy,
    NotInChild,
    RuntimeErrorCode,
    ToolRegistry,
    WakePolicy,
    current_child,
)
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio


def tool_group(key: str, *labels: str) -> EffectGroup:
    children = [
        {
            "replay_key": f"{key}:{label}",
            "kind": EffectKind.TOOL_CALL,
            "name": "who",
            "input": label,
        }
        for label in labels
    ]
    return EffectGroup(
        key=key, wake=WakePolicy.ALL, disposition=LoserPolicy.RUN_TO_COMPLETION, children=children
    )


def as_dict(info: ChildInfo) -> dict[str, Any]:
    return {
        "replay_key": info.replay_key,
        "group_key": info.group_key,
        "position": info.position,
        "attempt": info.attempt,
        "kind": info.kind,
        "name": info.name,
    }


async def test_outside_a_child_is_a_typed_error() -> None:
    """Issue 25: outside a tool the accessor raises ``NotInChild``, never a ``LookupError``."""
    with pytest.raises(NotInChild) as caught:
        current_child()
    assert caught.value.code == RuntimeErrorCode.NOT_IN_CHILD
    assert not isinstance(caught.value, LookupError)


async def test_a_tool_sees_its_envelope_and_attempt_then_it_is_gone() -> None:
    """Issue 25: the executor exposes the envelope's identity and the host's attempt number
    for the tool's duration only."""
    seen: list[ChildInfo] = []

    async def who(_input: Any) -> str:
        seen.append(current_child())
        return "ok"

    g = tool_group("t:cc:one", "a")
    outcome = await FunctionExecutor(who).execute(ExecutionInput(g.children[0], attempt=3))
    assert outcome.status == "success"
    assert seen == [ChildInfo("t:cc:one:a", "t:cc:one", 0, 3, "tool_call", "who")]
    with pytest.raises(NotInChild):
        current_child()


async def test_an_ungrouped_envelope_has_no_group() -> None:
    async def who(_input: Any) -> dict[str, Any]:
        return as_dict(current_child())

    env = EffectEnvelope(replay_key="solo", kind="tool_call", name="who")
    outcome = await FunctionExecutor(who).execute(ExecutionInput(env))
    assert outcome.value == {
        "replay_key": "solo",
        "group_key": None,
        "position": None,
        "attempt": 1,
        "kind": "tool_call",
        "name": "who",
    }


async def test_a_failing_tool_still_clears_the_identity() -> None:
    async def boom(_input: Any) -> None:
        assert current_child().replay_key == "solo"
        raise ValueError("no")

    env = EffectEnvelope(replay_key="solo", kind="tool_call", name="boom")
    outcome = await FunctionExecutor(boom).execute(ExecutionInput(env))
    assert outcome.status == "error"
    assert outcome.error is not None and outcome.error.type == "ValueError"
    with pytest.raises(NotInChild):
        current_child()


async def test_concurrent_children_each_see_their_own_identity_and_threads_copy_it() -> None:
    """Issue 25: children running at once on the memory host each read their own
    identity, across awaits and inside ``asyncio.to_thread``."""
    labels = ("a", "b", "c", "d")
    arrived = 0
    all_in = asyncio.Event()

    async def who(label: str) -> dict[str, Any]:
        nonlocal arrived
        before = current_child()
        arrived += 1
        if arrived == len(labels):
            all_in.set()
        await all_in.wait()  # every child is inside its tool before any reads again
        in_thread = await asyncio.to_thread(current_child)
        assert before == current_child() == in_thread
        assert before.replay_key.endswith(f":{label}")
        return as_dict(in_thread)

    host = MemoryEffectHost(ToolRegistry({"who": who}))
    g = tool_group("t:cc:many", *labels)
    try:
        handle = await host.open_effect_group(g)
        with anyio.fail_after(5):
            settlements = [await host.await_next_settlement(handle) for _ in labels]
    finally:
        await host.aclose()
    by_position = {s.position: s.outcome.value for s in settlements}
    assert by_position == {
        i: {
            "replay_key": f"t:cc:many:{label}",
            "group_key": "t:cc:many",
            "position": i,
            "attempt": 1,
            "kind": "tool_call",
            "name": "who",
        }
        for i, label in enumerate(labels)
    }
