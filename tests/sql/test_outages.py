"""R-12 on the SQL tier: a database outage never lets a driver exception reach a caller.

PostgreSQL really goes down here (a private server of this module's, stopped and started
again on its data directory); SQLite is made unreachable by another connection holding
the file's exclusive lock. An await waits the outage out and returns the right rank;
open, close and ``deliver_event`` retry up to the host's ``outage_bound`` and then raise
``EngineUnavailable``; an open or close that committed just before its connection dropped
is fenced as a reopen or a no-op close when retried, never applied twice.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from sql_support import event, group, tool

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EngineUnavailable,
    LoserPolicy,
    ToolRegistry,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore
from effecthost.hosts.sql.testing import PostgresServer, find_pg_bin

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    """A server of this module's own: its tests stop it, so it is shared with no other."""
    if find_pg_bin("initdb") is None:
        pytest.fail("PostgreSQL binaries not found: run scripts/install-sql.sh")
    pg = PostgresServer(fsync=False)
    pg.start()
    yield pg
    pg.stop()


@pytest.fixture
async def up(server: PostgresServer) -> AsyncIterator[PostgresServer]:
    """The module's server, running at the start and at the end of the test."""
    if server.proc is None:
        await asyncio.to_thread(server.resume)
    yield server
    if server.proc is None:
        await asyncio.to_thread(server.resume)


def _event(key: str, label: str) -> EffectEnvelope:
    return event(f"{key}.{label}", label)


def _group(
    key: str, *labels: str, disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION
) -> EffectGroup:
    return group(key, [_event(key, label) for label in labels], disposition=disposition)


def _tool_group(key: str) -> EffectGroup:
    return group(key, [tool(f"{key}.tool", 1, "count"), _event(key, "ev")])


