"""One limits policy for JSON and keys, the same on memory and SQLite (R-8), and typed
refusals that change nothing (SPEC §7, R-2, R-3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from two_tiers import Tier, Tools, tier_fixture, tools_fixture  # noqa: F401 - fixtures

from effecthost.contract import (
    DispositionWidened,
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    GroupHandle,
    InvalidEnvelope,
    LoserPolicy,
    MalformedHandle,
    Outcome,
    PayloadTooLarge,
    WakePolicy,
    limits,
)

pytestmark = pytest.mark.anyio

WAIT = 10.0  # a hang guard, never an ordering


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def one(key: str, name: str, label: Any = None, **extra: Any) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[{"replay_key": f"{key}:0", "kind": "tool_call", "name": name, "input": label}],
        **extra,
    )


BAD_RESULTS = {
    "deep-200": (nested(200), "InvalidEnvelope"),
    "deep-300": (nested(300), "InvalidEnvelope"),
    "deep-1200": (nested(1200), "InvalidEnvelope"),
    "int-10**5000": (10**5000, "InvalidEnvelope"),
    "int-2**64": (2**64, "InvalidEnvelope"),
    "nested-int": ({"n": [-(2**63) - 1]}, "InvalidEnvelope"),
    "nul": ("a\x00b", "InvalidEnvelope"),
    "surrogate": ({"k": "\ud800"}, "InvalidEnvelope"),
    "nan": (float("nan"), "InvalidEnvelope"),
    "set": ({1, 2}, "InvalidEnvelope"),
    "huge": ("x" * (limits.MAX_JSON_BYTES + 1), "PayloadTooLarge"),
}


@pytest.mark.parametrize("tool", ["give", "fail"])
@pytest.mark.parametrize("label", sorted(BAD_RESULTS))
async def test_r8_result_over_the_limits_is_the_childs_recorded_typed_failure(
    tier: Tier, tools: Tools, label: str, tool: str
) -> None:
    """R-8: a tool result (or failure data) over the limits becomes the child's recorded,
    typed failure on every tier; the waiter gets it (no hang) and the rank reads again."""
    value, error_type = BAD_RESULTS[label]
    tools.results[label] = value
    g = one(f"lim:group:{tool}-{label}:0", tool, label)
    handle = await tier.host.open_effect_group(g)
    got = await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    assert got.outcome.status == "error"
    assert got.outcome.error is not None
    assert got.outcome.error.type == error_type
    assert got.replay_key in got.outcome.error.message
    again = await asyncio.wait_for(tier.host.await_next_settlement(g.handle()), WAIT)
    assert again == got
    await tier.host.close_effect_group(handle)


async def test_r8_result_at_the_limits_is_recorded_as_is(tier: Tier, tools: Tools) -> None:
    """R-8: the limits are inclusive: what they allow is recorded and read back."""
    value = {"deep": nested(limits.MAX_DEPTH - 1), "i": [limits.MAX_INT, limits.MIN_INT]}
    tools.results["edge"] = value
    g = one("lim:group:edge:0", "give", "edge")
    handle = await tier.host.open_effect_group(g)
    got = await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    assert got.outcome == Outcome.success(value)


def _envelope(**fields: Any) -> dict[str, Any]:
    return {"replay_key": "lim:r:0", "kind": "tool_call", "name": "give", "input": None, **fields}


BAD_INPUTS: dict[str, dict[str, Any]] = {
    "deep-input": {"children": [_envelope(input=nested(limits.MAX_DEPTH + 1))]},
    "deep-input-1000": {"children": [_envelope(input=nested(1000))]},
    "int-input": {"children": [_envelope(input=10**5000)]},
    "int64-input": {"children": [_envelope(input=[2**63])]},
    "huge-input": {"children": [_envelope(input="x" * (limits.MAX_JSON_BYTES + 1))]},
    "nul-input": {"children": [_envelope(input={"a\x00": 1})]},
    "long-group-key": {"key": "k" * (10 * 1024 * 1024)},
    "long-replay-key": {"children": [_envelope(replay_key="r" * (3 * 1024 * 1024))]},
    "long-name": {"children": [_envelope(name="n" * (limits.MAX_NAME_BYTES + 1))]},
    "nul-group-key": {"key": "lim:group\x00:0"},
    "nul-replay-key": {"children": [_envelope(replay_key="lim\x00r")]},
    "surrogate-key": {"key": "lim:\udc00"},
    "too-many-children": {
        "children": [_envelope(replay_key=f"lim:r:{i}") for i in range(limits.MAX_CHILDREN + 1)]
    },
    "group-too-large": {
        "children": [
            _envelope(replay_key=f"lim:r:{i}", input="x" * (limits.MAX_JSON_BYTES - 64))
            for i in range(limits.MAX_GROUP_BYTES // limits.MAX_JSON_BYTES + 1)
        ]
    },
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
async def test_r8_input_over_the_limits_is_invalid_envelope_on_every_tier(
    tier: Tier, case: str
) -> None:
    """R-8: an input or key over the limits is ``InvalidEnvelope`` (``PayloadTooLarge`` is
    one) at construction, naming ids only; the host records nothing."""
    before = await tier.recorded()
    fields = {
        "key": "lim:group:in:0",
        "wake": WakePolicy.ALL,
        "disposition": LoserPolicy.RUN_TO_COMPLETION,
        "children": [_envelope()],
        **BAD_INPUTS[case],
    }
    with pytest.raises(InvalidEnvelope) as caught:
        EffectGroup(**fields)
    assert len(str(caught.value)) < 2000
    assert "xxxxxxxx" not in str(caught.value)
    assert await tier.recorded() == before


@pytest.mark.parametrize(
    "payload",
    [nested(300), 10**5000, "a\x00", "x" * (limits.MAX_JSON_BYTES + 1)],
    ids=["deep", "int", "nul", "huge"],
)
async def test_r8_event_payload_over_the_limits_is_refused_identically(
    tier: Tier, payload: Any
) -> None:
    """R-8: an event payload over the limits is ``InvalidEnvelope`` and delivers nothing."""
    g = EffectGroup(
        key="lim:group:event:0",
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[{"replay_key": "lim:ev:0", "kind": EffectKind.AWAIT_EVENT, "name": "ping"}],
    )
    handle = await tier.host.open_effect_group(g)
    before = await tier.recorded()
    with pytest.raises(InvalidEnvelope):
        await tier.host.deliver_event(g.key, "ping", payload)
    assert await tier.recorded() == before
    assert await tier.host.deliver_event(g.key, "ping", {"ok": True}) == 1
    got = await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    assert got.outcome.value == {"ok": True}


# -- close with a plain string ---------------------------------------------------------


def two(key: str, disposition: LoserPolicy) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.FIRST,
        disposition=disposition,
        children=[
            {"replay_key": f"{key}:fast", "kind": "tool_call", "name": "fast"},
            {"replay_key": f"{key}:slow", "kind": "tool_call", "name": "slow"},
        ],
    )


async def test_g26_close_with_the_string_run_to_completion_cannot_widen(tier: Tier) -> None:
    """G-26, R-3: ``close(handle, "run_to_completion")`` on a ``CANCEL`` group is
    ``DispositionWidened`` like the enum member, and changes nothing."""
    g = two("lim:group:widen:0", LoserPolicy.CANCEL)
    handle = await tier.host.open_effect_group(g)
    await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    before = await tier.recorded()
    with pytest.raises(DispositionWidened):
        await tier.host.close_effect_group(handle, "run_to_completion")  # type: ignore[arg-type]
    assert await tier.recorded() == before
    assert g.key in await tier.host.open_group_keys()


async def test_g27_close_with_the_string_cancel_cancels_the_loser(tier: Tier, tools: Tools) -> None:
    """G-27: ``close(handle, "cancel")`` narrows like ``LoserPolicy.CANCEL``."""
    g = two("lim:group:narrow:0", LoserPolicy.RUN_TO_COMPLETION)
    handle = await tier.host.open_effect_group(g)
    await asyncio.wait_for(tools.started.wait(), WAIT)
    first = await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    assert first.outcome.value == "fast"
    await tier.host.close_effect_group(handle, "cancel")  # type: ignore[arg-type]
    await asyncio.wait_for(tools.was_cancelled.wait(), WAIT)
    assert tools.cancelled == 1
    assert g.key not in await tier.host.open_group_keys()


@pytest.mark.parametrize("bogus", ["bogus", "CANCEL", 1, object()])
async def test_close_with_an_unknown_disposition_is_refused_and_records_nothing(
    tier: Tier, tools: Tools, bogus: Any
) -> None:
    """G-26, SPEC §7: a disposition that is not a ``LoserPolicy`` value is
    ``InvalidEnvelope`` on every tier; the group stays open and its loser runs."""
    g = two("lim:group:bogus:0", LoserPolicy.RUN_TO_COMPLETION)
    handle = await tier.host.open_effect_group(g)
    await asyncio.wait_for(tools.started.wait(), WAIT)
    await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    before = await tier.recorded()
    with pytest.raises(InvalidEnvelope) as caught:
        await tier.host.close_effect_group(handle, bogus)
    assert caught.value.group_key == g.key
    assert await tier.recorded() == before
    assert tools.cancelled == 0
    tools.gate.set()
    second = await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    assert second.outcome.value == "slow"


# -- handles ---------------------------------------------------------------------------


def _handle_json(**fields: Any) -> str:
    import json

    doc = {"group_key": "k", "child_count": 2, "consumed": 0, "wake": "first"}
    doc["disposition"] = "cancel"
    doc.update(fields)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "fields",
    [
        {"child_count": "2"},
        {"child_count": 2.0},
        {"child_count": True},
        {"consumed": "0"},
        {"consumed": False},
        {"child_count": 2**64, "consumed": 2**63},
        {"child_count": limits.MAX_CHILDREN + 1},
        {"consumed": 3},
        {"consumed": -1},
        {"group_key": ""},
        {"group_key": "k\x00"},
        {"group_key": "k" * (limits.MAX_KEY_BYTES + 1)},
        {"wake": "bogus"},
        {"extra": 1},
    ],
    ids=repr,
)
async def test_from_json_is_strict_and_bounded(tier: Tier, fields: dict[str, Any]) -> None:
    """SPEC §7, R-2: a saved handle with a wrong type or an impossible value is
    ``MalformedHandle`` before any read; nothing recorded changes."""
    before = await tier.recorded()
    with pytest.raises(MalformedHandle):
        GroupHandle.from_json(_handle_json(**fields))
    assert await tier.recorded() == before


def test_from_json_of_garbage_is_malformed_handle() -> None:
    """SPEC §7: bytes that are not a handle (or not text at all) are ``MalformedHandle``."""
    for text in (b"\xff\xfe", "", "[]", "null", '{"group_key": 1}', "[" * 5000):
        with pytest.raises(MalformedHandle):
            GroupHandle.from_json(text)


def test_refused_assignment_leaves_the_handle_as_it_was() -> None:
    """G-18, G-20: ``handle.consumed = 5`` with two children is ``MalformedHandle`` and
    the cursor keeps its value."""
    handle = GroupHandle(
        group_key="k", child_count=2, consumed=1, wake="first", disposition="cancel"
    )
    for value in (5, -1, "1", None, 1.0):
        with pytest.raises(MalformedHandle):
            handle.consumed = value  # type: ignore[assignment]
        assert handle.consumed == 1
    with pytest.raises(MalformedHandle):
        handle.child_count = 0
    assert handle.child_count == 2
    handle.consumed = 2
    assert handle.consumed == 2


@pytest.mark.parametrize(
    "children",
    [5, "abc", (c for c in [_envelope()]), [None], [5], [_envelope(), "x"], None],
    ids=["int", "str", "generator", "none-child", "int-child", "str-child", "none"],
)
def test_group_with_wrong_children_is_a_typed_error(children: Any) -> None:
    """G-03, SPEC §7: children of the wrong type are the contract's typed error, not a
    ``TypeError`` or a pydantic ``ValidationError``."""
    with pytest.raises(EffectHostError) as caught:
        EffectGroup(key="g", wake="first", disposition="cancel", children=children)
    assert caught.value.group_key == "g"


@pytest.mark.parametrize(
    "fields",
    [
        {"extra": 1},
        {"key": 5},
        {"wake": None},
        {"children": [{**_envelope(), "membership": 5}]},
        {"children": [{**_envelope(), "membership": {"group_key": "g"}}]},
        {"children": [{**_envelope(), "extra": 1}]},
        {"children": [{**_envelope(), "replay_key": 5}]},
    ],
    ids=repr,
)
def test_group_with_wrong_fields_is_invalid_envelope(fields: dict[str, Any]) -> None:
    """G-03, SPEC §7: extra fields, malformed membership and wrong types are
    ``InvalidEnvelope``."""
    doc = {"key": "g", "wake": "first", "disposition": "cancel", "children": [_envelope()]}
    with pytest.raises(InvalidEnvelope):
        EffectGroup(**{**doc, **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {"extra": 1},
        {"membership": "x"},
        {"membership": {"group_key": "g", "position": -1, "wake": "first", "disposition": "x"}},
        {"kind": None},
    ],
    ids=repr,
)
def test_envelope_with_wrong_fields_is_invalid_envelope(fields: dict[str, Any]) -> None:
    """SPEC §7: an envelope with wrong fields is ``InvalidEnvelope``."""
    with pytest.raises(InvalidEnvelope):
        EffectEnvelope(**{**_envelope(), **fields})
    with pytest.raises(InvalidEnvelope):
        EffectEnvelope.model_validate({**_envelope(), **fields})


def test_outcome_over_the_limits_is_a_typed_error() -> None:
    """R-8: an ``Outcome`` is built only from values within the limits."""
    for build in (
        lambda: Outcome.success(nested(1000)),
        lambda: Outcome.success(10**5000),
        lambda: Outcome(status="success", value=nested(300)),
        lambda: Outcome.failure("T", "m", data=nested(300)),
        lambda: Outcome.failure("T", "m\x00"),
        lambda: Outcome(status="bogus"),
    ):
        with pytest.raises(InvalidEnvelope):
            build()
    with pytest.raises(PayloadTooLarge):
        Outcome.success("x" * (limits.MAX_JSON_BYTES + 1))


async def test_g18_two_concurrent_awaits_on_one_handle_read_the_same_rank(
    tier: Tier, tools: Tools
) -> None:
    """G-18 (defined in docs/contract.md): an await reads ``consumed`` when it starts and
    sets the cursor to the rank it returns, never past it. Two awaits on one handle that
    start before either returns both return rank ``consumed + 1`` and the cursor ends one
    further: no rank is skipped and none is consumed twice."""
    g = EffectGroup(
        key="lim:group:twice:0",
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[
            {"replay_key": f"lim:twice:{i}", "kind": "tool_call", "name": "slow"} for i in range(2)
        ],
    )
    handle = await tier.host.open_effect_group(g)

    async def release() -> None:  # runs after both awaits have started (tasks run in order)
        tools.gate.set()

    first, again, _ = await asyncio.wait_for(
        asyncio.gather(
            tier.host.await_next_settlement(handle),
            tier.host.await_next_settlement(handle),
            release(),
        ),
        WAIT,
    )
    assert (first.rank, again.rank) == (1, 1)
    assert first == again
    assert handle.consumed == 1
    second = await asyncio.wait_for(tier.host.await_next_settlement(handle), WAIT)
    assert (second.rank, handle.consumed) == (2, 2)
    assert {first.position, second.position} == {0, 1}
