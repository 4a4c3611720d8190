"""The contract's fast paths give what its general paths give (G-01, G-02, R-8): the
normalised value, the canonical bytes and hashes, the group a combinator builds, the
refusal and its message. Each side is computed here from the public, documented
definition (encode then decode; encode the canonical dict; validate the model)."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_support import examples

from effecthost.combinators import Call, Scope, build_group, tool
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    GroupHandle,
    GroupMembership,
    LoserPolicy,
    Outcome,
    Settlement,
    WakePolicy,
    batch_id,
    canonical_json,
    group_key,
    limits,
    normalize_json,
)

SETTINGS = examples(150)

text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "a\x00b", "\ud800", "é€𝄞", '"\\\n\t\x01', "k" * 600]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(text, inner, max_size=4),
        st.dictionaries(st.integers(0, 3), inner, min_size=1, max_size=2),
    ),
    max_leaves=12,
)


def _general_normalize(value: Any) -> Any:
    """The definition: within the limits, then encode and decode."""
    limits.check_json(value)
    return json.loads(canonical_json(value))


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except EffectHostError as exc:
        return (type(exc).__name__, str(exc))


@SETTINGS
@given(value=values)
def test_r8_normalize_json_is_the_encode_decode_round_trip(value: Any) -> None:
    """R-8: normalize_json's result (and key order) or refusal is the round trip's."""
    fast = _outcome(lambda: normalize_json(value))
    general = _outcome(lambda: _general_normalize(value))
    assert fast[0] == general[0]
    if fast[0] == "ok":
        assert fast[1] == general[1]
        assert json.dumps(fast[1]) == json.dumps(general[1])  # the same key order
        assert canonical_json(fast[1]) == canonical_json(value)


def test_r8_normalize_json_copies_containers() -> None:
    """R-8: the normalised value shares no container with the caller's."""
    inner = [1, {"b": [2]}]
    value = {"a": inner}
    normal = normalize_json(value)
    assert normal == value
    assert normal["a"] is not inner and normal["a"][1] is not inner[1]


def _membership(key: str, position: int) -> GroupMembership:
    return GroupMembership(
        group_key=key, position=position, wake=WakePolicy.ALL, disposition=LoserPolicy.CANCEL
    )


@SETTINGS
@given(value=values, kind=text, name=text, replay_key=text, grouped=st.booleans())
def test_g01_canonical_bytes_are_the_canonical_dict_encoded(
    value: Any, kind: str, name: str, replay_key: str, grouped: bool
) -> None:
    """G-01, G-02: an envelope's canonical bytes are its canonical dict encoded, also
    for the copy a group stamps."""
    fields = {"replay_key": replay_key, "kind": kind, "name": name, "input": value}
    try:
        envelope = EffectEnvelope(**fields)
    except EffectHostError:
        return
    if grouped:
        envelope = envelope.with_membership(_membership("g", 3))
    assert envelope.canonical_bytes() == canonical_json(envelope.canonical_dict())
    assert envelope.envelope_hash() == hashlib.sha256(envelope.canonical_bytes()).hexdigest()
    try:
        group = EffectGroup(key="g", wake="all", disposition="cancel", children=[envelope])
    except EffectHostError:
        return
    child = group.children[0]
    assert child.canonical_bytes() == canonical_json(child.canonical_dict())


def test_g01_a_copy_does_not_keep_the_original_bytes() -> None:
    """G-01: a copy with another field encodes its own fields, not the original's."""
    envelope = EffectEnvelope(replay_key="r", kind="tool_call", name="a", input=1)
    envelope.canonical_bytes()
    renamed = envelope.model_copy(update={"name": "b"})
    assert renamed.canonical_bytes() == canonical_json(renamed.canonical_dict())
    assert renamed != envelope
    assert envelope == EffectEnvelope(replay_key="r", kind="tool_call", name="a", input=1)


def test_g01_copies_hash_their_own_fields() -> None:
    """G-01: the size and hash an envelope remembers are not carried into a copy with
    other fields; a plain copy, a deep copy and a pickled one hash as the original."""
    envelope = EffectEnvelope(replay_key="r", kind="tool_call", name="a", input=[1])
    digest, size = envelope.envelope_hash(), envelope.canonical_size()
    renamed = envelope.model_copy(update={"input": [1, 2]})
    fresh = EffectEnvelope(replay_key="r", kind="tool_call", name="a", input=[1, 2])
    assert (renamed.envelope_hash(), renamed.canonical_size()) == (
        fresh.envelope_hash(),
        fresh.canonical_size(),
    )
    assert renamed.envelope_hash() != digest
    for same in (
        copy.copy(envelope),
        copy.deepcopy(envelope),
        pickle.loads(pickle.dumps(envelope)),
    ):
        assert same == envelope
        assert (same.envelope_hash(), same.canonical_size()) == (digest, size)


