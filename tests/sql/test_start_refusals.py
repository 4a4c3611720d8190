"""A store that may create its database (the library's default path: ``sqlite_host``,
``SqliteStore(create=True)``, ``PostgresStore.start()``) refuses a database that is not its
own, or of another schema version, with a typed error naming it, and changes nothing in
it (SPEC §7: bad input changes nothing recorded). A new, empty or missing one is still
created."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from sql_support import running

from effecthost.hosts.sql import (
    SCHEMA_VERSION,
    DatabaseProblem,
    DatabaseRefused,
    PostgresStore,
    SchemaVersionError,
    SqliteStore,
    sqlite_host,
)

pytestmark = pytest.mark.anyio


def _snapshot(path: Path) -> tuple[str, list[str]]:
    """The file's bytes and what lies beside it (no journal or WAL left behind)."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()


async def _version_99(path: Path) -> None:
    store = SqliteStore(path)
    await store.start()
    await store.aclose()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")  # as a copy or another release may leave it
    conn.execute("UPDATE eh_schema SET version = 99")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("kind", ["foreign", "version-99", "random-bytes", "directory"])
async def test_sqlite_default_start_refuses_what_it_does_not_own_and_changes_nothing(
    tmp_path: Path, kind: str
) -> None:
    """SPEC §7 (bad input changes nothing recorded): ``sqlite_host(path)`` on another
    application's SQLite file, a database of schema version 99, random bytes or a
    directory raises a typed refusal naming the path, before ``journal_mode=WAL`` or any
    ``CREATE`` touches it: the file stays byte-identical and nothing is left beside it."""
    path = tmp_path / "db.sqlite3"
    if kind == "foreign":
        _foreign(path)
    elif kind == "version-99":
        await _version_99(path)
    elif kind == "random-bytes":
        path.write_bytes(os.urandom(8192))
    else:
        path.mkdir()
        (path / "inside").write_text("x")
    before = _snapshot(path / "inside" if kind == "directory" else path)

    with pytest.raises((DatabaseRefused, SchemaVersionError)) as raised:
        await sqlite_host(path)

    assert str(path) in str(raised.value)
    if kind == "version-99":
        assert isinstance(raised.value, SchemaVersionError)
        assert (raised.value.found, raised.value.expected) == (99, SCHEMA_VERSION)
    else:
        assert isinstance(raised.value, DatabaseRefused)
        expected = {
            "foreign": DatabaseProblem.FOREIGN,
            "random-bytes": DatabaseProblem.NOT_SQLITE,
            "directory": DatabaseProblem.NOT_A_FILE,
        }[kind]
        assert raised.value.problem is expected
    assert _snapshot(path / "inside" if kind == "directory" else path) == before


@pytest.mark.parametrize("kind", ["missing", "empty-file", "sqlite-without-tables"])
async def test_sqlite_default_start_still_creates_a_new_database(tmp_path: Path, kind: str) -> None:
    """The refusals above leave the default path as it was for a database that is new:
    a missing path, an empty file, a SQLite file with no tables get this release's
    schema."""
    path = tmp_path / "db.sqlite3"
    if kind == "empty-file":
        path.write_bytes(b"")
    elif kind == "sqlite-without-tables":
        sqlite3.connect(path).execute("PRAGMA user_version = 0").connection.close()
    store = SqliteStore(path)
    await store.start()
    await store.aclose()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT max(version) FROM eh_schema").fetchone()[0] == SCHEMA_VERSION
    conn.close()


async def _pg_snapshot(dsn: str, schema: str) -> Any:
    """Every object in ``schema`` (with its row version: an ``ALTER`` shows) and every
    table's rows."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        ns = await conn.fetchval("SELECT oid FROM pg_namespace WHERE nspname = $1", schema)
        rels = await conn.fetch(
            "SELECT relname, relkind, xmin::text FROM pg_class WHERE relnamespace = $1 "
            "ORDER BY relname",
            ns,
        )
        procs = await conn.fetch(
            "SELECT proname, xmin::text, prosrc FROM pg_proc WHERE pronamespace = $1 "
            "ORDER BY proname",
            ns,
        )
        rows = {}
        for rel in rels:
            if rel["relkind"] == "r":
                rows[rel["relname"]] = await conn.fetchval(
                    f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
                    f'FROM {schema}."{rel["relname"]}" t'
                )
        return ns, [tuple(r) for r in rels], [tuple(p) for p in procs], rows
    finally:
        await conn.close()


async def test_postgres_start_refuses_another_applications_schema_and_changes_nothing(
    pg_dsn: str, pg_schema: str
) -> None:
    """SPEC §7: ``PostgresStore.start()`` on a schema that holds another application's
    tables (no ``eh_schema``) raises ``DatabaseRefused`` (foreign) naming the schema and
    creates no table, index or function in it."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {pg_schema}")
        await conn.execute(f"CREATE TABLE {pg_schema}.users (id serial PRIMARY KEY, name text)")
        await conn.execute(f"INSERT INTO {pg_schema}.users (name) VALUES ('ada')")
    finally:
        await conn.close()
    before = await _pg_snapshot(pg_dsn, pg_schema)

    with pytest.raises(DatabaseRefused) as raised:
        await PostgresStore(pg_dsn, schema=pg_schema).start()

    assert raised.value.problem is DatabaseProblem.FOREIGN
    assert pg_schema in str(raised.value)
    assert await _pg_snapshot(pg_dsn, pg_schema) == before