class _Counter:
    """A tool that counts its runs: a retried open must not run it twice."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, value: Any) -> Any:
        self.runs += 1
        return value


def _postgres_host(
    dsn: str, schema: str, *, bound: float, fault: Any = None, tools: Any = None
) -> SqlEffectHost:
    return SqlEffectHost(
        PostgresStore(dsn, schema=schema, fault=fault),
        ToolRegistry(tools or {}),
        poll_interval=0.05,
        outage_bound=bound,
    )


async def _waiting(host: SqlEffectHost, key: str) -> None:
    # a bounded poll for the await task to be parked on the group (no event to wait on)
    for _ in range(2000):
        if host._changed.get(key):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"no waiter parked on {key!r}")


async def _raised(call: Any) -> BaseException | None:
    try:
        await call
    except BaseException as exc:  # the type of everything raised is the point
        return exc
    return None


@pytest.mark.parametrize("how", ["immediate", "fast"])
async def test_an_await_rides_out_a_postgres_restart(
    up: PostgresServer, pg_schema: str, how: str
) -> None:
    """R-12: PostgreSQL stops mid-await (an immediate stop, no checkpoint: as a crash; or
    a fast shutdown that tells clients) and starts again on its data. The await in flight
    raises nothing meanwhile and returns rank 2, the right child and value, afterwards; a
    new await with a deadline of its caller's ends in that caller's ``TimeoutError``; open,
    close and ``deliver_event`` raise ``EngineUnavailable`` naming the group, the operation
    and how long they tried (at least the bound) — no driver exception type escapes."""
    host = _postgres_host(up.dsn, pg_schema, bound=0.5)
    key = f"{pg_schema}:group:await:0"
    async with aclosing(host):
        handle = await host.open_effect_group(_group(key, "a", "b"))
        assert await host.deliver_event(key, "a", "first") == 1
        first = await host.await_next_settlement(handle)
        assert (first.rank, first.position, first.outcome.value) == (1, 0, "first")
        waiting = asyncio.ensure_future(host.await_next_settlement(handle))
        await _waiting(host, key)

        await asyncio.to_thread(up.crash if how == "immediate" else up.shutdown)
        other = _group(f"{pg_schema}:group:other:0", "x")
        raised = {
            "open": await _raised(host.open_effect_group(other)),
            "close": await _raised(host.close_effect_group(handle.copy_cursor())),
            "deliver_event": await _raised(host.deliver_event(key, "b", "lost")),
            "await": await _raised(
                asyncio.wait_for(host.await_next_settlement(handle.copy_cursor()), 0.5)
            ),
        }
        assert type(raised.pop("await")) is TimeoutError  # the caller's own deadline
        for operation, error in raised.items():
            assert isinstance(error, EngineUnavailable), (operation, repr(error))
            assert error.operation == operation and error.tried_for >= 0.5, vars(error)
        assert raised["deliver_event"].group_key == key  # type: ignore[union-attr]
        assert raised["close"].group_key == key  # type: ignore[union-attr]
        assert raised["open"].group_key == other.key  # type: ignore[union-attr]
        assert not waiting.done(), "the await in flight ended while the database was down"

        await asyncio.to_thread(up.resume)
        host.outage_bound = 30.0
        assert await host.deliver_event(key, "b", "second") == 1
        second = await asyncio.wait_for(waiting, 60)
        assert (second.rank, second.position, second.outcome.value) == (2, 1, "second")
        assert handle.consumed == 2


async def test_a_tool_that_finishes_during_an_outage_is_recorded_once_afterwards(
    up: PostgresServer, pg_schema: str
) -> None:
    """R-12: a tool call finishes while PostgreSQL is down. Its finalize is tried again
    with backoff while its lease lasts; once the server is back the outcome takes rank 1,
    the await in flight returns it, and the tool ran once."""
    release = asyncio.Event()
    runs = 0

    async def gated(value: Any) -> Any:
        nonlocal runs
        runs += 1
        await release.wait()
        return value

    host = _postgres_host(up.dsn, pg_schema, bound=0.5, tools={"count": gated})
    key = f"{pg_schema}:group:tool:0"
    async with aclosing(host):
        handle = await host.open_effect_group(_tool_group(key))
        waiting = asyncio.ensure_future(host.await_next_settlement(handle))
        await _waiting(host, key)
        await asyncio.to_thread(up.crash)
        release.set()  # the tool returns while the server is down: its finalize fails
        await asyncio.to_thread(up.resume)
        first = await asyncio.wait_for(waiting, 20)  # within the lease: no adoption
        assert (first.rank, first.position, first.outcome.value) == (1, 0, 1)
        assert runs == 1
        assert await host.deliver_event(key, "ev", 2) == 1
        await host.await_next_settlement(handle)
        await host.close_effect_group(handle)


async def test_a_close_that_committed_before_its_connection_dropped_is_a_no_op_on_retry(
    up: PostgresServer, pg_schema: str
) -> None:
    """R-12: the close commits, then the connection drops before the caller learns of it
    (the server is stopped as by a crash and restarted meanwhile). The close retries,
    finds its own tombstone and is a no-op: it returns, the narrowing to ``CANCEL`` it
    recorded holds (the pending event wait settles as cancelled and the group retires),
    and the key has one tombstone."""
    restarted: list[threading.Thread] = []
    fault = _crash_at(up, "close:after_commit", restarted)

    host = _postgres_host(up.dsn, pg_schema, bound=60.0, fault=fault)
    key = f"{pg_schema}:group:close:0"
    async with aclosing(host):
        handle = await host.open_effect_group(_group(key, "won", "pending"))
        assert await host.deliver_event(key, "won", 1) == 1
        await host.await_next_settlement(handle)
        await host.close_effect_group(handle, LoserPolicy.CANCEL)
        assert restarted, "the fault never ran: the close did not commit through it"
        await asyncio.to_thread(restarted[0].join)
        assert await host.deliver_event(key, "pending", 2) == 0
        heir = effect_group(f"{pg_schema}:group:heir:0", [_event(key, "pending")])
        await _retired(host, heir)
        rows = await _fetch(
            up.dsn,
            pg_schema,
            "SELECT (SELECT count(*) FROM eh_groups WHERE group_key = $1), "
            "(SELECT array_agg(effective) FROM eh_retired WHERE group_key = $1)",
            key,
        )
        assert rows == [(0, ["cancel"])], rows


async def test_an_open_that_committed_before_its_connection_dropped_is_a_reopen_on_retry(
    up: PostgresServer, pg_schema: str
) -> None:
    """R-12: the first open commits the group (its tool child leased to this host), then
    the connection drops before the caller learns of it. The open retries, is fenced as a
    reopen of the group it recorded, returns a handle at rank 0, and the tool runs once."""
    restarted: list[threading.Thread] = []
    fault = _crash_at(up, "open:after_commit", restarted)

    counter = _Counter()
    host = _postgres_host(up.dsn, pg_schema, bound=60.0, fault=fault, tools={"count": counter})
    key = f"{pg_schema}:group:open:0"
    async with aclosing(host):
        handle = await host.open_effect_group(_tool_group(key))
        assert restarted, "the fault never ran: the open did not commit through it"
        assert handle.consumed == 0
        # within the lease TTL (30 s): an adoption after expiry must not be what runs it
        first = await asyncio.wait_for(host.await_next_settlement(handle), 20)
        assert (first.position, first.outcome.value) == (0, 1)
        assert await host.deliver_event(key, "ev", 2) == 1
        await asyncio.wait_for(host.await_next_settlement(handle), 60)
        assert counter.runs == 1
        rows = await _fetch(
            up.dsn, pg_schema, "SELECT count(*) FROM eh_groups WHERE group_key = $1", key
        )
        assert rows == [(1,)]
        await host.close_effect_group(handle)


async def test_sqlite_locked_out_raises_engine_unavailable_and_an_await_waits(
    tmp_path: Path,
) -> None:
    """R-12 on SQLite: while another connection holds the file's exclusive lock, open,
    close and ``deliver_event`` raise ``EngineUnavailable`` past the bound (never
    ``sqlite3.OperationalError``), an await in flight keeps waiting, and once the lock is
    released the delivery lands and the await returns rank 1."""
    path = tmp_path / "outage.sqlite3"
    host = SqlEffectHost(
        SqliteStore(path, busy_timeout=0.05),
        ToolRegistry({}),
        poll_interval=0.05,
        outage_bound=0.3,
    )
    key = "outage:group:sqlite:0"
    locker: sqlite3.Connection | None = None
    try:
        handle = await host.open_effect_group(_group(key, "a"))
        waiting = asyncio.ensure_future(host.await_next_settlement(handle))
        await _waiting(host, key)
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        raised = {
            "open": await _raised(host.open_effect_group(_group("outage:group:other:0", "x"))),
            "close": await _raised(host.close_effect_group(handle.copy_cursor())),
            "deliver_event": await _raised(host.deliver_event(key, "a", 1)),
        }
        for operation, error in raised.items():
            assert isinstance(error, EngineUnavailable), (operation, repr(error))
            assert error.operation == operation and error.tried_for >= 0.3, vars(error)
        assert not waiting.done(), "the await ended while the database was locked"
        locker.execute("ROLLBACK")
        locker.close()
        locker = None
        assert await host.deliver_event(key, "a", 1) == 1
        settlement = await asyncio.wait_for(waiting, 30)
        assert (settlement.rank, settlement.outcome.value) == (1, 1)
    finally:
        if locker is not None:
            locker.close()
        await host.aclose()


def _crash_at(
    up: PostgresServer, at: str, restarted: list[threading.Thread]
) -> Callable[[str], None]:
    """A store fault that, the first time the store reaches ``at``, stops the server as by
    a crash, restarts it in a thread (kept in ``restarted``) and drops the connection."""

    def fault(point: str) -> None:
        if point == at and not restarted:
            up.crash()
            thread = threading.Thread(target=up.resume)
            thread.start()
            restarted.append(thread)
            raise _dropped()

    return fault


def _dropped() -> BaseException:
    """The exception the driver raises when the connection is lost before a reply."""
    import asyncpg

    return asyncpg.exceptions.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    )


async def _retired(host: SqlEffectHost, heir: EffectGroup) -> None:
    """Open ``heir`` (it reuses a replay key of a closed group) once that group retired;
    a bounded poll: retirement has no event a test can wait on."""
    from effecthost.contract import ReplayMismatch

    for _ in range(600):
        try:
            handle = await host.open_effect_group(heir)
        except ReplayMismatch:
            await asyncio.sleep(0.05)
            continue
        await host.close_effect_group(handle, LoserPolicy.CANCEL)
        return
    raise AssertionError(f"the group whose key {heir.key!r} reuses never retired")


async def _fetch(dsn: str, schema: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    import asyncpg

    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        return [tuple(row) for row in await conn.fetch(statement, *args)]
    finally:
        await conn.close()
