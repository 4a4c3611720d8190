"""Bad input gets a typed error naming its ids and changes nothing recorded (SPEC §7)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import pytest
from gated_tools import Lab, group
from gated_tools import step as child

from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    GroupHandle,
    GroupShapeError,
    HandleMismatch,
    InvalidEnvelope,
    LoserPolicy,
    PayloadTooLarge,
    ToolRegistry,
    UnknownGroup,
    WakePolicy,
)
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio
E = TypeVar("E", bound=EffectHostError)


async def record(host: MemoryEffectHost, *keys: str) -> tuple[list[str], dict[str, list[int]]]:
    """What the host has recorded: open keys and each group's settlement order."""
    return await host.open_group_keys(), {k: await host.settlement_order(k) for k in keys}


def assert_names_ids(error: EffectHostError, *ids: str) -> None:
    assert str(error).startswith(f"[{error.code.value}] ")
    for value in ids:
        assert value in str(error)


async def refused_twice(host: MemoryEffectHost, g: EffectGroup, refusal: type[E]) -> E:
    """Open ``g`` twice: both opens are refused with the same ``refusal`` (the same ids
    and text), and nothing is recorded (no open key, no settlement order)."""
    before = await host.open_group_keys()
    errors = []
    for _ in range(2):
        with pytest.raises(refusal) as caught:
            await host.open_effect_group(g)
        errors.append(caught.value)
    first, second = errors
    assert (first.ids(), str(first)) == (second.ids(), str(second))
    assert await host.open_group_keys() == before
    with pytest.raises(UnknownGroup):
        await host.settlement_order(g.key)
    return first


@pytest.fixture
def lab() -> Lab:
    return Lab()


@pytest.fixture
async def host(lab: Lab) -> AsyncIterator[MemoryEffectHost]:
    host = MemoryEffectHost(lab.registry())
    yield host
    await host.aclose()


@pytest.fixture
async def busy(host: MemoryEffectHost) -> tuple[EffectGroup, GroupHandle]:
    """A recorded group whose rank 1 is consumed and whose second child still runs."""
    g = group("turn-1:group:busy:0", child("fast", gate=False), child("slow"))
    handle = await host.open_effect_group(g)
    await host.await_next_settlement(handle)
    return g, handle


@pytest.mark.parametrize("claimed", [1, 3])
async def test_g20_handle_whose_child_count_disagrees_is_refused(
    host: MemoryEffectHost, busy: tuple[EffectGroup, GroupHandle], claimed: int
) -> None:
    g, good = busy
    before = await record(host, g.key)
    bad = GroupHandle(
        group_key=g.key, child_count=claimed, consumed=0, wake=g.wake, disposition=g.disposition
    )
    for call in (host.await_next_settlement(bad), host.close_effect_group(bad)):
        with pytest.raises(HandleMismatch) as caught:
            await call
        assert caught.value.group_key == g.key
        assert_names_ids(caught.value, g.key)
    assert bad.consumed == 0
    assert await record(host, g.key) == before
    again = await host.await_next_settlement(g.handle())
    assert (again.rank, again.replay_key, again.outcome.value) == (1, f"{g.key}:fast", "fast")
    assert await record(host, g.key) == before
    assert good.consumed == 1


async def test_foreign_group_key_is_unknown_group(
    host: MemoryEffectHost, busy: tuple[EffectGroup, GroupHandle]
) -> None:
    g, _ = busy
    before = await record(host, g.key)
    foreign = "elsewhere:group:feed:0"
    handle = GroupHandle(
        group_key=foreign, child_count=2, consumed=0, wake=g.wake, disposition=g.disposition
    )
    calls = (
        host.await_next_settlement(handle),
        host.close_effect_group(handle),
        host.settlement_order(foreign),
        host.deliver_event(foreign, "ping"),
    )
    for call in calls:
        with pytest.raises(UnknownGroup) as caught:
            await call
        assert caught.value.group_key == foreign
        assert_names_ids(caught.value, foreign)
    assert handle.consumed == 0
    assert await record(host, g.key) == before


@pytest.mark.parametrize(
    "value",
    [{1, 2}, b"\x00raw", math.nan, object()],
    ids=["set", "bytes", "nan", "object"],
)
async def test_non_json_input_is_refused_at_construction(
    host: MemoryEffectHost, busy: tuple[EffectGroup, GroupHandle], value: object
) -> None:
    g, _ = busy
    before = await record(host, g.key)
    with pytest.raises(InvalidEnvelope) as direct:
        EffectEnvelope(replay_key="turn-1:bad:0", kind="tool_call", name="step", input=value)
    with pytest.raises(InvalidEnvelope) as grouped:
        EffectGroup(
            key="turn-1:group:bad:0",
            wake=WakePolicy.ALL,
            disposition=LoserPolicy.RUN_TO_COMPLETION,
            children=[
                {"replay_key": "turn-1:bad:0", "kind": "tool_call", "name": "step", "input": value}
            ],
        )
    for error in (direct.value, grouped.value):
        assert error.replay_key == "turn-1:bad:0"
        assert_names_ids(error, "turn-1:bad:0")
    assert await record(host, g.key) == before


