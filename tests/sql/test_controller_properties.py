"""Property tests of every controller method on SQLite and PostgreSQL (a real server):
generated programs of calls, hostile inputs among them, where only ``EffectHostError``
subclasses may escape, no call may hang (every wait is bounded), and a refused call must
leave every table and ``open_group_keys()`` as they were (SPEC §7, R-2, R-8)."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from group_support import echo_tools
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis_support import examples

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    GroupHandle,
    LoserPolicy,
    WakePolicy,
    limits,
    require_handle,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore

T = TypeVar("T")

WAIT = 5.0  # a hang guard: every call here returns or refuses well within it
PENDING = 0.1  # how long an await of a rank nobody can settle yet is given
TABLES = ("eh_groups", "eh_children", "eh_retired", "eh_payloads")
RENEWED = {"lease_expires", "owner_expires"}  # lease renewals run in the background

PROGRAMS = examples(40)

# -- generated values -------------------------------------------------------------------

HUGE = "h" * (limits.MAX_STRING_BYTES + 1)
hostile_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "a\x00b",
            "\x00",
            "\ud800",
            "ok\udfffok",
            "k" * (limits.MAX_KEY_BYTES + 1),
            "k" * limits.MAX_KEY_BYTES,
            HUGE,
        ]
    ),
)
not_text = st.sampled_from([None, 0, -1, 2**64, 1.5, b"key", ["k"], {"k": 1}])
hostile_key = st.one_of(hostile_text, not_text)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([limits.MAX_INT, limits.MIN_INT, 2**63, -(2**63) - 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)
json_like = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(hostile_text, inner, max_size=4),
    ),
    max_leaves=10,
)
payloads = st.one_of(
    json_like,
    st.sampled_from([b"raw", {1, 2}, {1: "int key"}, object()]),
    st.sampled_from([limits.MAX_DEPTH - 2, limits.MAX_DEPTH + 1, 250, 1200]).map(nested),
    st.just(["x" * 4096] * 300),  # over the size limit, not by depth
    st.just({"sealed": True, "v": 1, "ct": "AAAA"}),  # the shape of a sealed envelope
)
wakes = st.sampled_from(list(WakePolicy))
dispositions = st.sampled_from(list(LoserPolicy))
close_dispositions = st.one_of(
    st.none(),
    dispositions,
    st.sampled_from(["cancel", "run_to_completion", "CANCEL", "bogus", "", 3, b"cancel"]),
)
SLOTS = 2  # group keys of one example: a fresh namespace each


@dataclass
class Shape:
    """A group to open at a slot: its children are echo tools (settle at once) or event
    waits (settle on ``deliver_event``)."""

    wake: WakePolicy
    disposition: LoserPolicy
    children: list[tuple[str, Any]]  # (kind, input or event name)
    borrow: bool  # child 0 takes the other slot's replay key


shapes = st.builds(
    Shape,
    wake=wakes,
    disposition=dispositions,
    children=st.lists(
        st.one_of(
            st.tuples(st.just("echo"), st.one_of(st.just("v"), st.integers(0, 9), payloads)),
            st.tuples(st.just("event"), st.sampled_from(["go", "stop"])),
        ),
        min_size=1,
        max_size=3,
    ),
    borrow=st.sampled_from([False, False, False, True]),
)

# not a group at all (a group built past its checks with ``model_construct`` is out of
# scope: unlike a handle, the contract does not promise a host re-checks one)
hostile_groups = st.sampled_from([None, 3, "p:group:x:0", {"key": "k", "children": []}])

# a handle: the slot's own cursor, a well-formed one that may disagree with the record,
# one built past its checks, or no handle at all
handles = st.one_of(
    st.tuples(st.just("own")),
    st.tuples(st.just("own")),
    st.tuples(
        st.just("made"),
        st.integers(min_value=1, max_value=4),
        st.integers(min_value=0, max_value=4),
        wakes,
        dispositions,
    ),
    st.tuples(
        st.just("construct"),
        st.one_of(st.just(None), hostile_key),
        st.one_of(st.integers(min_value=-2, max_value=3), st.sampled_from([2**64, 2**63, "2"])),
        st.one_of(st.integers(min_value=-2, max_value=3), st.sampled_from([2**63, -(2**63)])),
        st.one_of(wakes, st.sampled_from(["all", None])),
        st.one_of(dispositions, st.sampled_from(["cancel", None])),
    ),
    st.tuples(st.just("object"), st.sampled_from([None, 1, "handle", {"group_key": "k"}])),
)

slot = st.integers(min_value=0, max_value=SLOTS - 1)
slot_key = st.tuples(st.just("slot"), slot)  # this example's key at a slot
steps = st.one_of(
    st.tuples(st.just("open"), slot, shapes),
    st.tuples(st.just("open-hostile"), hostile_groups),
    st.tuples(st.just("await"), slot, handles),
    st.tuples(st.just("close"), slot, handles, close_dispositions),
    st.tuples(
        st.just("event"),
        st.one_of(slot_key, slot_key, hostile_key),
        st.one_of(st.sampled_from(["go", "stop"]), hostile_key),
        st.one_of(st.none(), st.integers(0, 9), payloads),
    ),
    st.tuples(st.just("event"), slot_key, st.sampled_from(["go", "stop"]), st.integers(0, 9)),
    st.tuples(st.just("order"), st.one_of(slot_key, hostile_key)),
    st.tuples(st.just("keys")),
)
# most programs start with a group to work on
programs = st.builds(
    lambda first, rest: first + rest,
    st.lists(st.tuples(st.just("open"), slot, shapes), max_size=2),
    st.lists(st.one_of(steps, st.tuples(st.just("await"), slot, st.just(("own",)))), max_size=10),
)


# -- the databases ----------------------------------------------------------------------


@dataclass
class Bench:
    """One host on one database for a whole test function, reused across examples."""

    kind: str
    loop: asyncio.AbstractEventLoop
    host: SqlEffectHost
    read_tables: Callable[[], Coroutine[Any, Any, dict[str, list[Any]]]]
    numbers: Iterator[int] = field(default_factory=itertools.count)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def recorded(self) -> Any:
        """What a refusal must not change: every table (renewal columns aside) and the
        open keys, read once every child that can finish has finished."""
        await self.host.idle()
        return await self.read_tables(), await self.host.open_group_keys()


def _without_renewals(columns: list[str], rows: list[Any]) -> list[Any]:
    kept = [i for i, c in enumerate(columns) if c not in RENEWED]
    return sorted((tuple(row[i] for i in kept) for row in rows), key=repr)


def _sqlite_reader(path: Path) -> Callable[[], Coroutine[Any, Any, dict[str, list[Any]]]]:
    def dump() -> dict[str, list[Any]]:
        conn = sqlite3.connect(path)
        try:
            out = {}
            for table in TABLES:
                cursor = conn.execute(f"SELECT * FROM {table}")
                columns = [d[0] for d in cursor.description]
                out[table] = _without_renewals(columns, cursor.fetchall())
            return out
        finally:
            conn.close()

    async def read() -> dict[str, list[Any]]:
        return await asyncio.to_thread(dump)

    return read


@pytest.fixture(params=["sqlite", "postgres"])
def bench(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str) -> Iterator[Bench]:
    loop = asyncio.new_event_loop()
    tools = echo_tools()
    closers: list[Callable[[], Coroutine[Any, Any, None]]] = []
    if request.param == "sqlite":
        path = tmp_path / "props.sqlite3"
        host = SqlEffectHost(SqliteStore(path), tools, poll_interval=0.05)
        read = _sqlite_reader(path)
    else:
        import asyncpg

        dsn = request.getfixturevalue("pg_dsn")
        host = SqlEffectHost(PostgresStore(dsn, schema=pg_schema), tools, poll_interval=0.05)
        conn = loop.run_until_complete(
            asyncpg.connect(dsn, server_settings={"search_path": pg_schema})
        )
        closers.append(conn.close)

        async def read() -> dict[str, list[Any]]:
            out = {}
            for table in TABLES:
                rows = await conn.fetch(f"SELECT * FROM {table}")
                columns = list(rows[0].keys()) if rows else []
                out[table] = _without_renewals(columns, [tuple(r) for r in rows])
            return out

    loop.run_until_complete(host.start())
    try:
        yield Bench(request.param, loop, host, read)
    finally:
        loop.run_until_complete(host.aclose())
        for close in closers:
            loop.run_until_complete(close())
        loop.close()


# -- the program runner -----------------------------------------------------------------


class Hang(AssertionError):
    pass


async def _bounded(coro: Coroutine[Any, Any, T], seconds: float = WAIT) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await coro
    except TimeoutError:
        raise Hang(f"a call did not return within {seconds} s") from None


@dataclass
class Example:
    bench: Bench
    keys: list[str]
    own: dict[int, GroupHandle] = field(default_factory=dict)

    def key(self, where: Any) -> Any:
        return self.keys[where[1]] if isinstance(where, tuple) else where

    def handle(self, at: int, spec: tuple[Any, ...]) -> Any:
        key = self.keys[at]
        if spec[0] == "own":
            return self.own.get(at) or GroupHandle(
                group_key=key,
                child_count=1,
                consumed=0,
                wake=WakePolicy.ALL,
                disposition=LoserPolicy.CANCEL,
            )
        if spec[0] == "made":
            _, count, consumed, wake, disposition = spec
            return GroupHandle(
                group_key=key,
                child_count=count,
                consumed=min(consumed, count),
                wake=wake,
                disposition=disposition,
            )
        if spec[0] == "construct":
            _, group_key, count, consumed, wake, disposition = spec
            return GroupHandle.model_construct(
                group_key=key if group_key is None else group_key,
                child_count=count,
                consumed=consumed,
                wake=wake,
                disposition=disposition,
            )
        return spec[1]

    def group(self, at: int, shape: Shape) -> EffectGroup:
        key = self.keys[at]
        children = []
        for position, (kind, value) in enumerate(shape.children):
            replay_key = f"{key}:{position}"
            if position == 0 and shape.borrow:
                replay_key = f"{self.keys[1 - at]}:0"
            if kind == "echo":
                children.append(
                    EffectEnvelope(
                        replay_key=replay_key, kind="tool_call", name="echo", input=value
                    )
                )
            else:
                children.append(
                    EffectEnvelope(replay_key=replay_key, kind=EffectKind.AWAIT_EVENT, name=value)
                )
        return EffectGroup(
            key=key, wake=shape.wake, disposition=shape.disposition, children=children
        )

    async def may_wait(self, handle: Any) -> bool:
        """Whether an await of ``handle`` may rightly wait: a well-formed handle on an
        open group whose next rank no child can settle now (event waits)."""
        try:
            if require_handle(handle).consumed >= handle.child_count:
                return False
            order = await self.bench.host.settlement_order(handle.group_key)
        except EffectHostError:
            return False
        return len(order) <= handle.consumed

    async def step(self, step: tuple[Any, ...]) -> None:
        host = self.bench.host
        action = step[0]
        if action == "open":
            _, at, shape = step
            group = self.group(at, shape)
            handle = await _bounded(host.open_effect_group(group))
            self.own[at] = handle
        elif action == "open-hostile":
            await _bounded(host.open_effect_group(step[1]))
        elif action == "await":
            _, at, spec = step
            handle = self.handle(at, spec)
            if await self.may_wait(handle):
                try:
                    async with asyncio.timeout(PENDING):
                        await host.await_next_settlement(handle)
                except TimeoutError:
                    pass
                return
            await _bounded(host.await_next_settlement(handle))
        elif action == "close":
            _, at, spec, disposition = step
            await _bounded(host.close_effect_group(self.handle(at, spec), disposition))
        elif action == "event":
            _, where, name, payload = step
            await _bounded(host.deliver_event(self.key(where), name, payload))
        elif action == "order":
            await _bounded(host.settlement_order(self.key(step[1])))
        else:
            await _bounded(host.open_group_keys())

    async def run(self, program: list[tuple[Any, ...]]) -> None:
        for step in program:
            before = await self.bench.recorded()
            cursors = {at: h.model_dump() for at, h in self.own.items()}
            try:
                await self.step(step)
            except EffectHostError as refused:
                assert await self.bench.recorded() == before, (step[0], refused)
                assert {at: h.model_dump() for at, h in self.own.items()} == cursors


def test_every_controller_method_refuses_typed_and_changes_nothing(bench: Bench) -> None:
    """SPEC §7, R-2, R-8, G-26: generated programs of ``open_effect_group``,
    ``await_next_settlement``, ``close_effect_group``, ``deliver_event``,
    ``open_group_keys`` and ``settlement_order`` (hostile keys, values, handles and
    dispositions among them) on SQLite and PostgreSQL: each call returns or raises an
    ``EffectHostError`` within a bounded wait, and a refused call leaves every table, the
    open keys and the caller's cursor as they were."""

    @PROGRAMS
    @given(program=programs)
    # found by this property: the SQL host did not check a handle before using it, nor the
    # key of settlement_order, nor that a group is one
    @example(program=[("await", 0, ("object", None))])
    @example(program=[("await", 0, ("construct", None, 2, "2", WakePolicy.ALL, None))])
    @example(program=[("order", 2**64)])
    @example(program=[("order", "\ud800")])
    @example(program=[("open-hostile", None)])
    def prop(program: list[tuple[Any, ...]]) -> None:
        n = next(bench.numbers)
        example = Example(bench, [f"p:group:{bench.kind}{n}:{s}" for s in range(SLOTS)])
        bench.run(example.run(program))

    prop()
