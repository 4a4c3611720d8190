"""Issue 23 on the SQL tier: the telemetry program on PostgreSQL, and on SQLite after its
first caller was SIGKILLed: the reopening caller's trace holds the group, the children
it (or its drain pass) ran again and their tools' spans."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from otel_support import (
    SPANS_FILE,
    TOOL_SPAN,
    await_ranks,
    child_spans,
    collected,
    expected_shape,
    program_group,
    read_records,
    registry,
    run_program,
    shape,
)
from sql_support import drain_until_settled, running

from effecthost.hosts.sql import (
    PostgresStore,
    SchemaVersionError,
    SqlEffectHost,
    SqliteStore,
    Store,
)
from effecthost.hosts.sql._store import SqlStore

TESTS = Path(__file__).parents[1]
CALLER = str(Path(__file__).with_name("_otel_caller.py"))


@pytest.mark.anyio
async def test_issue23_postgres_gives_the_same_tree(pg_dsn: str, pg_schema: str) -> None:
    """Issue 23: the same program on PostgreSQL yields the same span tree as on memory."""
    with collected() as seen:
        async with running(
            SqlEffectHost(PostgresStore(pg_dsn, schema=pg_schema, pool_size=2), registry)
        ) as (host,):
            assert await run_program(host, "otel:pg:0") == [0, 1, 2]
        spans = seen.finished()
        assert shape(spans, "otel:pg:0") == expected_shape()
        ranks = await_ranks(spans, "otel:pg:0")
        assert sorted(ranks.values()) == [1, 2, 3]
        children = child_spans(spans, "otel:pg:0")
        assert [c.attributes["effecthost.rank"] for c in children] == [ranks[p] for p in range(3)]


@pytest.mark.timeout(120)
def test_issue23_a_sigkilled_callers_reopen_keeps_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: a caller is SIGKILLed while its three children run; a new caller reopens
    the group and drains the dead lease's children. Its trace has one group span, the three
    child spans under it (each marked taken over by the drain) and the tools' spans inside
    them, and an await span per rank."""
    path = tmp_path / "otel.sqlite3"
    key = "otel:sqlite:killed:0"
    killed_spans = tmp_path / "killed-spans.jsonl"
    env = dict(os.environ)
    env[SPANS_FILE] = str(killed_spans)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    _killed_caller(env, "sqlite", str(path), key)
    with collected() as seen:
        assert asyncio.run(_reopen(path, key)) == [0, 1, 2]
        spans = seen.finished(killed_spans)
        points = seen.metric_points()
    assert sum(p.value for p in points["effecthost.drain.passes"]) >= 1
    (taken,) = points["effecthost.children.taken_over"]
    assert (taken.value, taken.attributes["effecthost.action"]) == (3, "resumed")
    drains = [
        s
        for s in spans
        if s.name == "effecthost.drain" and s.attributes["effecthost.drain.resumed"]
    ]
    assert sum(s.attributes["effecthost.drain.resumed"] for s in drains) == 3
    assert shape(spans, key) == expected_shape()
    children = child_spans(spans, key)
    assert [c.attributes["effecthost.attempt"] for c in children] == [2, 2, 2]
    assert all(c.attributes.get("effecthost.child.taken_over") for c in children)
    ranks = await_ranks(spans, key)
    assert [c.attributes["effecthost.rank"] for c in children] == [ranks[p] for p in range(3)]


