"""Fixtures of the SQL tier tests: one throwaway PostgreSQL server for the whole test run
(started on first use, stopped at the end), or the server named by
``EFFECTHOST_POSTGRES_DSN``; a fresh schema per test."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sql_support import Substrate

from effecthost.hosts.sql import PostgresStore, SqliteStore, Store
from effecthost.hosts.sql.testing import PostgresServer, find_pg_bin, postgres_sql, sqlite_sql

_server: PostgresServer | None = None


def pytest_unconfigure(config: pytest.Config) -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None


@pytest.fixture
def pg_dsn() -> str:
    global _server
    dsn = os.environ.get("EFFECTHOST_POSTGRES_DSN")
    if dsn:
        return dsn
    if _server is None:
        if find_pg_bin("initdb") is None:
            pytest.fail("PostgreSQL binaries not found: run scripts/install-sql.sh")
        server = PostgresServer()
        server.start()
        _server = server
    return _server.dsn


@pytest.fixture
def pg_schema() -> str:
    return f"ehtest_{secrets.token_hex(4)}"


@pytest.fixture
def pg_log(pg_dsn: str) -> Path | None:
    """The test server's log file, or ``None`` when ``EFFECTHOST_POSTGRES_DSN`` names a
    server of someone else's."""
    if os.environ.get("EFFECTHOST_POSTGRES_DSN") or _server is None or _server.dir is None:
        return None
    return Path(_server.dir) / "postgres.log"


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str) -> Callable[[], Store]:
    """A maker of stores on one database: a SQLite file, or a fresh PostgreSQL schema;
    each call a new store (its own connections, as a second process has)."""
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "store.sqlite3")
    dsn = request.getfixturevalue("pg_dsn")
    return lambda: PostgresStore(dsn, schema=pg_schema)


@pytest.fixture
async def store(stores: Callable[[], Store]) -> AsyncIterator[Store]:
    """One started store of ``stores``."""
    made = stores()
    await made.start()
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture(params=["sqlite", "postgres"])
def substrate(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str) -> Substrate:
    """A SQLite file or a fresh PostgreSQL schema, with a maker of stores on it and its
    raw SQL."""
    if request.param == "sqlite":
        path = tmp_path / "substrate.sqlite3"
        return Substrate("sqlite", lambda: SqliteStore(path), sqlite_sql(path), path)
    dsn = request.getfixturevalue("pg_dsn")
    return Substrate(
        "postgres",
        lambda: PostgresStore(dsn, schema=pg_schema, pool_size=2),
        postgres_sql(dsn, pg_schema),
    )