def _general_group(
    scope_id: str, calls: list[Call], occurrence: int, wake: WakePolicy, disposition: LoserPolicy
) -> EffectGroup:
    """build_group by its definition: the batch id of the call documents, validated
    envelopes, the group constructor."""
    batch = batch_id([call.document() for call in calls])
    key = group_key(scope_id, batch, occurrence)
    children = [
        EffectEnvelope(replay_key=f"{key}:{i}", kind=c.kind, name=c.name, input=c.input)
        for i, c in enumerate(calls)
    ]
    return EffectGroup(key=key, wake=wake, disposition=disposition, children=children)


@SETTINGS
@given(
    inputs=st.lists(values, min_size=1, max_size=4),
    names=st.lists(text, min_size=4, max_size=4),
    scope_id=st.sampled_from(["s", "é-scope", "k" * 480, "a\x00b"]),
)
def test_g01_g05_build_group_is_the_general_construction(
    inputs: list[Any], names: list[str], scope_id: str
) -> None:
    """G-01, G-02, G-05: build_group gives the key, children, bytes and hashes of the
    general construction, or the same typed refusal."""
    calls = [Call(kind="tool_call", name=n, input=v) for n, v in zip(names, inputs, strict=False)]
    scope = Scope(scope_id=scope_id)
    fast = _outcome(lambda: build_group(scope, calls, WakePolicy.ALL, LoserPolicy.CANCEL))
    general = _outcome(
        lambda: _general_group(scope_id, calls, 0, WakePolicy.ALL, LoserPolicy.CANCEL)
    )
    assert fast[0] == general[0]
    if fast[0] != "ok":
        assert fast[1] == general[1]
        return
    built, expected = fast[1], general[1]
    assert built == expected
    assert [c.canonical_bytes() for c in built.children] == [
        canonical_json(c.canonical_dict()) for c in expected.children
    ]
    assert [c.envelope_hash() for c in built.children] == [
        c.envelope_hash() for c in expected.children
    ]


def test_g01_build_group_inputs_are_not_the_calls() -> None:
    """G-01: a group's inputs are copies; changing a call afterwards changes no child."""
    call = tool("echo", {"a": [1]})
    group = build_group(Scope(scope_id="s"), [call], WakePolicy.ALL, LoserPolicy.CANCEL)
    before = group.children[0].canonical_bytes()
    call.input["a"].append(2)
    assert group.children[0].input == {"a": [1]}
    assert group.children[0].canonical_bytes() == before


@pytest.mark.parametrize("name", ["echo", 3, None, b"x"])
def test_tool_checks_its_name_as_the_call_model_does(name: Any) -> None:
    """R-8: ``tool`` builds what ``Call`` builds, or refuses as it refuses."""
    try:
        expected: Any = Call(kind="tool_call", name=name, input=[1])
    except Exception as exc:
        with pytest.raises(type(exc)):
            tool(name, [1])
    else:
        assert tool(name, [1]) == expected


@SETTINGS
@given(value=values)
def test_r8_outcome_success_and_size_match_the_model(value: Any) -> None:
    """R-8: Outcome.success is the validated model, and its size the dump's."""
    fast = _outcome(lambda: Outcome.success(value))
    general = _outcome(lambda: Outcome(status="success", value=_general_normalize(value)))
    assert fast[0] == general[0]
    if fast[0] == "ok":
        assert fast[1] == general[1]
        assert fast[1].model_dump_json() == general[1].model_dump_json()
        assert fast[1].canonical_size() == len(canonical_json(fast[1].model_dump(mode="json")))


def test_outcome_sizes_of_failures_and_cancellations_match_the_dump() -> None:
    for outcome in (
        Outcome.failure("E", "boom", {"k": [1, 2.5]}, code=7),
        Outcome.failure("E", "é"),
        Outcome.cancelled(),
        Outcome(status="error", error={"type": "E", "message": "m"}),
    ):
        assert outcome.canonical_size() == len(canonical_json(outcome.model_dump(mode="json")))
        assert outcome == Outcome.model_validate(outcome.model_dump())


def test_settlement_recorded_is_the_validated_settlement() -> None:
    outcome = Outcome.success([1])
    recorded = Settlement.recorded(2, 1, "r", outcome)
    assert recorded == Settlement(rank=2, position=1, replay_key="r", outcome=outcome)
    assert (
        recorded.model_dump_json()
        == Settlement(rank=2, position=1, replay_key="r", outcome=outcome).model_dump_json()
    )
    with pytest.raises(EffectHostError):
        Settlement.recorded(0, 1, "r", outcome)


@pytest.mark.parametrize("value", [0, 1, 2, 3, -1, True, 2.0, "1"])
def test_handle_assignment_accepts_and_refuses_as_validation_does(value: Any) -> None:
    """G-18, G-20: assigning ``consumed`` keeps the handle's strict checks."""
    handle = GroupHandle(group_key="g", child_count=2, consumed=0, wake="all", disposition="cancel")
    try:
        handle.consumed = value
    except EffectHostError:
        assert handle.consumed == 0
        assert not (type(value) is int and 0 <= value <= 2)
    else:
        assert type(value) is int and 0 <= value <= 2
        assert GroupHandle.from_json(handle.to_json()) == handle
