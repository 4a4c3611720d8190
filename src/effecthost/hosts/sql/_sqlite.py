"""The SQLite substrate: the embedded default (standard library ``sqlite3``).

Every transaction is short and serial in this process: WAL journal, ``BEGIN IMMEDIATE``
(the write lock is taken up front, so two writers never deadlock on a lock upgrade),
``synchronous=NORMAL`` and a long busy timeout for other processes sharing the file.
SQLite has no row locks; ``BEGIN IMMEDIATE`` serialises writers, so a claim is a
conditional ``UPDATE … RETURNING`` and the finalize is the same statement sequence as on
PostgreSQL.

An operation runs on the calling (event-loop) thread through a connection that never
waits for a lock (a statement takes microseconds; a hop to another thread costs more than
the work). When another process holds the write lock (``SQLITE_BUSY``, the transaction
rolled back with nothing written), the operation is run again on a dedicated thread
through a second connection that waits up to the busy timeout, as every operation did
before; until that thread is idle again, later operations queue behind it in order.

Writes of several tasks that meet in one event-loop iteration share one transaction, each
under its own savepoint (group commit, :meth:`SqliteStore._write`): a commit is most of a
small write's cost.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ._preflight import check_creatable_sqlite_file, check_sqlite_file, read_only_uri
from ._store import (
    CHILDREN,
    CREATE_GROUP,
    GET_GROUP,
    LOOKUP,
    OWN,
    SCHEMA_VERSION,
    ChildRow,
    ChildSpec,
    Claim,
    Closed,
    Decide,
    Expected,
    Finalize,
    GroupRow,
    Opened,
    OpenRequest,
    Renewal,
    ReplayKeyTaken,
    SchemaVersionError,
    Sent,
    SqlStore,
    _mark,
    child_row,
    group_row,
    looked_up,
    tables,
)

T = TypeVar("T")
_Write = tuple[
    Callable[[sqlite3.Connection], Any], Callable[[Any], None] | None, "asyncio.Future[Any]"
]

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""The database clock in epoch seconds (millisecond resolution)."""

DDL = tables(
    text="TEXT", int="INTEGER", big="INTEGER", real="REAL", bool="INTEGER", false="0", blob="BLOB"
)

_INSERT_CHUNK = 256  # rows per INSERT (15 parameters each, under SQLite's limit)


@functools.cache
def _insert_children_sql(rows: int) -> str:
    """One multi-row ``INSERT`` of ``rows`` children; ``RETURNING`` names those inserted
    (a row another process inserted first is left as it is)."""
    row = (
        f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, CASE WHEN ? THEN {NOW} + ? END, ?, "
        f"CASE WHEN ? IS NOT NULL THEN {NOW} + ? END)"
    )
    return (
        "INSERT INTO eh_children (replay_key, group_key, position, kind, name, envelope, "
        "envelope_hash, state, lease_owner, fence, lease_expires, attempt, due_at) VALUES "
        + ", ".join([row] * rows)
        + " ON CONFLICT DO NOTHING RETURNING replay_key"
    )


@functools.cache
def _sql(text: str) -> str:
    """Shared SQL (:mod:`._store`) in SQLite's words."""
    # a corrupted outcome may not be UTF-8: read as bytes, decoded by _outcome
    return text.replace("{now}", NOW).replace("{outcome}", "CAST(c.outcome AS BLOB)")


