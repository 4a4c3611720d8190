"""A payload store in PostgreSQL (extra ``postgres``: asyncpg, loaded lazily).

For hosts whose records live elsewhere (the Restate and Temporal tiers): outcomes above the
inline threshold go to one table, ``eh_payload_store``, in a schema of their own. The SQL
tier does not need it (its payload table lives in its own database, next to the rank
records).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from ._store import PayloadRef, PayloadStore, _check, _make_ref, _missing

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")

TABLE = "eh_payload_store"

DDL = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    group_key  text NOT NULL,
    name       text NOT NULL,
    replay_key text NOT NULL,
    data       bytea NOT NULL,
    size       bigint NOT NULL,
    digest     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_key, name)
)"""


class PostgresPayloadStore(PayloadStore):
    """Payload bytes in PostgreSQL: one row per payload (group key, name, replay key,
    bytes, size, sha256 digest) in ``schema.eh_payload_store``. The schema and table are
    created on first use (under an advisory lock, so processes sharing the database may
    start together). Each ``put`` is its own committed transaction; ``delete_group``
    deletes the group's rows in one statement.

    Give every process of a deployment (the endpoint or worker that encodes outcomes and
    every controller that decodes them) the same ``dsn`` and ``schema``. Call
    :meth:`aclose` when done.

    Args:
        dsn: a PostgreSQL connection string.
        schema: the schema of the table (``[a-z_][a-z0-9_]*``, created when missing).
        pool_size: the largest number of connections the store opens.

    Raises:
        ValueError: an invalid schema name.
        MissingExtra: on first use, when asyncpg is not installed.
    """

    def __init__(
        self, dsn: str, *, schema: str = "effecthost_payloads", pool_size: int = 4
    ) -> None:
        if not _IDENT.match(schema):
            raise ValueError(f"schema name {schema!r} must match {_IDENT.pattern}")
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self._pool: Any = None
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:  # no DSN: it may carry a password
        return f"PostgresPayloadStore(schema={self.schema!r})"

    async def start(self) -> None:
        """Connect and create the schema and table when missing (idempotent; also done on
        first use).

        Raises:
            MissingExtra: asyncpg is not installed (``pip install 'effecthost[postgres]'``).
        """
        if self._pool is not None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._pool is not None:
                return
            from effecthost.hosts import require

            (asyncpg,) = require("postgres", "postgres", "asyncpg")
            admin = await asyncpg.connect(self.dsn)
            try:
                async with admin.transaction():
                    await admin.execute(
                        "SELECT pg_advisory_xact_lock(hashtext($1))", f"{self.schema}.{TABLE}"
                    )
                    await admin.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
                    await admin.execute(f"SET LOCAL search_path = {self.schema}")
                    await admin.execute(DDL)
            finally:
                await admin.close()
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                server_settings={"search_path": self.schema, "application_name": "effecthost"},
            )

    async def aclose(self) -> None:
        """Close the connections (idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), 5)
            except Exception:
                pool.terminate()

    async def _ready(self) -> Any:
        if self._pool is None:
            await self.start()
        return self._pool

    async def put(self, group_key: str, replay_key: str, data: bytes) -> PayloadRef:
        ref = _make_ref(group_key, replay_key, bytes(data))
        pool = await self._ready()
        await pool.execute(
            f"INSERT INTO {TABLE} (group_key, name, replay_key, data, size, digest) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            group_key,
            ref.name,
            replay_key,
            bytes(data),
            ref.size,
            ref.digest,
        )
        return ref

    async def get(self, ref: PayloadRef) -> bytes:
        """Raises:
        PayloadMissing: no row under ``ref``, or not the bytes it names.
        """
        pool = await self._ready()
        data = await pool.fetchval(
            f"SELECT data FROM {TABLE} WHERE group_key = $1 AND name = $2",
            ref.group_key,
            ref.name,
        )
        if data is None:
            raise _missing(ref, "is not in the payload store")
        return _check(ref, bytes(data))

    async def delete_group(self, group_key: str) -> None:
        pool = await self._ready()
        await pool.execute(f"DELETE FROM {TABLE} WHERE group_key = $1", group_key)

    async def group_keys(self) -> list[str]:
        """The group keys with stored payloads (for tests and inspection)."""
        pool = await self._ready()
        rows = await pool.fetch(f"SELECT DISTINCT group_key FROM {TABLE} ORDER BY group_key")
        return [str(r[0]) for r in rows]