def _killed_caller(env: dict[str, str], *where: str) -> tuple[int, int]:
    """Run the caller, SIGKILL it once every child runs: its group span's trace id and
    span id."""
    caller = subprocess.Popen(
        [sys.executable, CALLER, *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert caller.stdout is not None
    line = caller.stdout.readline()
    caller.send_signal(signal.SIGKILL)
    _out, err = caller.communicate(timeout=30)
    word, trace_id, span_id = [*line.split(), "", "", ""][:3]
    assert word == "running", err
    return int(trace_id, 16), int(span_id, 16)


def _tests_env(spans: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[SPANS_FILE] = str(spans)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_issue23_a_drain_in_another_process_joins_the_callers_trace(
    tmp_path: Path, request: pytest.FixtureRequest, dialect: str
) -> None:
    """Issue 23: a caller opens a group and is SIGKILLed while its children run; an
    ``effecthost drain`` in another process takes them over. The group's trace context is
    stored with the group, so the drain's child spans carry the caller's trace id with the
    caller's group span as parent (each marked taken over and linked to the drain pass's
    span), and each tool's span sits inside its child's span. The drain learns each child's
    rank at its finalize: the child spans carry it."""
    key = f"otel:{dialect}:drained:0"
    if dialect == "sqlite":
        path = tmp_path / "otel.sqlite3"
        where = ["sqlite", str(path), key]
        cli = ["--sqlite", str(path)]
        make = lambda: SqliteStore(path)  # noqa: E731
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        where = ["postgres", dsn, schema, key]
        cli = ["--postgres", dsn, "--schema", schema]
        make = lambda: PostgresStore(dsn, schema=schema, pool_size=1)  # noqa: E731
    trace_id, group_span = _killed_caller(_tests_env(tmp_path / "caller.jsonl"), *where)
    asyncio.run(_until_abandoned(make(), key))
    drained = tmp_path / "drain-spans.jsonl"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "effecthost.cli", "drain", *cli, "--once"),
            *("--resolver", "otel_support:registry", "--finish-timeout", "60"),
        ],
        env=_tests_env(drained),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    spans = read_records(drained)
    (drain,) = [s for s in spans if s.name == "effecthost.drain"]
    children = child_spans(spans, key)
    assert [c.attributes["effecthost.position"] for c in children] == [0, 1, 2]
    assert sorted(c.attributes["effecthost.rank"] for c in children) == [1, 2, 3]
    for child in children:
        assert (child.trace_id, child.parent_id) == (trace_id, group_span), child
        assert child.attributes["effecthost.child.taken_over"] is True
        assert drain.span_id in child.links
    tools = sorted((s for s in spans if s.name == TOOL_SPAN), key=lambda s: s.attributes["input"])
    assert [(t.trace_id, t.parent_id) for t in tools] == [(trace_id, c.span_id) for c in children]


async def _until_abandoned(store: Store, key: str) -> None:
    """Wait until the killed caller's leases and its claim on the group have expired on
    the database clock (a bounded poll: another process's state, no event to wait on)."""
    await store.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            rows = [r for r in await store.unfinished() if r.group_key == key]
            assert len(rows) == 3
            if all(r.lease_expired and not r.owner_live for r in rows):
                return
            assert time.monotonic() < deadline, "the killed caller's leases never expired"
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()


async def _reopen(path: Path, key: str) -> list[object]:
    async with running(
        SqlEffectHost(SqliteStore(path), registry, lease_ttl=0.6, renew_every=0.1)
    ) as (host,):
        handle = await host.open_effect_group(program_group(key))
        await drain_until_settled(host, key, "the killed caller's children never re-ran")
        values = {}
        while not handle.exhausted:
            settlement = await host.await_next_settlement(handle)
            values[settlement.position] = settlement.outcome.value
        await host.close_effect_group(handle)
        return [values[p] for p in sorted(values)]


@pytest.mark.anyio
async def test_issue23_the_group_row_records_its_callers_trace_context(
    stores: Callable[[], Store],
) -> None:
    """Issue 23: an open records the trace context of the caller's group span on the group
    row (nothing while telemetry is off); a reopen that takes the group over records its
    own caller's, and one without telemetry keeps what was recorded."""
    key = "otel:row:0"
    hosts = [SqlEffectHost(stores(), registry) for _ in range(3)]
    for host in hosts:
        await host.start()
    try:
        await hosts[0].open_effect_group(program_group(key))
        assert await _recorded_context(hosts[0], key) is None
        with collected() as seen:
            await hosts[1].open_effect_group(program_group(key))
            recorded = await _recorded_context(hosts[1], key)
        (group,) = [s for s in seen.finished() if s.name == "effecthost.group"]  # ended by now
        assert recorded is not None
        traceparent = json.loads(recorded)["traceparent"]
        assert traceparent.split("-")[1:3] == [f"{group.trace_id:032x}", f"{group.span_id:016x}"]
        await hosts[2].open_effect_group(program_group(key))
        assert await _recorded_context(hosts[2], key) == recorded
    finally:
        for host in hosts:
            await host.aclose()


async def _recorded_context(host: SqlEffectHost, key: str) -> str | None:
    store = host.store
    assert isinstance(store, SqlStore)
    value = await store._fetchval("SELECT trace_context FROM eh_groups WHERE group_key = ?", key)
    return None if value is None else str(value)


def _upgrade_statements(dialect: str) -> list[str]:
    """The in-place upgrade docs/sql.md gives for ``dialect``, one statement each."""
    text = (TESTS.parent / "docs" / "sql.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sql\n(-- (\w+).*?)```", text, flags=re.S)
    (block,) = [body for body, name in blocks if name == dialect]
    lines = [line for line in block.splitlines() if not line.startswith("--")]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


_V5_OPEN = (
    "eh_open(text, text, text, integer, text, float8, text[], integer[], text[], text[], "
    "text[], text[], boolean[], float8[], text)"
)
_V4_OPEN = (
    "eh_open(text, text, text, integer, text, float8, text[], integer[], text[], text[], "
    "text[], text[], boolean[], float8[])"
)


@pytest.mark.anyio
async def test_issue23_a_version_4_database_upgrades_with_the_documented_statements(
    stores: Callable[[], Store],
) -> None:
    """Issue 23 (schema version 5 adds ``eh_groups.trace_context``): a version-4 database
    is refused, nothing migrated silently; the statements docs/sql.md gives make it a
    version-5 database whose opens record the trace context."""
    made = stores()
    await made.start()
    if isinstance(made, SqliteStore):
        dialect = "SQLite"
        await made.aclose()
        conn = sqlite3.connect(made.path, isolation_level=None)
        conn.execute("ALTER TABLE eh_groups DROP COLUMN trace_context")
        conn.execute("UPDATE eh_schema SET version = 4")
        conn.close()
    else:
        assert isinstance(made, PostgresStore)
        dialect = "PostgreSQL"
        async with made._pool.acquire() as conn:
            await conn.execute("ALTER TABLE eh_groups DROP COLUMN trace_context")
            await conn.execute(f"DROP FUNCTION {_V5_OPEN}")
            # the version-4 function's signature (its body does not matter here)
            await conn.execute(
                f"CREATE FUNCTION {_V4_OPEN} RETURNS float8 LANGUAGE sql AS 'SELECT 0::float8'"
            )
            await conn.execute("UPDATE eh_schema SET version = 4")
        await made.aclose()
    refused = stores()
    with pytest.raises(SchemaVersionError) as raised:
        await refused.start()
    await refused.aclose()
    assert (raised.value.found, raised.value.expected) == (4, 5)
    statements = _upgrade_statements(dialect)
    if isinstance(made, SqliteStore):
        conn = sqlite3.connect(made.path, isolation_level=None)
        for statement in statements:
            conn.execute(statement)
        conn.close()
    else:
        import asyncpg

        conn = await asyncpg.connect(made.dsn)
        try:
            for statement in statements:
                await conn.execute(statement.replace("effecthost.", f"{made.schema}."))
        finally:
            await conn.close()
    async with running(SqlEffectHost(stores(), registry)) as (host,):
        with collected():
            assert await run_program(host, "otel:upgraded:0") == [0, 1, 2]
            handle = await host.open_effect_group(program_group("otel:upgraded:1"))
            assert await _recorded_context(host, "otel:upgraded:1") is not None
            await host.close_effect_group(handle)
