"""What a caller saves in its continuation — a ``Scope``, an ``OccurrenceCounter``, a
``GroupHandle`` — decodes as strictly as the contract checks everything else (issue 21,
R-8): a typed refusal naming no part of the input, repeated keys refused, the limits of
``build_group``; and the 1 MiB limit is the same boundary for every JSON type."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effecthost.combinators import Scope, build_group, tool
from effecthost.contract import (
    EffectHostError,
    GroupHandle,
    InvalidEnvelope,
    LoserPolicy,
    MalformedHandle,
    OccurrenceCounter,
    PayloadTooLarge,
    WakePolicy,
    limits,
    normalize_json,
)
from effecthost.contract._types import canonical_json

CANARY = "canary-21-quoted"

SCOPES: list[Any] = [
    f'{{"scope_id":"a","scope_id":"{CANARY}"}}',
    '{"scope_id":"a\\u0000b"}',
    '{"scope_id":""}',
    f'{{"scope_id":"{"x" * 600}"}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"b":"1"}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"b":-1}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"b":1.0}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"b":true}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"b":{2**63}}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"b":1,"b":2}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":{{"":1}}}}}}',
    f'{{"scope_id":"{CANARY}","counter":{{"counts":[]}}}}',
    f'{{"scope_id":"{CANARY}","counter":[]}}',
    f'{{"scope_id":"{CANARY}","extra":1}}',
    f'{{"scope_id":{CANARY!r}}}',
    '{"scope_id":NaN}',
    "[]",
    "null",
    "",
    b"\xff\xfe",
    "\ud800",
    '{"scope_id":"' + "a" * (limits.MAX_JSON_BYTES + 1) + '"}',
    "[" * 100_000,
    7,
    None,
]

COUNTERS: list[Any] = [
    '{"counts":{"b":"1"}}',
    '{"counts":{"b":-1}}',
    '{"counts":{"b":1,"b":2}}',
    '{"counts":{"b":1},"counts":{}}',
    '{"counts":{"b\\u0000":1}}',
    '{"counts":{"b":1e3}}',
    '{"counts":"x"}',
    '{"other":1}',
    "[]",
    "{",
    b"\x00",
    3.5,
]

HANDLE = '{"group_key":"k","child_count":2,"consumed":0,"wake":"all","disposition":"cancel"'
HANDLES: list[Any] = [
    HANDLE + ',"group_key":"' + CANARY + '"}',
    HANDLE + ',"consumed":1}',
    '{"group_key":"' + "k" * 20_000 + '","child_count":1,"consumed":0,'
    '"wake":"all","disposition":"cancel"}',
    HANDLE.replace('"consumed":0', '"consumed":NaN') + "}",
    "[" * 100_000,
]


def _refused(call: Any, text: Any, error: type[EffectHostError]) -> EffectHostError:
    with pytest.raises(error) as raised:
        call(text)
    message = f"{raised.value!s} {raised.value!r}"
    assert CANARY not in message
    assert "xxxxxxxxxx" not in message and "input_value" not in message
    return raised.value


@pytest.mark.parametrize("text", SCOPES)
def test_scope_from_json_is_strict_and_quotes_nothing(text: Any) -> None:
    """Issue 21, R-8: ``Scope.from_json`` refuses what ``build_group`` would refuse later
    (a NUL, an over-long scope id, a count that is not a non-negative integer), repeated
    keys and malformed text with ``InvalidEnvelope``, quoting none of it."""
    _refused(Scope.from_json, text, InvalidEnvelope)


@pytest.mark.parametrize("text", COUNTERS)
def test_occurrence_counter_from_json_is_strict(text: Any) -> None:
    """Issue 21, R-8: ``OccurrenceCounter.from_json`` is strict the same way."""
    _refused(OccurrenceCounter.from_json, text, InvalidEnvelope)


@pytest.mark.parametrize("text", HANDLES)
def test_group_handle_from_json_refuses_repeated_keys_and_bounds_its_size(text: Any) -> None:
    """Issue 21, R-2: ``GroupHandle.from_json`` refuses a repeated key (which silently
    kept the last value), an over-long text and ``NaN`` with ``MalformedHandle``."""
    _refused(GroupHandle.from_json, text, MalformedHandle)


def test_saved_state_round_trips() -> None:
    """G-05, G-18: what ``to_json`` saves, ``from_json`` restores, and the restored scope
    gives the same next group key."""
    scope = Scope(scope_id="s")
    calls = [tool("echo", 1)]
    build_group(scope, calls, WakePolicy.ALL, LoserPolicy.CANCEL)
    restored = Scope.from_json(scope.to_json())
    assert restored == scope
    assert OccurrenceCounter.from_json(scope.counter.to_json()) == scope.counter
    a = build_group(scope, calls, WakePolicy.ALL, LoserPolicy.CANCEL)
    b = build_group(restored, calls, WakePolicy.ALL, LoserPolicy.CANCEL)
    assert a.key == b.key
    handle = a.handle()
    assert GroupHandle.from_json(handle.to_json()) == handle


def _of_size(kind: str, size: int) -> Any:
    """A value of ``kind`` whose canonical JSON is exactly ``size`` bytes."""
    if kind == "string":
        value: Any = "a" * (size - 2)
    elif kind == "list":
        value = ["a" * (size - 8), "b"]  # ["…","b"]
    elif kind == "object":
        value = {"k": "a" * (size - 8 - 8), "j": "b"}  # {"j":"b","k":"…"}
    else:
        value = [1] * ((size - 1) // 2)  # [1,1,…,1]
    assert len(canonical_json(value)) == size, (kind, len(canonical_json(value)))
    return value


@pytest.mark.parametrize("kind", ["string", "list", "object", "numbers"])
def test_the_one_mib_boundary_is_the_same_for_every_json_type(kind: str) -> None:
    """Issue 21, R-8: a value whose canonical JSON is exactly ``MAX_JSON_BYTES`` is
    accepted and one byte more is ``PayloadTooLarge``, whatever its type (a list or an
    object at exactly the limit was refused while a string was accepted)."""
    size = limits.MAX_JSON_BYTES if kind != "numbers" else limits.MAX_JSON_BYTES - 1
    value = _of_size(kind, size)
    limits.check_json(value)
    assert normalize_json(value) == value
    over = _of_size(kind, size + 1 if kind != "numbers" else size + 2)
    with pytest.raises(PayloadTooLarge):
        limits.check_json(over)
    with pytest.raises(PayloadTooLarge):
        normalize_json(over)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_from_json_raises_only_typed_errors(text: Any) -> None:
    """Issue 21: no saved-state decoder raises anything but its typed refusal."""
    for decode, error in (
        (Scope.from_json, InvalidEnvelope),
        (OccurrenceCounter.from_json, InvalidEnvelope),
        (GroupHandle.from_json, MalformedHandle),
    ):
        try:
            decode(text)
        except error:
            pass
