"""Unit tests of the contract's data types, keys, errors and controller base (G-01…G-09)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from importlib import resources
from typing import Any

import pytest

import effecthost.contract as contract
from effecthost.combinators import (
    AllEffectsFailed,
    DeadlineExceeded,
    EffectFailed,
    Scope,
    build_group,
    next_group_key,
    tool,
)
from effecthost.contract import (
    DrainReport,
    DuplicateReplayKey,
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectGroupUnsupported,
    EffectHostError,
    EffectKind,
    EmptyGroup,
    ExecutionInput,
    ExecutorConsumed,
    FunctionExecutor,
    GroupHandle,
    GroupMembership,
    InvalidEnvelope,
    LoserPolicy,
    MalformedHandle,
    MembershipConflict,
    MembershipUnsupported,
    OccurrenceCounter,
    RuntimeErrorCode,
    ToolError,
    ToolRegistry,
    WakePolicy,
    batch_id,
    canonical_json,
    group_key,
    normalize_json,
    validate_deployment,
)
from effecthost.hosts.memory import MemoryEffectHost

GROUP = "scope-1:group:abc:0"


def envelope(replay_key: str = "rk", **fields: Any) -> EffectEnvelope:
    return EffectEnvelope(
        replay_key=replay_key,
        kind=fields.pop("kind", EffectKind.TOOL_CALL),
        name=fields.pop("name", "search"),
        input=fields.pop("input", {"query": "x"}),
        **fields,
    )


def membership(**overrides: Any) -> GroupMembership:
    fields: dict[str, Any] = {
        "group_key": GROUP,
        "position": 0,
        "wake": WakePolicy.FIRST,
        "disposition": LoserPolicy.RUN_TO_COMPLETION,
    }
    return GroupMembership(**{**fields, **overrides})


def golden_vectors() -> dict[str, dict[str, Any]]:
    text = resources.files("effecthost.conformance").joinpath("golden_vectors.json").read_text()
    return {vector["name"]: vector for vector in json.loads(text)["vectors"]}


# -- canonical encoding -------------------------------------------------------------------


def test_g01_canonical_json_sorts_keys_at_every_depth_without_whitespace() -> None:
    value = {"b": {"d": 1, "c": [3, {"z": 0, "y": None}]}, "a": True}
    assert canonical_json(value) == b'{"a":true,"b":{"c":[3,{"y":null,"z":0}],"d":1}}'


def test_g01_canonical_json_is_utf8_not_ascii_escaped() -> None:
    assert canonical_json({"text": "Grüße, 世界"}) == '{"text":"Grüße, 世界"}'.encode()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_g01_canonical_json_refuses_nan_and_infinities(number: float) -> None:
    with pytest.raises(InvalidEnvelope, match=r"^\[invalid_envelope\]"):
        canonical_json({"n": number})


@pytest.mark.parametrize("value", [{1, 2}, b"raw", object()], ids=["set", "bytes", "object"])
def test_g01_canonical_json_refuses_non_json_values(value: object) -> None:
    with pytest.raises(InvalidEnvelope):
        canonical_json({"v": value})


def test_g01_canonical_json_refuses_non_string_keys() -> None:
    """The docstring promises a refusal; coercing the key makes ``{1: x}`` and
    ``{"1": x}`` encode, and hash, alike."""
    with pytest.raises(InvalidEnvelope):
        canonical_json({1: "x"})


def test_g01_canonical_json_refuses_text_that_is_not_utf8_encodable() -> None:
    with pytest.raises(InvalidEnvelope):
        canonical_json({"text": "\ud800"})


def test_normalize_json_turns_tuples_into_lists_and_sorts_keys() -> None:
    normalized = normalize_json({"b": (1, 2), "a": {"y": 1, "x": 2}})
    assert normalized == {"a": {"x": 2, "y": 1}, "b": [1, 2]}
    assert list(normalized) == ["a", "b"]


# -- envelope hash ------------------------------------------------------------------------

PINNED = [
    "tool-call-object-input",
    "await-event-null-input",
    "unicode-and-numbers",
    "grouped-first-cancel",
    "grouped-all-run_to_completion",
]


@pytest.mark.parametrize("name", PINNED)
def test_g01_g02_envelope_hash_matches_golden_vector_recomputed_with_hashlib(name: str) -> None:
    vector = golden_vectors()[name]
    independent = json.dumps(
        vector["envelope"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    built = EffectEnvelope.model_validate(vector["envelope"])
    assert independent.decode("utf-8") == vector["canonical"]
    assert built.canonical_bytes() == independent
    assert hashlib.sha256(independent).hexdigest() == vector["hash"]
    assert built.envelope_hash() == vector["hash"]


def test_g01_membership_is_omitted_from_the_encoding_when_absent() -> None:
    plain = envelope()
    explicit = envelope(membership=None)
    assert "membership" not in plain.canonical_dict()
    assert b"membership" not in plain.canonical_bytes()
    assert plain.canonical_bytes() == explicit.canonical_bytes()
    legacy = {"input": {"query": "x"}, "kind": "tool_call", "name": "search", "replay_key": "rk"}
    assert plain.envelope_hash() == hashlib.sha256(canonical_json(legacy)).hexdigest()


def test_g02_wake_and_disposition_each_change_the_hash() -> None:
    hashes = {
        envelope(membership=membership(wake=wake, disposition=disposition)).envelope_hash()
        for wake in WakePolicy
        for disposition in LoserPolicy
    }
    assert len(hashes) == len(WakePolicy) * len(LoserPolicy)
    assert envelope().envelope_hash() not in hashes


def test_g02_grouped_encoding_carries_every_membership_field() -> None:
    doc = json.loads(envelope(membership=membership(position=3)).canonical_bytes())
    assert doc["membership"] == {
        "disposition": "run_to_completion",
        "group_key": GROUP,
        "position": 3,
        "wake": "first",
    }


# -- the one group constructor --------------------------------------------------------------


def test_g03_group_stamps_children_from_their_index() -> None:
    group = EffectGroup(
        key=GROUP,
        wake=WakePolicy.FIRST_SUCCESS,
        disposition=LoserPolicy.CANCEL,
        children=[envelope("a"), {"replay_key": "b", "kind": "sleep", "name": "sleep"}],
    )
    assert [child.membership for child in group.children] == [
        membership(position=i, wake=WakePolicy.FIRST_SUCCESS, disposition=LoserPolicy.CANCEL)
        for i in range(2)
    ]
    handle = group.handle()
    assert (handle.group_key, handle.child_count, handle.consumed) == (GROUP, 2, 0)
    assert (handle.wake, handle.disposition) == (WakePolicy.FIRST_SUCCESS, LoserPolicy.CANCEL)


def test_g03_group_keeps_a_child_whose_membership_already_agrees() -> None:
    child = envelope("a", membership=membership())
    group = EffectGroup(key=GROUP, wake="first", disposition="run_to_completion", children=[child])
    assert group.children == (child,)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("group_key", "scope-1:group:other:0"),
        ("position", 1),
        ("wake", WakePolicy.ALL),
        ("disposition", LoserPolicy.CANCEL),
    ],
)
def test_g03_group_refuses_a_child_whose_membership_disagrees(field: str, value: Any) -> None:
    foreign = envelope("a", membership=membership(**{field: value}))
    with pytest.raises(MembershipConflict) as caught:
        EffectGroup(
            key=GROUP,
            wake=WakePolicy.FIRST,
            disposition=LoserPolicy.RUN_TO_COMPLETION,
            children=[foreign],
        )
    error = caught.value
    assert (error.group_key, error.position, error.replay_key) == (GROUP, 0, "a")
    assert field in str(error)
    assert str(error).startswith("[membership_conflict]")


def test_group_refuses_duplicate_replay_keys() -> None:
    with pytest.raises(DuplicateReplayKey) as caught:
        EffectGroup(
            key=GROUP,
            wake=WakePolicy.ALL,
            disposition=LoserPolicy.RUN_TO_COMPLETION,
            children=[envelope("same"), envelope("same", input=2)],
        )
    assert caught.value.ids() == {
        "code": "duplicate_replay_key",
        "group_key": GROUP,
        "replay_key": "same",
        "position": 1,
        "rank": None,
    }


def test_g04_group_refuses_no_children() -> None:
    with pytest.raises(EmptyGroup) as caught:
        EffectGroup(key=GROUP, wake=WakePolicy.ALL, disposition=LoserPolicy.CANCEL, children=[])
    assert caught.value.group_key == GROUP
    assert GROUP in str(caught.value)


def test_group_refuses_an_empty_key_and_a_missing_policy() -> None:
    with pytest.raises(InvalidEnvelope):
        EffectGroup(key="", wake="all", disposition="cancel", children=[envelope()])
    with pytest.raises(InvalidEnvelope) as caught:
        EffectGroup(key=GROUP, wake="sometimes", disposition="cancel", children=[envelope()])
    assert caught.value.group_key == GROUP


# -- handles and counters ------------------------------------------------------------------


def test_g18_handle_round_trips_through_json() -> None:
    handle = GroupHandle(
        group_key=GROUP,
        child_count=3,
        consumed=2,
        wake=WakePolicy.FIRST_SUCCESS,
        disposition=LoserPolicy.CANCEL,
    )
    restored = GroupHandle.from_json(handle.to_json())
    assert restored == handle
    assert restored is not handle
    assert GroupHandle.from_json(handle.to_json().encode()) == handle
    assert (restored.remaining, restored.exhausted) == (1, False)


VALID_HANDLE = {
    "group_key": GROUP,
    "child_count": 2,
    "consumed": 0,
    "wake": "first",
    "disposition": "cancel",
}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json at all",
        "[]",
        json.dumps({**VALID_HANDLE, "consumed": 3}),
        json.dumps({**VALID_HANDLE, "child_count": 0, "consumed": 0}),
        json.dumps({**VALID_HANDLE, "consumed": -1}),
        json.dumps({**VALID_HANDLE, "group_key": ""}),
        json.dumps({**VALID_HANDLE, "wake": "eventually"}),
        json.dumps({**VALID_HANDLE, "cursor": 1}),
        json.dumps({k: v for k, v in VALID_HANDLE.items() if k != "child_count"}),
    ],
    ids=[
        "empty",
        "garbage",
        "array",
        "consumed-past-count",
        "no-children",
        "negative",
        "empty-key",
        "bad-wake",
        "extra-field",
        "missing-field",
    ],
)
def test_g20_malformed_handle_is_refused_with_a_typed_error(text: str) -> None:
    with pytest.raises(MalformedHandle, match=r"^\[malformed_handle\]"):
        GroupHandle.from_json(text)


def test_g18_copy_cursor_is_independent() -> None:
    handle = GroupHandle.model_validate(VALID_HANDLE)
    copy = handle.copy_cursor()
    copy.consumed = 1
    assert handle.consumed == 0


def test_g05_occurrence_counter_counts_per_batch_and_round_trips() -> None:
    counter = OccurrenceCounter()
    assert [counter.next("a"), counter.next("a"), counter.next("b")] == [0, 1, 0]
    restored = OccurrenceCounter.from_json(counter.to_json())
    assert restored.counts == {"a": 2, "b": 1}
    assert restored.next("a") == 2
    assert counter.counts["a"] == 2


# -- group keys ---------------------------------------------------------------------------


def test_g05_group_key_format() -> None:
    assert group_key("turn-7", "0123abcd", 4) == "turn-7:group:0123abcd:4"
    for bad in (("", "b", 0), ("s", "", 0), ("s", "b", -1)):
        with pytest.raises(InvalidEnvelope):
            group_key(*bad)


def test_g05_batch_id_is_a_content_hash() -> None:
    calls = [{"kind": "tool_call", "name": "search", "input": {"q": 1}}]
    same = [{"name": "search", "input": {"q": 1}, "kind": "tool_call"}]
    assert batch_id(calls) == batch_id(same)
    assert re.fullmatch(r"[0-9a-f]{24}", batch_id(calls))
    assert batch_id(calls) != batch_id([{**calls[0], "input": {"q": 2}}])


def test_g05_two_identical_batches_in_one_scope_get_distinct_keys() -> None:
    scope = Scope(scope_id="turn-7")
    calls = [tool("search", {"q": "x"}), tool("fetch", {"url": "u"})]
    predicted = next_group_key(scope, calls)
    first = build_group(scope, calls, WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    second = build_group(scope, calls, WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    batch = batch_id([call.document() for call in calls])
    assert first.key == predicted == f"turn-7:group:{batch}:0"
    assert second.key == f"turn-7:group:{batch}:1"
    assert {c.replay_key for c in first.children}.isdisjoint(c.replay_key for c in second.children)


def test_g05_occurrence_survives_a_saved_and_restored_scope() -> None:
    scope = Scope(scope_id="turn-7")
    calls = [tool("search", {"q": "x"})]
    before = build_group(scope, calls, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
    restored = Scope.from_json(scope.to_json())
    after = build_group(restored, calls, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
    assert before.key.endswith(":0")
    assert after.key.endswith(":1")
    assert before.key.rsplit(":", 1)[0] == after.key.rsplit(":", 1)[0]


def test_g04_build_group_of_no_calls_is_refused_without_counting() -> None:
    scope = Scope(scope_id="turn-7")
    with pytest.raises(EmptyGroup):
        build_group(scope, [], WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    assert scope.counter.counts == {}


# -- errors -------------------------------------------------------------------------------

CONTRACT_ERRORS = sorted(
    (
        obj
        for name in contract.__all__
        if isinstance(obj := getattr(contract, name), type)
        and issubclass(obj, EffectHostError)
        and obj is not EffectHostError
    ),
    key=lambda cls: cls.__name__,
)


def test_every_contract_error_has_its_own_code() -> None:
    codes = [cls.code for cls in CONTRACT_ERRORS]
    assert len(CONTRACT_ERRORS) >= 20
    assert len(set(codes)) == len(codes)
    combinator_errors = (EffectFailed, AllEffectsFailed, DeadlineExceeded)
    every = codes + [cls.code for cls in combinator_errors]
    assert sorted(every) == sorted(RuntimeErrorCode)


@pytest.mark.parametrize("cls", CONTRACT_ERRORS, ids=lambda cls: cls.__name__)
def test_error_message_starts_with_its_code_and_ids_are_attributes(
    cls: type[EffectHostError],
) -> None:
    error = cls(
        "something is off", group_key="g:group:b:0", replay_key="g:group:b:0:1", position=1, rank=2
    )
    assert str(error) == f"[{cls.code.value}] something is off"
    assert error.group_key == "g:group:b:0"
    assert error.replay_key == "g:group:b:0:1"
    assert (error.position, error.rank) == (1, 2)
    assert error.ids() == {
        "code": cls.code.value,
        "group_key": "g:group:b:0",
        "replay_key": "g:group:b:0:1",
        "position": 1,
        "rank": 2,
    }


# -- executors, resolver, controller base ---------------------------------------------------


@pytest.mark.anyio
async def test_g09_executor_is_single_use() -> None:
    runs: list[Any] = []

    async def search(value: Any) -> Any:
        runs.append(value)
        return {"hits": len(runs)}

    executor = FunctionExecutor(search)
    call = ExecutionInput(envelope("rk-1"))
    first = await executor.execute(call)
    with pytest.raises(ExecutorConsumed) as caught:
        await executor.execute(call)
    assert first.ok and first.value == {"hits": 1}
    assert runs == [{"query": "x"}]
    assert caught.value.replay_key == "rk-1"
    assert "rk-1" in str(caught.value)


@pytest.mark.anyio
async def test_executor_turns_raised_errors_into_error_outcomes() -> None:
    async def refuse(_: Any) -> Any:
        raise ToolError("RateLimited", "slow down", data={"retry": 3}, code=429)

    async def crash(_: Any) -> Any:
        raise KeyError("missing")

    refused = await FunctionExecutor(refuse).execute(ExecutionInput(envelope()))
    crashed = await FunctionExecutor(crash).execute(ExecutionInput(envelope()))
    assert refused.status == "error" and refused.error is not None
    assert (refused.error.type, refused.error.message) == ("RateLimited", "slow down")
    assert (refused.error.data, refused.error.code) == ({"retry": 3}, 429)
    assert crashed.error is not None and crashed.error.type == "KeyError"


def test_g09_tool_registry_resolves_only_known_tool_calls_with_fresh_executors() -> None:
    registry = ToolRegistry()

    @registry.tool("search")
    async def search(value: Any) -> Any:
        return value

    first = registry.resolve(envelope(name="search"))
    second = registry.resolve(envelope(name="search"))
    assert isinstance(first, FunctionExecutor) and isinstance(second, FunctionExecutor)
    assert first is not second
    assert registry.names == frozenset({"search"})
    assert registry.resolve(envelope(name="fetch")) is None
    assert registry.resolve(envelope(kind=EffectKind.SLEEP, name="search")) is None
    assert registry.resolve(envelope(kind=EffectKind.AWAIT_EVENT, name="search")) is None


def test_g07_validate_deployment_follows_the_registered_resolver() -> None:
    host = MemoryEffectHost()
    with pytest.raises(EffectGroupUnsupported, match=r"^\[effect_group_unsupported\]"):
        validate_deployment(host)
    host.register_executors(ToolRegistry())
    validate_deployment(host)
    assert host.supports_effect_groups()
    host.register_executors(None)
    assert not host.supports_effect_groups()
    with pytest.raises(EffectGroupUnsupported):
        validate_deployment(host)


class BareController(EffectController):
    pass


@pytest.mark.anyio
async def test_g07_controller_base_refuses_every_group_method_loudly() -> None:
    ctl = BareController()
    group = EffectGroup(key=GROUP, wake="all", disposition="cancel", children=[envelope()])
    handle = group.handle()
    refusals = [
        ctl.open_effect_group(group),
        ctl.await_next_settlement(handle),
        ctl.close_effect_group(handle),
        ctl.settlement_order(GROUP),
        ctl.deliver_event(GROUP, "ping"),
    ]
    for call in refusals:
        with pytest.raises(EffectGroupUnsupported) as caught:
            await call
        assert caught.value.group_key == GROUP
    assert not ctl.supports_effect_groups()
    assert await ctl.open_group_keys() == []
    assert await ctl.drain().run_pass() == DrainReport()
    with pytest.raises(EffectGroupUnsupported):
        validate_deployment(ctl)


@pytest.mark.anyio
async def test_g06_ungrouped_path_refuses_a_grouped_envelope_without_running_it() -> None:
    runs: list[Any] = []

    async def search(value: Any) -> Any:
        runs.append(value)
        return "ok"

    ctl = BareController()
    grouped = envelope("rk-g", membership=membership(position=2))
    with pytest.raises(MembershipUnsupported) as caught:
        await ctl.execute_effect(grouped, FunctionExecutor(search))
    assert caught.value.ids() == {
        "code": "membership_unsupported",
        "group_key": GROUP,
        "replay_key": "rk-g",
        "position": 2,
        "rank": None,
    }
    assert runs == []
    outcome = await ctl.execute_effect(envelope("rk-u"), FunctionExecutor(search))
    assert outcome.value == "ok" and len(runs) == 1
