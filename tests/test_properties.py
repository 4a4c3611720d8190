"""Property tests over the public entries (SPEC §7, R-2, R-8): whatever goes in, only
``EffectHostError`` subclasses come out, no call hangs (every wait is bounded), and a
refused call changes nothing recorded."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from group_support import group as effect_group
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_support import examples

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    GroupHandle,
    LoserPolicy,
    Outcome,
    ToolRegistry,
    WakePolicy,
    limits,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.sql import SqlEffectHost, sqlite_host

T = TypeVar("T")
WAIT = 10.0  # a hang guard

FAST = examples(60)

# -- generated values -------------------------------------------------------------------

text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "a\x00b", "\ud800", "k" * (limits.MAX_KEY_BYTES + 1)]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63, -(2**63) - 1, limits.MAX_INT, limits.MIN_INT]),
    st.booleans().map(lambda negative: -(10**5000) if negative else 10**5000),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_like = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(text, inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=12,
)
odd = st.sampled_from([b"raw", {1, 2}, object(), {1: "int key"}, iter([1])])


def nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


deep = st.integers(min_value=0, max_value=1200).map(nested)
anything = st.one_of(json_like, odd, deep)


def only_typed(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(...)``'s result, or ``None`` when it refused with a typed error; any other
    exception fails the property."""
    try:
        return call(*args, **kwargs)
    except EffectHostError:
        return None


# -- constructors -----------------------------------------------------------------------

envelope_fields = st.fixed_dictionaries(
    {},
    optional={
        "replay_key": st.one_of(text, scalars),
        "kind": st.one_of(st.just("tool_call"), text, scalars),
        "name": st.one_of(st.just("t"), text, scalars),
        "input": anything,
        "membership": st.one_of(st.none(), scalars, st.dictionaries(text, scalars)),
        "extra": scalars,
    },
)


@FAST
@given(fields=envelope_fields)
def test_envelope_constructor_refuses_only_with_typed_errors(fields: dict[str, Any]) -> None:
    """SPEC §7, R-8: ``EffectEnvelope(**fields)`` builds or raises an ``EffectHostError``;
    what it builds is within the limits and encodes canonically."""
    envelope = only_typed(EffectEnvelope, **fields)
    if envelope is not None:
        assert len(envelope.canonical_bytes()) <= limits.MAX_ENVELOPE_BYTES
        json.loads(envelope.canonical_bytes())


@FAST
@given(
    key=st.one_of(st.just("p:group:g:0"), text, scalars),
    wake=st.one_of(st.sampled_from(list(WakePolicy)), text, scalars),
    disposition=st.one_of(st.sampled_from(list(LoserPolicy)), text, scalars),
    children=st.one_of(
        st.lists(st.one_of(envelope_fields, scalars), max_size=3),
        scalars,
        st.builds(lambda n: (x for x in range(n)), st.integers(0, 3)),
    ),
    extra=st.one_of(st.just({}), st.just({"extra": 1})),
)
def test_group_constructor_refuses_only_with_typed_errors(
    key: Any, wake: Any, disposition: Any, children: Any, extra: dict[str, Any]
) -> None:
    """G-03, G-04, SPEC §7: ``EffectGroup(...)`` builds or raises an ``EffectHostError``."""
    group = only_typed(
        EffectGroup, key=key, wake=wake, disposition=disposition, children=children, **extra
    )
    if group is not None:
        assert 1 <= group.child_count <= limits.MAX_CHILDREN
        assert group.handle().consumed == 0


handle_docs = st.fixed_dictionaries(
    {},
    optional={
        "group_key": st.one_of(text, scalars),
        "child_count": scalars,
        "consumed": scalars,
        "wake": st.one_of(st.sampled_from([w.value for w in WakePolicy]), text),
        "disposition": st.one_of(st.sampled_from([d.value for d in LoserPolicy]), text),
        "extra": scalars,
    },
)


@FAST
@given(doc=handle_docs, raw=st.one_of(st.text(max_size=40), st.binary(max_size=40)))
def test_from_json_refuses_only_with_malformed_handle(doc: dict[str, Any], raw: Any) -> None:
    """SPEC §7, R-2: ``GroupHandle.from_json`` of anything decodes a valid handle or
    raises ``MalformedHandle``."""
    try:
        text_doc = json.dumps(doc)
    except ValueError:
        text_doc = "{}"
    for candidate in (text_doc, raw):
        handle = only_typed(GroupHandle.from_json, candidate)
        if handle is not None:
            assert type(handle.child_count) is int and type(handle.consumed) is int
            assert 0 <= handle.consumed <= handle.child_count <= limits.MAX_CHILDREN
            assert GroupHandle.from_json(handle.to_json()) == handle


@FAST
@given(value=anything, data=anything, message=text)
def test_outcome_constructors_refuse_only_with_typed_errors(
    value: Any, data: Any, message: Any
) -> None:
    """R-8: ``Outcome.success``/``failure`` build within the limits or refuse typed."""
    for outcome in (
        only_typed(Outcome.success, value),
        only_typed(Outcome.failure, "T", message, data),
    ):
        if outcome is not None:
            assert len(outcome.model_dump_json()) <= limits.MAX_OUTCOME_BYTES
            assert Outcome.model_validate_json(outcome.model_dump_json()) == outcome