def _busy(exc: sqlite3.OperationalError) -> bool:
    """``SQLITE_BUSY`` (any extended code): another connection holds the lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF == sqlite3.SQLITE_BUSY)
    return "database is locked" in str(exc)


class SqliteStore(SqlStore):
    """SQLite file store. ``busy_timeout`` is in seconds. ``change_poll`` is how often (in
    seconds) a host with a parked waiter checks whether another process committed (SQLite
    cannot notify); ``None`` leaves such a waiter to its poll bound alone."""

    input_errors = (
        UnicodeEncodeError,
        OverflowError,
        sqlite3.DataError,
        sqlite3.InterfaceError,
    )
    driver_errors = (sqlite3.Error, OSError)

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 30.0,
        fault: Callable[[str], None] | None = None,
        create: bool = True,
        read_only: bool = False,
        change_poll: float | None = 0.01,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.change_poll = change_poll
        self.create = create and not read_only
        self.read_only = read_only
        self.fault = fault
        self._pool: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # waits up to busy_timeout (the thread)
        self._inline_conn: sqlite3.Connection | None = None  # never waits (this thread)
        self._last: Future[Any] | None = None  # the operation last handed to the thread
        self.open_at_finalize: set[str] = set()
        self._tick_writer: asyncio.Task[Any] | None = None  # first writer of this iteration
        self._contended = False  # writes of several tasks meet: every write waits a tick
        self._batch: list[_Write] = []  # writes waiting for the next iteration

    # -- plumbing -----------------------------------------------------------------------

    def _prepare(self, sql: str) -> str:
        return _sql(sql)

    def _outcome(self, value: Any) -> str | bytes:
        return _outcome_text(value)  # type: ignore[no-any-return]

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        text = _sql(sql)
        return await self._run(lambda c: c.execute(text, args).fetchall())

    async def _fetchrow(self, sql: str, *args: Any) -> Any | None:
        text = _sql(sql)
        return await self._run(lambda c: c.execute(text, args).fetchone())

    async def _execute(self, sql: str, *args: Any) -> int:
        text = _sql(sql)
        return await self._write(lambda c: c.execute(text, args).rowcount)

    async def _snapshot(self, *reads: tuple[str, tuple[Any, ...]]) -> list[list[Any]]:
        return await self._run(lambda c: [c.execute(_sql(q), a).fetchall() for q, a in reads])

    def _inline(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        """Run ``fn`` here unless the writer thread has work queued or another process
        holds the write lock (``SQLITE_BUSY``: rolled back, nothing written); then
        ``(False, None)`` and the caller hands ``fn`` to :meth:`_thread`."""
        assert self._inline_conn is not None, "store not started"
        last = self._last
        if last is not None and not last.done():
            return False, None  # keep the order of what waits on the thread
        try:
            return True, fn(self._inline_conn)
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
            if self._inline_conn.in_transaction:  # never left holding the lock
                self._inline_conn.execute("ROLLBACK")
            return False, None

    def _thread(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Run ``fn`` on the writer thread, which waits up to the busy timeout."""
        assert self._pool is not None and self._conn is not None, "store not started"
        future = self._pool.submit(fn, self._conn)
        self._last = future
        return future

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        ran, result = self._inline(fn)
        if ran:
            return result  # type: ignore[return-value]
        return await asyncio.wrap_future(self._thread(fn))

    async def _write(
        self,
        body: Callable[[sqlite3.Connection], T],
        after: Callable[[T], None] | None = None,
    ) -> T:
        """Run ``body`` in a write transaction, then ``after`` with its result once it
        has committed.

        Group commit: while one task writes, each write runs at once in its own
        transaction. Once writes of two tasks meet in one event-loop iteration, writes
        wait for the next iteration and go together, one transaction for all of them,
        each ``body`` under its own savepoint (a body that raises is rolled back alone
        and its caller gets the error), until an iteration brings a lone write. One
        caller therefore pays nothing for it; many callers share commits. A caller
        learns of its write only after the commit."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if self._tick_writer is None:
            self._tick_writer = task
            loop.call_soon(self._new_tick)
        elif self._tick_writer is not task:
            self._contended = True
        if not self._contended:
            result = await self._run(lambda c: self._tx(c, body))
            if after is not None:
                after(result)
            return result
        future: asyncio.Future[Any] = loop.create_future()
        self._batch.append((body, after, future))
        if len(self._batch) == 1:
            loop.call_soon(self._flush_batch)
        return await future  # type: ignore[no-any-return]

    def _new_tick(self) -> None:
        self._tick_writer = None

    def _flush_batch(self) -> None:
        batch = [entry for entry in self._batch if not entry[2].cancelled()]
        self._batch = []
        self._contended = len(batch) > 1  # a lone write: back to writing at once
        if not batch:
            return
        try:
            ran, results = self._inline(lambda c: self._many(c, batch))
        except BaseException as exc:
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if ran:
            assert results is not None
            self._deliver(batch, results)
            return
        # another process holds the write lock: the batch waits for it on the thread
        future = self._thread(lambda c: self._many(c, batch))
        loop = asyncio.get_running_loop()

        def done(f: Future[list[tuple[bool, Any]]]) -> None:
            exc = f.exception()
            if exc is not None:
                self._fail(batch, exc)
            else:
                self._deliver(batch, f.result())

        future.add_done_callback(lambda f: loop.call_soon_threadsafe(done, f))

    def _many(self, c: sqlite3.Connection, batch: list[_Write]) -> list[tuple[bool, Any]]:
        """One transaction for a batch of writes, a savepoint each."""

        def body(c: sqlite3.Connection) -> list[tuple[bool, Any]]:
            results: list[tuple[bool, Any]] = []
            for write, _after, _future in batch:
                c.execute("SAVEPOINT eh_write")
                try:
                    results.append((True, write(c)))
                except Exception as exc:
                    c.execute("ROLLBACK TO eh_write")
                    results.append((False, exc))
                c.execute("RELEASE eh_write")
            return results

        return self._tx(c, body)

    @staticmethod
    def _deliver(batch: list[_Write], results: list[tuple[bool, Any]]) -> None:
        for (_write, after, future), (ok, value) in zip(batch, results, strict=True):
            if ok and after is not None:
                try:
                    after(value)
                except Exception as exc:  # that caller's, as on the unbatched path
                    ok, value = False, exc
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    @staticmethod
    def _fail(batch: list[_Write], exc: BaseException) -> None:
        for _write, _after, future in batch:
            if not future.done():
                future.set_exception(exc)

    def _fault(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

    @staticmethod
    def _tx(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def start(self) -> None:
        """Connect; create the schema in a new file, or check the version.

        The file is checked first and nothing is created or changed when it is refused:
        with ``create=True`` (:func:`check_creatable_sqlite_file`) only a new file (missing,
        empty, no tables) or this release's database is accepted; with ``create=False`` or
        ``read_only=True`` (:func:`check_sqlite_file`) only this release's database;
        ``read_only`` connects with ``mode=ro`` (no write lock, no journal-mode change) and
        allows only reads.

        Raises:
            DatabaseRefused: not a usable database (not a file, not SQLite, another
                application's; with ``create=False`` or ``read_only`` also missing or empty).
            SchemaVersionError: the file records another schema version.
        """
        loop = asyncio.get_running_loop()
        if not self.create:
            check = functools.partial(
                check_sqlite_file,
                self.path,
                write=not self.read_only,
                lock_timeout=self.busy_timeout,
            )
        else:
            check = functools.partial(
                check_creatable_sqlite_file, self.path, lock_timeout=self.busy_timeout
            )
        await loop.run_in_executor(None, check)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="effecthost-sqlite")
        target, uri = (
            (read_only_uri(self.path), True) if self.read_only else (str(self.path), False)
        )

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(
                target,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=uri,
            )
            if self.read_only:
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                return conn
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            return conn

        try:
            self._conn = await loop.run_in_executor(self._pool, connect)
        except BaseException:
            self._pool.shutdown(wait=False)  # a start tried again makes its own
            raise
        try:
            if not self.read_only:
                await loop.run_in_executor(self._pool, self._schema, self._conn)
            inline = sqlite3.connect(
                target, timeout=0, isolation_level=None, check_same_thread=False, uri=uri
            )
            if not self.read_only:
                inline.execute("PRAGMA synchronous=NORMAL")  # per connection, as the other's
            inline.execute("PRAGMA busy_timeout=0")
            self._inline_conn = inline
        except BaseException:
            await self.aclose()
            raise

    def _schema(self, conn: sqlite3.Connection) -> None:
        def body(c: sqlite3.Connection) -> None:
            c.execute("CREATE TABLE IF NOT EXISTS eh_schema (version INTEGER NOT NULL)")
            row = c.execute("SELECT max(version) FROM eh_schema").fetchone()
            if row[0] is None:
                for statement in DDL:
                    c.execute(statement)
                c.execute("INSERT INTO eh_schema (version) VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise SchemaVersionError(int(row[0]))

        self._tx(conn, body)

    async def aclose(self) -> None:
        pool, conn, inline = self._pool, self._conn, self._inline_conn
        self._pool = self._conn = self._inline_conn = None
        self._last = None
        if pool is None:
            return
        if conn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(pool, conn.close)
        pool.shutdown(wait=True)
        if inline is not None:
            inline.close()

    # -- reads --------------------------------------------------------------------------

    def commit_marker(self) -> int | None:
        """``PRAGMA data_version`` of this thread's connection: it changes when any other
        connection (another process, or this store's waiting connection) commits, and
        reads only the shared-memory index of the WAL."""
        conn = self._inline_conn
        if conn is None:
            return None
        try:
            return int(conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.OperationalError:
            return None  # cannot tell now: the caller treats it as a change

    @staticmethod
    def _children(c: sqlite3.Connection, group_key: str) -> list[ChildRow]:
        return [child_row(r) for r in c.execute(_sql(CHILDREN), (group_key,)).fetchall()]

    # -- writes -------------------------------------------------------------------------

    async def _create(self, r: OpenRequest) -> tuple[bool, GroupRow]:
        return await self._write(lambda c: self._create_body(c, r))

    @staticmethod
    def _create_body(c: sqlite3.Connection, r: OpenRequest) -> tuple[bool, GroupRow]:
        row = c.execute(_sql(CREATE_GROUP), r.create_values).fetchone()
        if row is not None:
            return True, group_row(row)
        return False, group_row(c.execute(GET_GROUP, (r.group_key,)).fetchone())

    @staticmethod
    def _own_body(
        c: sqlite3.Connection,
        group_key: str,
        owner: str | None,
        ttl: float,
        trace_context: str | None = None,
    ) -> bool:
        return c.execute(_sql(OWN), (owner, ttl, trace_context, group_key)).rowcount == 1

    @staticmethod
    def _insert_children(
        c: sqlite3.Connection, group_key: str, specs: list[ChildSpec], owner: str | None, ttl: float
    ) -> list[str]:
        inserted: list[str] = []
        for start in range(0, len(specs), _INSERT_CHUNK):
            chunk = specs[start : start + _INSERT_CHUNK]
            params: list[Any] = []
            for s in chunk:
                params += (
                    s.replay_key,
                    group_key,
                    s.position,
                    s.kind,
                    s.name,
                    s.envelope,
                    s.envelope_hash,
                    "claimed" if s.claim else "pending",
                    owner if s.claim else None,
                    1 if s.claim else 0,
                    s.claim,
                    ttl,
                    1 if s.claim else 0,
                    s.sleep_seconds,
                    s.sleep_seconds,
                )
            rows = c.execute(_insert_children_sql(len(chunk)), params).fetchall()
            inserted += [r[0] for r in rows]
        return inserted

    async def insert_children(
        self, group_key: str, specs: list[ChildSpec], owner: str, ttl: float
    ) -> list[str]:
        return await self._write(lambda c: self._insert_children(c, group_key, specs, owner, ttl))

    @staticmethod
    def _taken(c: sqlite3.Connection, group_key: str, specs: list[ChildSpec]) -> None:
        """Refuse the first child (by position) whose replay key another group holds."""
        held: dict[str, str] = {}
        for start in range(0, len(specs), _INSERT_CHUNK):
            keys = [s.replay_key for s in specs[start : start + _INSERT_CHUNK]]
            held.update(
                c.execute(
                    "SELECT replay_key, group_key FROM eh_children WHERE group_key <> ? "
                    f"AND replay_key IN ({', '.join('?' * len(keys))})",
                    (group_key, *keys),
                ).fetchall()
            )
        for spec in specs:
            if spec.replay_key in held:
                raise ReplayKeyTaken(spec.replay_key, spec.position, held[spec.replay_key])

    @staticmethod
    def _claim_sql(c: sqlite3.Connection, replay_key: str, owner: str, ttl: float) -> Any:
        return c.execute(
            f"UPDATE eh_children SET lease_owner = ?, fence = fence + 1, "
            f"lease_expires = {NOW} + ?, attempt = attempt + 1, state = 'claimed' "
            "WHERE replay_key = ? AND state <> 'settled' "
            f"AND (lease_owner IS NULL OR lease_expires < {NOW}) "
            "RETURNING fence, attempt, cancel_requested, lease_expires",
            (owner, ttl, replay_key),
        ).fetchone()

    async def claim(
        self, replay_key: str, owner: str, ttl: float, sent: Sent | None = None
    ) -> Claim | None:
        def body(c: sqlite3.Connection) -> Claim | None:
            _mark(sent)
            row = self._claim_sql(c, replay_key, owner, ttl)
            self._fault("claim")
            if row is None:
                return None
            return Claim(replay_key, int(row[0]), int(row[1]), bool(row[2]), float(row[3]))

        return await self._write(body)

    async def renew(
        self, owner: str, ttl: float, keys: list[str], groups: list[str], sent: Sent | None = None
    ) -> tuple[list[Renewal], list[str]]:
        def body(c: sqlite3.Connection) -> tuple[list[Renewal], list[str]]:
            _mark(sent)
            rows = c.execute(
                f"UPDATE eh_children SET lease_expires = {NOW} + ? "
                f"WHERE lease_owner = ? AND state = 'claimed' AND lease_expires >= {NOW} "
                "AND replay_key IN (SELECT value FROM json_each(?)) "
                "RETURNING replay_key, fence, cancel_requested",
                (ttl, owner, json.dumps(sorted(keys))),
            ).fetchall()
            owned = c.execute(
                f"UPDATE eh_groups SET owner_expires = {NOW} + ? "
                f"WHERE owner = ? AND state = 'open' AND owner_expires >= {NOW} "
                "AND group_key IN (SELECT value FROM json_each(?)) RETURNING group_key",
                (ttl, owner, json.dumps(sorted(groups))),
            ).fetchall()
            return [Renewal(r[0], int(r[1]), bool(r[2])) for r in rows], [r[0] for r in owned]

        return await self._write(body)

    def _finalize_body(
        self,
        c: sqlite3.Connection,
        replay_key: str,
        envelope_hash: str,
        owner: str,
        fence: int,
        outcome: str,
    ) -> tuple[int, str] | None:
        """The normative order of G-31; returns the sequence and the group row's state."""
        # (1) the fenced UPDATE on all five fence columns
        row = c.execute(
            "UPDATE eh_children SET state = 'settled', outcome = ?, lease_owner = NULL, "
            f"lease_expires = NULL, settled_at = {NOW} "
            "WHERE replay_key = ? AND envelope_hash = ? AND lease_owner = ? AND fence = ? "
            "AND state = 'claimed' RETURNING group_key",
            (outcome, replay_key, envelope_hash, owner, fence),
        ).fetchone()
        if row is None:
            # (2) rowcount 0: the caller rolls back; no counter bump
            return None
        self._fault("finalize:after_update")
        # (3) rowcount 1: bump the counter in the statement that reads it
        seq, state = c.execute(
            "UPDATE eh_groups SET counter = counter + 1 WHERE group_key = ? "
            "RETURNING counter, state",
            (row[0],),
        ).fetchone()
        c.execute("UPDATE eh_children SET seq = ? WHERE replay_key = ?", (seq, replay_key))
        self._fault("finalize:before_commit")
        return int(seq), str(state)

    async def finalize(
        self, replay_key: str, envelope_hash: str, owner: str, fence: int, outcome: str
    ) -> int | None:
        def body(c: sqlite3.Connection) -> tuple[int, str] | None:
            return self._finalize_body(c, replay_key, envelope_hash, owner, fence, outcome)

        def after(done: tuple[int, str] | None) -> None:
            if done is not None:
                if done[1] == "open":
                    self.open_at_finalize.add(replay_key)
                self._fault("finalize:after_commit")

        done = await self._write(body, after)
        return None if done is None else done[0]

    async def finalize_many(self, owner: str, items: list[Finalize]) -> list[int | None]:
        def body(c: sqlite3.Connection) -> tuple[list[int | None], list[int], str]:
            seqs: list[int | None] = [None] * len(items)
            matched: list[int] = []
            group: str | None = None
            # (1) each child through its own fenced UPDATE, in the order given
            for index, item in enumerate(items):
                row = c.execute(
                    "UPDATE eh_children SET state = 'settled', outcome = ?, "
                    f"lease_owner = NULL, lease_expires = NULL, settled_at = {NOW} "
                    "WHERE replay_key = ? AND envelope_hash = ? AND lease_owner = ? "
                    "AND fence = ? AND state = 'claimed' RETURNING group_key",
                    (item.outcome, item.replay_key, item.envelope_hash, owner, item.fence),
                ).fetchone()
                if row is None:
                    continue
                if group is not None and row[0] != group:
                    raise ValueError("finalize_many: children of one group only")
                group = row[0]
                matched.append(index)
                self._fault("finalize:after_update")
            if group is None:
                return seqs, matched, ""  # (2) nothing matched: nothing written, no bump
            # (3) one bump for the children that matched, in the order they matched
            top, state = c.execute(
                "UPDATE eh_groups SET counter = counter + ? WHERE group_key = ? "
                "RETURNING counter, state",
                (len(matched), group),
            ).fetchone()
            base = int(top) - len(matched)
            for k, index in enumerate(matched, 1):
                seqs[index] = base + k
            c.executemany(
                "UPDATE eh_children SET seq = ? WHERE replay_key = ?",
                [(seqs[index], items[index].replay_key) for index in matched],
            )
            for _index in matched:  # fault points count children, as unbatched
                self._fault("finalize:before_commit")
            return seqs, matched, str(state)

        def after(done: tuple[list[int | None], list[int], str]) -> None:
            _seqs, matched, state = done
            if state == "open":
                self.open_at_finalize.update(items[index].replay_key for index in matched)
            for _index in matched:
                self._fault("finalize:after_commit")

        seqs, _matched, _state = await self._write(body, after)
        return seqs

    async def settle_free(
        self, replay_key: str, owner: str, outcome: str, orphan: bool = False
    ) -> int | None:
        def body(c: sqlite3.Connection) -> int | None:
            if orphan:
                live = c.execute(
                    f"SELECT g.state = 'open' AND g.owner_expires >= {NOW} "
                    "AND g.owner IS NOT ? FROM eh_children c "
                    "JOIN eh_groups g ON g.group_key = c.group_key WHERE c.replay_key = ?",
                    (owner, replay_key),
                ).fetchone()
                if live is not None and live[0]:
                    return None  # the caller is back
            claim = self._claim_sql(c, replay_key, owner, 60.0)
            if claim is None:
                return None
            digest = c.execute(
                "SELECT envelope_hash FROM eh_children WHERE replay_key = ?", (replay_key,)
            ).fetchone()[0]
            done = self._finalize_body(c, replay_key, digest, owner, int(claim[0]), outcome)
            return None if done is None else done[0]

        return await self._write(body)

    async def close(self, group_key: str, effective: str) -> bool:
        def body(c: sqlite3.Connection) -> bool:
            recorded = self._close_body(c, group_key, effective)
            self._fault("close:before_commit")
            return recorded

        return await self._write(body)

    @staticmethod
    def _close_body(c: sqlite3.Connection, group_key: str, effective: str) -> bool:
        """Close in the lock order: cancel marks on child rows first, then the group row."""
        if effective == "cancel":
            c.execute(
                "UPDATE eh_children SET cancel_requested = 1 "
                "WHERE group_key = ? AND state <> 'settled'",
                (group_key,),
            )
        cur = c.execute(
            "UPDATE eh_groups SET effective = ?, state = 'closed', "
            f"closed_at = coalesce(closed_at, {NOW}) WHERE group_key = ?",
            (effective, group_key),
        )
        return cur.rowcount == 1

    @staticmethod
    def _retire_body(c: sqlite3.Connection, group_key: str, closing: str | None = None) -> bool:
        """Retire a closed group whose children have all settled (G-36). With ``closing``
        this transaction is the close itself: the group row goes whatever state it read
        and the tombstone records ``closing``, the disposition the close put in force."""
        unsettled = c.execute(
            "SELECT count(*) FROM eh_children WHERE group_key = ? AND state <> 'settled'",
            (group_key,),
        ).fetchone()[0]
        if unsettled:
            return False
        if closing is None:
            row = c.execute(
                "DELETE FROM eh_groups WHERE group_key = ? AND state = 'closed' "
                "RETURNING effective",
                (group_key,),
            ).fetchone()
        else:
            row = c.execute(
                "DELETE FROM eh_groups WHERE group_key = ? RETURNING ?", (group_key, closing)
            ).fetchone()
        if row is None:
            return False
        c.execute("DELETE FROM eh_children WHERE group_key = ?", (group_key,))
        c.execute("DELETE FROM eh_payloads WHERE group_key = ?", (group_key,))
        c.execute(
            "INSERT INTO eh_retired (group_key, effective, retired_at) "
            f"VALUES (?, ?, {NOW}) ON CONFLICT DO NOTHING",
            (group_key, row[0]),
        )
        return True

    async def retire(self, group_key: str) -> bool:
        return await self._write(lambda c: self._retire_body(c, group_key))

    async def retire_closed(self, group_key: str) -> bool:
        def read(c: sqlite3.Connection) -> bool:
            row = c.execute(
                "SELECT state FROM eh_groups WHERE group_key = ?", (group_key,)
            ).fetchone()
            return row is not None and row[0] == "closed"

        if not await self._run(read):
            return False
        return await self._write(lambda c: self._retire_body(c, group_key))

    def _close_retire_body(
        self, c: sqlite3.Connection, group_key: str, effective: str
    ) -> tuple[bool, bool]:
        # every child settled: closed and retired in one transaction
        if self._retire_body(c, group_key, closing=effective):
            recorded = retired = True
        else:
            recorded, retired = self._close_body(c, group_key, effective), False
        self._fault("close:before_commit")
        return recorded, retired

    async def close_retire(self, group_key: str, effective: str) -> tuple[bool, bool]:
        return await self._write(lambda c: self._close_retire_body(c, group_key, effective))

    @staticmethod
    def _lookup(c: sqlite3.Connection, group_key: str) -> tuple[GroupRow | None, str | None]:
        return looked_up(c.execute(LOOKUP, (group_key,)).fetchone())

    async def _open(self, r: OpenRequest) -> Opened:
        """One transaction: the lookup; for a group recorded open, ``reopen`` and the
        change of owner (R-1); else the replay-key check, ``before_create`` and the group
        row (owned by ``owner``) with every child row (``reopen`` and ``before_create``
        run inside it; when another process holds the write lock, on this store's writer
        thread). Writers are serialised, so no other open can come between the lookup
        and the insert."""

        def body(c: sqlite3.Connection) -> Opened:
            record, tombstone = self._lookup(c, r.group_key)
            if record is not None:
                children = tuple(self._children(c, r.group_key))
                if record.state == "open":
                    if r.reopen is not None:
                        r.reopen(record, children)
                    self._own_body(c, r.group_key, r.owner, r.ttl, r.trace_context)
                return Opened(False, record, None, children)
            if tombstone is not None:
                return Opened(False, None, tombstone)
            self._taken(c, r.group_key, r.specs)
            r.before_create()
            _mark(r.sent)
            _created, row = self._create_body(c, r)
            inserted = self._insert_children(c, r.group_key, r.specs, r.owner, r.ttl)
            if len(inserted) != len(r.specs):  # the check above makes this unreachable
                self._taken(c, r.group_key, r.specs)
                raise RuntimeError(f"children of group {r.group_key!r} were not all recorded")
            return Opened(True, row)

        return await self._write(body)

    async def close_group(
        self, group_key: str, decide: Decide, expect: Expected | None = None
    ) -> Closed:
        """One transaction: the lookup, ``decide``, and the close (with the retirement
        when every child has settled); ``expect`` is not needed."""

        def body(c: sqlite3.Connection) -> Closed:
            record, tombstone = self._lookup(c, group_key)
            target = decide(record, tombstone)
            if record is None or target is None:
                return record, False, False
            return (record, *self._close_retire_body(c, group_key, target))

        return await self._write(body)

    # -- the payload table ----------------------------------------------------------------

    async def recorded_sealing(self) -> bool | None:
        """Whether this deployment is sealed, as recorded in ``eh_sealing``; ``None`` in
        a database of an earlier release (no record yet)."""

        def read(c: sqlite3.Connection) -> bool | None:
            found = c.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'eh_sealing'"
            ).fetchone()
            row = c.execute("SELECT max(sealed) FROM eh_sealing").fetchone() if found else None
            return None if row is None or row[0] is None else bool(row[0])

        return await self._run(read)

    async def record_sealing(self, sealed: bool) -> None:
        """Record whether outcomes here are sealed; once sealed, always sealed."""

        def body(c: sqlite3.Connection) -> None:
            c.execute("CREATE TABLE IF NOT EXISTS eh_sealing (sealed INTEGER NOT NULL)")
            c.execute(
                "INSERT INTO eh_sealing SELECT ? WHERE NOT EXISTS (SELECT 1 FROM eh_sealing)",
                (int(sealed),),
            )
            if sealed:
                c.execute("UPDATE eh_sealing SET sealed = 1 WHERE sealed = 0")

        await self._write(body)


def _outcome_text(raw: bytes | None) -> Any:
    """The outcome column read as bytes (a corrupted row may not be UTF-8, and sqlite3
    would raise reading it as text): its text, or the bytes for the host to refuse typed."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
