"""The SQL open path is fenced like a reopen, records whole or not at all, and keeps a
closed key closed (R-2, R-4, R-6, R-7, G-10), on SQLite and PostgreSQL alike.

Each refusal is checked against the database's own record: every table is read before
and after and must be identical, and the same refusal repeats identically."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from group_support import echo_tools
from sql_support import running

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectGroupUnsupported,
    EffectHostError,
    EffectKind,
    GroupClosed,
    GroupHandle,
    GroupShapeError,
    GroupShapeMismatch,
    InvalidEnvelope,
    LoserPolicy,
    ReplayMismatch,
    ToolRegistry,
    UnknownGroup,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store

pytestmark = pytest.mark.anyio

TABLES = ("eh_groups", "eh_children", "eh_retired", "eh_payloads")


@dataclass
class Db:
    """One database under test: stores on it, and a reader of every table."""

    kind: str
    make: Callable[[], Store]
    path: Path | None = None
    dsn: str | None = None
    schema: str | None = None

    async def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, sorted: the database's own record."""
        if self.kind == "sqlite":
            assert self.path is not None
            conn = sqlite3.connect(self.path)
            try:
                return {
                    t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                    for t in TABLES
                }
            finally:
                conn.close()
        import asyncpg

        conn = await asyncpg.connect(self.dsn, server_settings={"search_path": self.schema})
        try:
            return {
                t: sorted((tuple(r) for r in await conn.fetch(f"SELECT * FROM {t}")), key=repr)
                for t in TABLES
            }
        finally:
            await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str) -> AsyncIterator[Db]:
    if request.param == "sqlite":
        path = tmp_path / "open.sqlite3"
        yield Db("sqlite", lambda: SqliteStore(path), path=path)
    else:
        dsn = request.getfixturevalue("pg_dsn")
        yield Db(
            "postgres", lambda: PostgresStore(dsn, schema=pg_schema), dsn=dsn, schema=pg_schema
        )


async def _forever(_value: object) -> object:
    await asyncio.Event().wait()  # only a cancel ends it


def _registry() -> ToolRegistry:
    return echo_tools(block=_forever)


def _tool(key: str, value: Any = 0, name: str = "block") -> EffectEnvelope:
    return EffectEnvelope(replay_key=key, kind=EffectKind.TOOL_CALL, name=name, input=value)


def _event(key: str) -> EffectEnvelope:
    return EffectEnvelope(replay_key=key, kind=EffectKind.AWAIT_EVENT, name="go", input=None)


def _sleep(key: str, value: Any) -> EffectEnvelope:
    return EffectEnvelope(replay_key=key, kind=EffectKind.SLEEP, name="sleep", input=value)


def _group(
    key: str,
    *children: EffectEnvelope,
    disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION,
) -> EffectGroup:
    return EffectGroup(key=key, wake=WakePolicy.ALL, disposition=disposition, children=children)


@pytest.fixture
async def host(db: Db) -> AsyncIterator[SqlEffectHost]:
    host = SqlEffectHost(db.make(), _registry(), poll_interval=0.05)
    await host.start()
    yield host
    await host.aclose()


async def _refused_twice(
    db: Db, host: SqlEffectHost, group: EffectGroup, error: type[EffectHostError]
) -> EffectHostError:
    """Open ``group`` twice; both refused alike with ``error``, every table untouched."""
    tables, keys = await db.tables(), await host.open_group_keys()
    with pytest.raises(error) as first:
        await host.open_effect_group(group)
    assert await db.tables() == tables
    assert await host.open_group_keys() == keys
    with pytest.raises(error) as second:
        await host.open_effect_group(group)
    assert (str(second.value), second.value.ids()) == (str(first.value), first.value.ids())
    assert await db.tables() == tables
    return first.value


@pytest.mark.parametrize(
    "value",
    [{"seconds": -1}, {"seconds": "soon"}, {}, {"seconds": 10**400}, {"seconds": float("inf")}],
    ids=["negative", "string", "missing", "huge", "infinite"],
)
async def test_invalid_sleep_is_refused_before_anything_is_written(
    db: Db, host: SqlEffectHost, value: Any
) -> None:
    """G-10, R-6: a ``sleep`` whose input is not a finite, non-negative number refuses
    the open with ``InvalidEnvelope`` naming the child; no table changes; it repeats."""
    if value in ({"seconds": float("inf")}, {"seconds": 10**400}):
        with pytest.raises(InvalidEnvelope):  # the contract's limits (R-8) refuse it first
            _sleep("bad", value)
        return
    group = _group("s:group:sleep:0", _tool("s.t"), _sleep("s.bad", value))
    error = await _refused_twice(db, host, group, InvalidEnvelope)
    assert (error.group_key, error.replay_key, error.position) == (group.key, "s.bad", 1)
    assert "soon" not in str(error) and "400" not in str(error)