async def test_input_that_cannot_be_utf8_encoded_is_an_invalid_envelope(
    host: MemoryEffectHost,
) -> None:
    """A lone surrogate is not strict JSON in UTF-8: a typed error, no payload echoed."""
    before = await host.open_group_keys()
    with pytest.raises(InvalidEnvelope) as caught:
        EffectEnvelope(
            replay_key="turn-1:bad:1", kind="tool_call", name="step", input="secret-\ud800"
        )
    assert caught.value.replay_key == "turn-1:bad:1"
    assert "secret" not in str(caught.value)
    assert await host.open_group_keys() == before


async def test_g20_rank_past_the_end_is_cursor_exhausted(host: MemoryEffectHost) -> None:
    g = group("turn-1:group:one:0", child("only", gate=False))
    handle = await host.open_effect_group(g)
    await host.await_next_settlement(handle)
    before = await record(host, g.key)
    with pytest.raises(CursorExhausted) as caught:
        await host.await_next_settlement(handle)
    assert (caught.value.group_key, caught.value.rank) == (g.key, 2)
    assert_names_ids(caught.value, g.key, "rank 2")
    assert handle.consumed == 1
    assert await record(host, g.key) == before


async def test_oversized_input_is_payload_too_large_and_records_nothing(lab: Lab) -> None:
    host = MemoryEffectHost(lab.registry(), max_payload_bytes=512)
    try:
        payload = "p" * 4096
        g = group("turn-1:group:big:0", child("small", gate=False), child("big", blob=payload))
        first = await refused_twice(host, g, PayloadTooLarge)
        assert (first.group_key, first.replay_key, first.position) == (g.key, f"{g.key}:big", 1)
        assert_names_ids(first, g.key, f"{g.key}:big")
        assert payload[:64] not in str(first)
        assert lab.runs == Counter()
    finally:
        await host.aclose()


async def test_g26_widening_close_is_refused_and_leaves_the_group_running(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("turn-1:group:narrow:0", child("a"), child("b"), disposition=LoserPolicy.CANCEL)
    handle = await host.open_effect_group(g)
    await lab.started["a"].wait()
    await lab.started["b"].wait()
    before = await record(host, g.key)
    with pytest.raises(DispositionWidened) as caught:
        await host.close_effect_group(handle, LoserPolicy.RUN_TO_COMPLETION)
    assert caught.value.group_key == g.key
    assert_names_ids(caught.value, g.key)
    assert await record(host, g.key) == before
    assert g.key in await host.open_group_keys()
    lab.gates["a"].set()
    lab.gates["b"].set()
    ranks = [await host.await_next_settlement(handle) for _ in range(2)]
    assert sorted(s.outcome.value for s in ranks) == ["a", "b"]
    assert all(s.outcome.ok for s in ranks)
    assert lab.cancelled == Counter()


async def test_g10_open_with_a_resolver_miss_records_nothing(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("turn-1:group:miss:0", child("a", gate=False), child("x", name="unregistered"))
    first = await refused_twice(host, g, GroupShapeError)
    assert (first.group_key, first.position, first.replay_key) == (g.key, 1, f"{g.key}:x")
    assert_names_ids(first, g.key, f"{g.key}:x", "position 1")
    assert lab.runs == Counter()


async def test_g51_non_json_event_payload_is_refused_and_delivers_nothing(
    host: MemoryEffectHost,
) -> None:
    g = EffectGroup(
        key="turn-1:group:event:0",
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[{"replay_key": "turn-1:ev", "kind": EffectKind.AWAIT_EVENT, "name": "ping"}],
    )
    handle = await host.open_effect_group(g)
    before = await record(host, g.key)
    with pytest.raises(InvalidEnvelope):
        await host.deliver_event(g.key, "ping", {"bad": {1, 2}})
    assert await record(host, g.key) == before
    assert await host.deliver_event(g.key, "ping", {"good": True}) == 1
    settlement = await host.await_next_settlement(handle)
    assert settlement.outcome.value == {"good": True}


@pytest.mark.anyio
async def test_oversized_outcome_and_event_are_refused_with_ids() -> None:
    tools = ToolRegistry()

    @tools.tool("big")
    async def big(size: Any) -> Any:
        return "x" * size

    host = MemoryEffectHost(tools, max_payload_bytes=1024)
    group = EffectGroup(
        key="s:group:big:0",
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[
            EffectEnvelope(replay_key="s:big:0", kind="tool_call", name="big", input=4096),
            EffectEnvelope(replay_key="s:ev:1", kind="await_event", name="ev", input=None),
        ],
    )
    handle = await host.open_effect_group(group)
    settlement = await host.await_next_settlement(handle)
    assert settlement.outcome.status == "error"
    assert settlement.outcome.error is not None
    assert settlement.outcome.error.type == "PayloadTooLarge"
    assert "s:big:0" in settlement.outcome.error.message
    with pytest.raises(PayloadTooLarge) as caught:
        await host.deliver_event(group.key, "ev", "y" * 4096)
    assert caught.value.group_key == group.key
    assert await host.settlement_order(group.key) == [0]
    await host.aclose()