# -- the memory controller --------------------------------------------------------------


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return loop.run_until_complete(asyncio.wait_for(coro, WAIT))


KEYS = ["p:group:a:0", "p:group:b:0"]


async def _typed(coro: Coroutine[Any, Any, T]) -> T | None:
    try:
        return await coro
    except EffectHostError:
        return None


@settings(FAST, max_examples=40)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["open", "await", "close", "event", "order"]),
            st.sampled_from(KEYS),
            st.integers(min_value=-1, max_value=4),
            st.one_of(st.none(), st.sampled_from([*LoserPolicy, "cancel", "bogus", 3])),
            anything,
        ),
        max_size=12,
    )
)
def test_memory_controller_methods_refuse_typed_and_change_nothing(steps: list[Any]) -> None:
    """SPEC §7, R-2, R-8: any sequence of calls on the memory host returns or raises an
    ``EffectHostError`` within a bounded wait; a refused call leaves the open keys and the
    settlement orders as they were."""
    tools = ToolRegistry()

    @tools.tool("echo")
    async def echo(value: Any) -> Any:
        return value

    loop = asyncio.new_event_loop()
    host = MemoryEffectHost(tools)

    async def recorded() -> Any:
        return await host.open_group_keys(), [
            await _typed(host.settlement_order(key)) for key in KEYS
        ]

    try:
        for action, key, number, disposition, payload in steps:
            before = _run(loop, recorded())
            try:
                if action == "open":
                    group = effect_group(
                        key,
                        [
                            {"replay_key": f"{key}:{i}", "kind": "tool_call", "name": "echo"}
                            for i in range(2)
                        ],
                    )
                    _run(loop, host.open_effect_group(group))
                    continue
                count = 3 if number == 4 else 2  # 3: a handle the record disagrees with
                handle = GroupHandle(
                    group_key=key,
                    child_count=count,
                    consumed=max(0, min(number, count)),
                    wake=WakePolicy.ALL,
                    disposition=LoserPolicy.RUN_TO_COMPLETION,
                )
                if action == "await":
                    _run(loop, host.await_next_settlement(handle))
                elif action == "close":
                    _run(loop, host.close_effect_group(handle, disposition))
                elif action == "event":
                    _run(loop, host.deliver_event(key, "ping", payload))
                else:
                    _run(loop, host.settlement_order(key))
            except EffectHostError:
                assert _run(loop, recorded()) == before
    finally:
        loop.run_until_complete(host.aclose())
        loop.close()


# -- tool results of generated shapes, memory and SQLite -----------------------------------


def _tables(path: Path) -> dict[str, list[Any]]:
    with sqlite3.connect(path) as c:
        names = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: sorted(map(repr, c.execute(f"SELECT * FROM {n}"))) for n in sorted(names)}


def _check_result(settled: Any, value: Any) -> None:
    outcome = settled.outcome
    try:
        expected = Outcome.success(value)
    except EffectHostError as exc:
        assert outcome.status == "error"
        assert outcome.error.type == type(exc).__name__
        assert settled.replay_key in outcome.error.message
    else:
        assert outcome == expected


def _results_property(
    loop: asyncio.AbstractEventLoop, host: Any, path: Path | None, name: str
) -> None:
    results: dict[str, Any] = {}
    counter = iter(range(10**9))

    @settings(FAST, max_examples=40)
    @given(value=anything)
    def prop(value: Any) -> None:
        n = next(counter)
        key = f"p:group:{name}:{n}"
        results[key] = value
        group = effect_group(
            key, [{"replay_key": f"{key}:0", "kind": "tool_call", "name": "give", "input": key}]
        )
        handle = _run(loop, host.open_effect_group(group))
        settled = _run(loop, host.await_next_settlement(handle))
        _check_result(settled, value)
        again = _run(loop, host.await_next_settlement(group.handle()))
        assert again == settled
        _run(loop, host.close_effect_group(handle))
        if path is not None:  # a refused event changes no table
            before = _tables(path)
            try:
                _run(loop, host.deliver_event(key, "ping", value))
            except EffectHostError:
                assert _tables(path) == before

    tools = ToolRegistry()

    @tools.tool("give")
    async def give(key: str) -> Any:
        return results[key]

    host.register_executors(tools)
    prop()


def test_memory_tool_results_of_any_shape_settle_typed() -> None:
    """R-8: a tool result of any shape settles on the memory host as its success or as
    its typed failure; the waiter returns (bounded) and the rank reads again."""
    loop = asyncio.new_event_loop()
    host = MemoryEffectHost()
    try:
        _results_property(loop, host, None, "memory")
    finally:
        loop.run_until_complete(host.aclose())
        loop.close()


def test_sqlite_tool_results_of_any_shape_settle_typed() -> None:
    """R-8: the same on SQLite, whose rows must also read back; a refused event payload
    changes no table."""
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.sqlite3"
        host: SqlEffectHost = loop.run_until_complete(sqlite_host(path, poll_interval=0.05))
        try:
            _results_property(loop, host, path, "sqlite")
        finally:
            loop.run_until_complete(host.aclose())
            loop.close()
