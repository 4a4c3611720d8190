"""The memory host refuses an open before it records anything (G-10, R-6) and keeps a
closed key closed (R-4): the reference semantics the other tiers are held to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from group_support import echo_tools

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    GroupClosed,
    GroupShapeError,
    InvalidEnvelope,
    LoserPolicy,
    ReplayMismatch,
    UnknownGroup,
    WakePolicy,
)
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio


@pytest.fixture
async def host() -> AsyncIterator[MemoryEffectHost]:
    host = MemoryEffectHost(echo_tools())
    yield host
    await host.aclose()


def _child(key: str, kind: EffectKind = EffectKind.AWAIT_EVENT, **fields: Any) -> EffectEnvelope:
    fields.setdefault("name", "go" if kind == EffectKind.AWAIT_EVENT else "echo")
    return EffectEnvelope(replay_key=key, kind=kind, input=fields.pop("input", None), **fields)


def _group(key: str, *children: EffectEnvelope) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=children,
    )


async def _refused_twice(
    host: MemoryEffectHost, group: EffectGroup, error: type[EffectHostError]
) -> EffectHostError:
    keys = await host.open_group_keys()
    with pytest.raises(error) as first:
        await host.open_effect_group(group)
    with pytest.raises(error) as second:
        await host.open_effect_group(group)
    assert (str(second.value), second.value.ids()) == (str(first.value), first.value.ids())
    assert await host.open_group_keys() == keys
    with pytest.raises((UnknownGroup, GroupClosed)):
        await host.await_next_settlement(group.handle())
    return first.value


@pytest.mark.parametrize("value", [{"seconds": -1}, {"seconds": "soon"}, {}, {"seconds": [1]}])
async def test_invalid_sleep_refuses_the_open_before_anything_is_recorded(
    host: MemoryEffectHost, value: Any
) -> None:
    """G-10: a malformed ``sleep`` input is ``InvalidEnvelope`` naming the child, and
    the group is not recorded (the other child never runs)."""
    group = _group(
        "m:group:sleep:0",
        _child("m.ok", EffectKind.TOOL_CALL, input=1),
        _child("m.bad", EffectKind.SLEEP, name="sleep", input=value),
    )
    error = await _refused_twice(host, group, InvalidEnvelope)
    assert (error.group_key, error.replay_key, error.position) == (group.key, "m.bad", 1)


async def test_replay_key_of_another_group_is_refused(host: MemoryEffectHost) -> None:
    """R-6, R-2: a replay key recorded for another group refuses the open with
    ``ReplayMismatch`` naming both group keys; it outranks ``GroupShapeError``; once the
    other group retired, the key is free again (as on the SQL tiers)."""
    first = await host.open_effect_group(_group("m:group:one:0", _child("shared")))
    reuse = _group("m:group:two:0", _child("two.a"), _child("shared"))
    error = await _refused_twice(host, reuse, ReplayMismatch)
    assert (error.group_key, error.replay_key, error.position) == (reuse.key, "shared", 1)
    assert "m:group:one:0" in str(error) and "m:group:two:0" in str(error)
    unrunnable = _group(reuse.key, _child("two.a", EffectKind.TOOL_CALL, name="nobody"))
    await _refused_twice(
        host, _group(reuse.key, *unrunnable.children, _child("shared")), ReplayMismatch
    )
    await _refused_twice(host, unrunnable, GroupShapeError)
    await host.deliver_event("m:group:one:0", "go")
    await host.await_next_settlement(first)
    await host.close_effect_group(first)
    assert (await host.open_effect_group(reuse)).group_key == reuse.key
