"""The SQL tier: SQLite (the embedded default) and PostgreSQL, one design (SPEC §3).

``sqlite_host(path, resolver)`` needs nothing beyond the standard library;
``postgres_host(dsn, resolver)`` needs the ``postgres`` extra (asyncpg), loaded only when a
PostgreSQL store starts, so a missing extra fails with an install hint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from effecthost.contract import GroupExecutors

from ._host import (
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_RENEW_EVERY,
    SqlDrain,
    SqlEffectHost,
)
from ._postgres import PostgresStore
from ._preflight import DatabaseProblem, DatabaseRefused, check_sqlite_file
from ._sealing import SealedDeployment
from ._sqlite import SqliteStore
from ._store import SCHEMA_VERSION, OpenGroup, SchemaVersionError, Store


async def sqlite_host(
    path: str | Path, resolver: GroupExecutors | None = None, **options: Any
) -> SqlEffectHost:
    """A started host over the SQLite file ``path`` (created when missing or empty).

    ``options`` go to :class:`SqlEffectHost` (``lease_ttl``, ``renew_every``…), except
    ``busy_timeout`` which goes to the store.

    Raises:
        DatabaseRefused: ``path`` is not a file, not SQLite, or another application's
            database; the file is left as it was.
        SchemaVersionError: the file records another schema version.
    """
    store = SqliteStore(path, busy_timeout=options.pop("busy_timeout", 30.0))
    host = SqlEffectHost(store, resolver, **options)
    await host.start()
    return host


async def postgres_host(
    dsn: str,
    resolver: GroupExecutors | None = None,
    *,
    schema: str = "effecthost",
    **options: Any,
) -> SqlEffectHost:
    """A started host over the PostgreSQL database at ``dsn``, tables in ``schema``.

    Raises:
        MissingExtra: asyncpg is not installed (``pip install 'effecthost[postgres]'``).
        DatabaseRefused: ``schema`` holds another application's objects.
        SchemaVersionError: the schema records another schema version.
    """
    store = PostgresStore(dsn, schema=schema, pool_size=options.pop("pool_size", 8))
    host = SqlEffectHost(store, resolver, **options)
    await host.start()
    return host


__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_RENEW_EVERY",
    "SCHEMA_VERSION",
    "DatabaseProblem",
    "DatabaseRefused",
    "OpenGroup",
    "PostgresStore",
    "SchemaVersionError",
    "SealedDeployment",
    "SqlDrain",
    "SqlEffectHost",
    "SqliteStore",
    "Store",
    "check_sqlite_file",
    "postgres_host",
    "sqlite_host",
]