async def test_replay_key_of_another_group_is_refused_and_records_nothing(
    db: Db, host: SqlEffectHost
) -> None:
    """R-6, R-2: a child reusing a replay key recorded for another group refuses the open
    with ``ReplayMismatch`` naming both group keys, the position and the replay key; no
    table changes (the new group's row and its other children included); it repeats.
    A ``ReplayMismatch`` outranks a ``GroupShapeError`` of the same first open."""
    await host.open_effect_group(_group("r:group:one:0", _event("shared")))
    reuse = _group("r:group:two:0", _tool("two.a"), _event("shared"))
    error = await _refused_twice(db, host, reuse, ReplayMismatch)
    assert (error.group_key, error.replay_key, error.position) == (reuse.key, "shared", 1)
    assert "r:group:one:0" in str(error) and "r:group:two:0" in str(error)
    unresolvable = _group("r:group:two:0", _tool("two.a", name="nobody"), _event("shared"))
    await _refused_twice(db, host, unresolvable, ReplayMismatch)
    await _refused_twice(
        db, host, _group("r:group:two:0", _tool("two.a", name="nobody")), GroupShapeError
    )


async def test_closed_group_is_tombstoned_before_and_after_retirement(
    db: Db, host: SqlEffectHost
) -> None:
    """R-4, R-2: once closed, a group's key is ``GroupClosed`` for every open and await,
    before retirement (a loser still runs) and after; a later close is a no-op; and
    ``GroupClosed`` outranks a shape or replay mismatch of the reopen."""
    group = _group("c:group:closed:0", _tool("c.done", name="echo"), _event("c.wait"))
    handle = await host.open_effect_group(group)
    assert (await host.await_next_settlement(handle)).replay_key == "c.done"
    await host.close_effect_group(handle)  # the event child is still unsettled
    assert group.key not in await host.open_group_keys()
    variants = [
        group,
        _group(group.key, _tool("c.done", name="echo")),  # another shape
        _group(group.key, _tool("c.done", 1, name="echo"), _event("c.wait")),  # another hash
    ]
    for retired in (False, True):
        for variant in variants:
            await _refused_twice(db, host, variant, GroupClosed)
        with pytest.raises(GroupClosed):
            await host.await_next_settlement(GroupHandle.from_json(handle.to_json()))
        await host.close_effect_group(handle)
        await host.close_effect_group(handle, LoserPolicy.CANCEL if retired else None)
        if not retired:
            assert await host.deliver_event(group.key, "go", 1) == 1
            tables = await db.tables()
            assert not [r for r in tables["eh_groups"] if r[0] == group.key]


async def test_open_error_order(db: Db, host: SqlEffectHost) -> None:
    """R-2: ``EffectGroupUnsupported`` first, then ``GroupShapeMismatch`` before
    ``ReplayMismatch`` on a reopen."""
    bare = SqlEffectHost(db.make())
    async with aclosing(bare):
        with pytest.raises(EffectGroupUnsupported):
            await bare.open_effect_group(_group("o:group:x:0", _tool("o.x", name="nobody")))
    await host.open_effect_group(_group("o:group:a:0", _event("o.a"), _event("o.b")))
    with pytest.raises(GroupShapeMismatch):
        await host.open_effect_group(_group("o:group:a:0", _event("o.z")))
    with pytest.raises(ReplayMismatch) as caught:
        await host.open_effect_group(_group("o:group:a:0", _event("o.a"), _event("o.z")))
    assert (caught.value.position, caught.value.replay_key) == (1, "o.z")


async def test_a_refused_reopen_changes_no_owner(db: Db, host: SqlEffectHost) -> None:
    """R-1, R-2, G-13: a reopen by another incarnation that its fences refuse (shape,
    then a child's hash) leaves every table as it was, the group's owner and owner-lease
    expiry included; a reopen that passes them makes that incarnation the owner within
    the open itself."""
    key = "own:group:a:0"
    group = _group(key, _event("own.a"), _event("own.b"))
    await host.open_effect_group(group)

    async def owners() -> set[str | None]:
        return {r.group_owner for r in await host.store.unfinished() if r.group_key == key}

    assert await owners() == {host.owner}
    async with running(SqlEffectHost(db.make(), _registry(), poll_interval=0.05)) as (other,):
        await _refused_twice(db, other, _group(key, _event("own.a")), GroupShapeMismatch)
        changed = _group(key, _event("own.a"), _tool("own.b"))
        await _refused_twice(db, other, changed, ReplayMismatch)
        assert await owners() == {host.owner}
        await other.open_effect_group(group)
        assert await owners() == {other.owner}