async def test_postgres_start_refuses_another_schema_version_and_changes_nothing(
    pg_dsn: str, pg_schema: str
) -> None:
    """SPEC §7: ``PostgresStore.start()`` on a schema of effecthost schema version 99 that
    also holds another table raises ``SchemaVersionError`` naming the schema, and leaves
    every object and row as it was (no function replaced, nothing created)."""
    store = PostgresStore(pg_dsn, schema=pg_schema)
    await store.start()
    await store._pool.execute("UPDATE eh_schema SET version = 99")
    await store._pool.execute("CREATE TABLE other_app (id int)")
    await store.aclose()
    before = await _pg_snapshot(pg_dsn, pg_schema)

    with pytest.raises(SchemaVersionError) as raised:
        await PostgresStore(pg_dsn, schema=pg_schema).start()

    assert (raised.value.found, raised.value.expected) == (99, SCHEMA_VERSION)
    assert pg_schema in str(raised.value)
    assert await _pg_snapshot(pg_dsn, pg_schema) == before


async def test_postgres_start_still_creates_into_an_empty_schema(
    pg_dsn: str, pg_schema: str
) -> None:
    """A schema that exists but holds nothing is new: the store creates its tables there."""
    import asyncpg

    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {pg_schema}")
    finally:
        await conn.close()
    async with running(PostgresStore(pg_dsn, schema=pg_schema)) as (store,):
        assert await store._pool.fetchval("SELECT max(version) FROM eh_schema") == SCHEMA_VERSION


async def test_postgres_start_shares_a_schema_with_a_payload_store(
    pg_dsn: str, pg_schema: str
) -> None:
    """A payload store's ``eh_payload_store`` made first is effecthost's own, not another
    application's: the host store still creates its tables beside it."""
    from effecthost.payloads import PostgresPayloadStore

    payloads = PostgresPayloadStore(pg_dsn, schema=pg_schema)
    await payloads._ready()
    store = PostgresStore(pg_dsn, schema=pg_schema)
    async with aclosing(payloads), aclosing(store):
        await store.start()
        assert await store._pool.fetchval("SELECT max(version) FROM eh_schema") == SCHEMA_VERSION


_WRITER = """
import sqlite3, sys
blob = b"x" * 30000
sys.stdout.write("ready\\n"); sys.stdout.flush()
n = 0
while True:
    n += 1
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO eh_payloads (group_key, name, replay_key, data, digest, created_at) "
        "VALUES (?, ?, ?, ?, ?, 0)",
        (f"g{n}", "o", f"r{n}", blob, "d"),
    )
    conn.execute("DELETE FROM eh_payloads WHERE group_key <> ?", (f"g{n}",))
    conn.execute("COMMIT")
    conn.close()  # the last connection: checkpoints and removes the -wal and -shm files
"""


async def test_starting_beside_a_live_writer_is_not_a_refusal(tmp_path: Path) -> None:
    """SPEC §3 (many processes share one SQLite file) and §7: the start-up check that
    refuses files the store does not own must not refuse its own database while another
    process writes it (connections opening and closing: WAL files created, checkpointed
    and removed). The conformance
    factories start hosts this way beside a live deployment process."""
    import subprocess
    import sys

    path = tmp_path / "shared.sqlite3"
    first = SqliteStore(str(path))
    await first.start()
    await first.aclose()
    writer = subprocess.Popen(  # noqa: ASYNC220 - started once, before the loop
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        for _ in range(60):
            store = SqliteStore(str(path))
            await store.start()
            await store.aclose()
    finally:
        writer.kill()
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()


async def test_the_start_check_opens_the_database_only_through_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC §3 (hosts share one SQLite file; the conformance deployment process runs
    several stores on it): closing any descriptor of a database file drops every POSIX
    lock the process holds on it, SQLite's included, so another process can then reset
    the WAL under a live connection (seen as SQLITE_IOERR_SHORT_READ when a second store
    started). A store starting beside another in one process must read the file only
    through SQLite."""
    import builtins

    from effecthost.hosts.sql import _preflight

    path = tmp_path / "shared.sqlite3"
    first = SqliteStore(str(path))
    await first.start()
    opened: list[str] = []
    real_open = builtins.open

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    try:
        _preflight.check_creatable_sqlite_file(path, lock_timeout=1.0)
    finally:
        monkeypatch.setattr(builtins, "open", real_open)
        await first.aclose()
    assert str(path) not in opened


def test_an_older_schema_is_told_how_to_upgrade_and_a_newer_one_to_upgrade_the_library() -> None:
    """A database from an older release is refused with the way forward for it (drain it
    with that release, or the documented in-place upgrade), not "upgrade effecthost"."""
    older = SchemaVersionError(4, 5, where="effects.sqlite3")
    assert (older.found, older.expected, older.where) == (4, 5, "effects.sqlite3")
    assert "in place" in str(older) and "upgrade effecthost" not in str(older)
    newer = SchemaVersionError(6, 5)
    assert "upgrade effecthost" in str(newer)
