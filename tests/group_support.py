"""Builders of the groups the tests open: a child of each kind and a group of them, with
the defaults most tests want (an ``all`` group run to completion)."""

from __future__ import annotations

from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    ToolFunction,
    ToolRegistry,
    WakePolicy,
)


def tool(replay_key: str, value: Any = None, name: str = "t") -> EffectEnvelope:
    """A tool call child."""
    return EffectEnvelope(replay_key=replay_key, kind=EffectKind.TOOL_CALL, name=name, input=value)


def event(replay_key: str, name: str = "go", value: Any = None) -> EffectEnvelope:
    """An ``await_event`` child waiting for event ``name``."""
    return EffectEnvelope(
        replay_key=replay_key, kind=EffectKind.AWAIT_EVENT, name=name, input=value
    )


def timer(replay_key: str, seconds: float = 60.0) -> EffectEnvelope:
    """A ``sleep`` child of ``seconds``."""
    return EffectEnvelope(
        replay_key=replay_key, kind=EffectKind.SLEEP, name="sleep", input={"seconds": seconds}
    )


def group(
    key: str,
    children: list[EffectEnvelope],
    wake: WakePolicy = WakePolicy.ALL,
    disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION,
) -> EffectGroup:
    return EffectGroup(key=key, wake=wake, disposition=disposition, children=children)


def race(
    key: str, children: list[EffectEnvelope], disposition: LoserPolicy = LoserPolicy.CANCEL
) -> EffectGroup:
    """A ``race``: the first settlement wakes the caller, the losers are cancelled."""
    return group(key, children, WakePolicy.FIRST, disposition)


async def echo(value: Any) -> Any:
    """A tool that returns its input."""
    return value


def echo_tools(**more: ToolFunction) -> ToolRegistry:
    """A registry with the ``echo`` tool, and ``more`` tools by name."""
    return ToolRegistry({"echo": echo, **more})