async def test_concurrent_first_opens_with_other_inputs_are_one_open(db: Db) -> None:
    """R-7: the creator is paused right after its open committed; a second host opening
    the same key with the same shape but other inputs is fenced exactly as a reopen is
    (``ReplayMismatch`` naming position and replay key); exactly one handle results and
    the record holds the creator's inputs only."""
    paused, resume = threading.Event(), threading.Event()

    def fault(point: str) -> None:
        if point == "open:created":
            paused.set()
            resume.wait(30)

    key = "race:group:first:0"
    mine = _group(key, _tool("race.a", "mine"), _tool("race.b", "mine"))
    theirs = _group(key, _tool("race.a", "theirs"), _tool("race.b", "theirs"))
    results: dict[str, Any] = {}

    def creator() -> None:
        async def main() -> None:
            host = SqlEffectHost(db.make(), _registry(), fault=fault)
            try:
                results["creator"] = await host.open_effect_group(mine)
            except Exception as exc:  # reported below
                results["creator"] = exc
            finally:
                await host.aclose()

        asyncio.run(main())

    thread = threading.Thread(target=creator)
    thread.start()
    other = SqlEffectHost(db.make(), _registry())
    try:
        assert await asyncio.to_thread(paused.wait, 30)
        try:
            results["other"] = await other.open_effect_group(theirs)
        except Exception as exc:
            results["other"] = exc
        resume.set()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive()
        assert isinstance(results["creator"], GroupHandle), results
        error = results["other"]
        assert isinstance(error, ReplayMismatch), results
        assert (error.group_key, error.position, error.replay_key) == (key, 0, "race.a")
        envelopes = {r[0]: r[5] for r in (await db.tables())["eh_children"]}
        assert set(envelopes) == {"race.a", "race.b"}
        assert all('"mine"' in e and "theirs" not in e for e in envelopes.values())
    finally:
        resume.set()
        await other.aclose()


@pytest.mark.parametrize("where", ["group key", "replay key", "name"])
async def test_values_the_database_refuses_are_typed_and_record_nothing(
    db: Db, host: SqlEffectHost, where: str
) -> None:
    """SPEC §7, R-8: a NUL byte in a key or name (PostgreSQL refuses it in text) is a
    typed ``InvalidEnvelope`` before anything reaches the database: the contract refuses
    the envelope or the group, and a host asked for such a key by another door
    (``deliver_event``) refuses it too, naming no driver error; nothing is recorded."""
    bad = "nul\x00byte"
    key = f"v:group:{bad}:0" if where == "group key" else "v:group:ok:0"
    tables = await db.tables()
    with pytest.raises(InvalidEnvelope) as refused:
        _group(
            key,
            EffectEnvelope(
                replay_key=bad if where == "replay key" else "v.child",
                kind=EffectKind.AWAIT_EVENT,
                name=bad if where == "name" else "go",
                input=None,
            ),
        )
    assert "\x00" not in str(refused.value)
    if where == "group key":
        with pytest.raises(InvalidEnvelope) as delivered:
            await host.deliver_event(key, "go")
        assert delivered.value.__cause__ is None
    if where == "name":
        with pytest.raises((InvalidEnvelope, UnknownGroup)):
            await host.deliver_event("v:group:ok:0", bad)
    assert await db.tables() == tables


@pytest.mark.parametrize("db", ["postgres"], indirect=True)  # row-level interleaving
async def test_postgres_opens_in_flight_together_are_one_open(db: Db) -> None:
    """R-7 on PostgreSQL, both opens inside their transactions at once: the creator is
    held after its group row (a test transaction locks the children table), the second
    open then waits on the creator's uncommitted group row; once both are released,
    exactly one open recorded the group and the other is fenced as a reopen."""
    assert db.kind == "postgres"
    import asyncpg

    key = "flight:group:first:0"
    mine = _group(key, _tool("flight.a", "mine"), _event("flight.b"))
    theirs = _group(key, _tool("flight.a", "theirs"), _event("flight.b"))
    creator = SqlEffectHost(db.make(), _registry())
    other = SqlEffectHost(db.make(), _registry())
    await creator.start()
    await other.start()
    blocker = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    tasks: list[asyncio.Task[GroupHandle]] = []
    try:
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("LOCK TABLE eh_children IN SHARE MODE")

        async def waiting(count: int) -> None:
            query = (
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.application_name = 'effecthost'"
            )
            async with asyncio.timeout(30):
                # the server's lock table is the only signal: poll it (orders nothing)
                while True:
                    if await blocker.fetchval(query) >= count:
                        return
                    await asyncio.sleep(0.01)

        tasks.append(asyncio.create_task(creator.open_effect_group(mine)))
        await waiting(1)  # the creator holds its group row, waits for the children table
        tasks.append(asyncio.create_task(other.open_effect_group(theirs)))
        await waiting(2)  # the other waits for the creator's group row
        await lock.commit()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        assert isinstance(results[0], GroupHandle), results
        assert isinstance(results[1], ReplayMismatch), results
        assert (results[1].position, results[1].replay_key) == (0, "flight.a")
        envelopes = [r[5] for r in (await db.tables())["eh_children"]]
        assert len(envelopes) == 2 and not any("theirs" in e for e in envelopes)
    finally:
        for task in tasks:
            task.cancel()
        await blocker.close()
        await creator.aclose()
        await other.aclose()
