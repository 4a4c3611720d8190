"""The batched finalize (G-31, G-16): several children of one group finalized in one
transaction, on both substrates. Each child goes through its own fenced update; the ones
that match get dense, distinct sequences in the order they matched, and a fenced-off
child in the batch writes nothing and bumps nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from sql_support import ok, running, spec

from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    Outcome,
    ToolRegistry,
)
from effecthost.hosts.sql import SqlEffectHost, SqliteStore, Store
from effecthost.hosts.sql._store import Finalize, ReplayKeyTaken

pytestmark = pytest.mark.anyio


async def test_batch_gets_dense_distinct_ranks_and_a_fenced_off_child_bumps_nothing(
    store: Store,
) -> None:
    keys = [f"c{i}" for i in range(5)]
    await store.create_group("g", "all", "run_to_completion", len(keys))
    await store.insert_children(
        "g", [spec(k, i, claim=True) for i, k in enumerate(keys)], "a:1", 30.0
    )
    # one child settled earlier through the single-child path: the batch continues from it
    assert await store.finalize("c0", "h", "a:1", 1, ok("c0")) == 1
    batch = [
        Finalize("c3", "h", 1, ok("c3")),
        Finalize("c1", "h", 1, ok("c1")),
        Finalize("c2", "h", 7, ok("stale")),  # fenced off: wrong fence token
        Finalize("c0", "h", 1, ok("again")),  # already settled
        Finalize("c4", "h", 1, ok("c4")),
    ]
    seqs = await store.finalize_many("a:1", batch)
    # ranks in the order the fenced updates succeeded, dense after the earlier one
    assert seqs == [2, 3, None, None, 4]
    group = await store.get_group("g")
    assert group is not None and group.counter == 4  # nothing burned for the fenced-off
    assert await store.settlement_order("g") == [0, 3, 1, 4]
    rows = {r.replay_key: r for r in await store.children("g")}
    assert rows["c2"].state == "claimed" and rows["c2"].seq is None
    for rank, key in [(1, "c0"), (2, "c3"), (3, "c1"), (4, "c4")]:
        read = await store.read_rank("g", rank)
        assert read is not None and read.replay_key == key
        assert read.outcome is not None
        assert Outcome.model_validate_json(read.outcome).value == key
    # a batch in which nothing matches writes nothing at all
    assert await store.finalize_many("b:2", [Finalize("c2", "h", 1, ok("x"))] * 2) == [
        None,
        None,
    ]
    group = await store.get_group("g")
    assert group is not None and group.counter == 4
    # the fenced-off child still finalizes under its own fence, as rank 5
    assert await store.finalize_many("a:1", [Finalize("c2", "h", 1, ok("c2"))]) == [5]


async def test_host_batches_children_of_one_group_that_settle_together(tmp_path: Path) -> None:
    """Children settling at once on one host share transactions: fewer finalize
    transactions than children, and the ranks are still 1..n, each child once."""
    release = asyncio.Event()

    async def work(value: object) -> object:
        await release.wait()
        return value

    store = SqliteStore(tmp_path / "host.sqlite3")
    calls: list[int] = []
    single, many = store.finalize, store.finalize_many

    async def count_single(*args: object) -> int | None:
        calls.append(1)
        return await single(*args)  # type: ignore[arg-type]

    async def count_many(owner: str, items: list[Finalize]) -> list[int | None]:
        calls.append(len(items))
        return await many(owner, items)

    store.finalize = count_single  # type: ignore[method-assign,assignment]
    store.finalize_many = count_many  # type: ignore[method-assign]
    async with running(SqlEffectHost(store, ToolRegistry({"t": work}))) as (host,):
        n = 40
        group = effect_group(
            "b:group:g:0",
            [
                EffectEnvelope(replay_key=f"b.c{i}", kind=EffectKind.TOOL_CALL, name="t", input=i)
                for i in range(n)
            ],
        )
        handle = await host.open_effect_group(group)
        release.set()
        got = [await asyncio.wait_for(host.await_next_settlement(handle), 10) for _ in range(n)]
        assert [s.rank for s in got] == list(range(1, n + 1))
        assert sorted(s.position for s in got) == list(range(n))
        assert all(s.outcome.value == s.position for s in got)
        assert sum(calls) == n and len(calls) < n and max(calls) > 1


async def test_sqlite_writes_of_many_tasks_share_commits_and_fail_alone(tmp_path: Path) -> None:
    """Group commit on SQLite: writes that several tasks start in one event-loop
    iteration go in one transaction, each under its own savepoint; a write that raises is
    rolled back alone and only its caller sees the error."""
    async with running(SqliteStore(tmp_path / "group-commit.sqlite3")) as (store,):
        for g in ("g1", "g2"):
            await store.create_group(g, "all", "run_to_completion", 2)
            await store.insert_children(
                g, [spec(f"{g}.c{i}", i, claim=True) for i in range(2)], "a:1", 30
            )
        assert store._inline_conn is not None
        statements: list[str] = []
        store._inline_conn.set_trace_callback(statements.append)
        mixed = [Finalize("g1.c1", "h", 1, ok("x")), Finalize("g2.c1", "h", 1, ok("y"))]
        results = await asyncio.gather(
            store.finalize("g1.c0", "h", "a:1", 1, ok("g1.c0")),
            store.finalize_many("a:1", mixed),  # two groups in one batch: refused
            store.finalize("g2.c0", "h", "a:1", 1, ok("g2.c0")),
            *(store.create_group(f"n{i}", "all", "cancel", 1) for i in range(5)),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[2] == 1
        assert isinstance(results[1], ValueError)
        assert all(isinstance(r, tuple) and r[0] for r in results[3:])
        # the refused batch was rolled back alone: its children are still claimed
        for g in ("g1", "g2"):
            rows = {r.replay_key: r for r in await store.children(g)}
            assert rows[f"{g}.c0"].seq == 1 and rows[f"{g}.c1"].state == "claimed"
            group = await store.get_group(g)
            assert group is not None and group.counter == 1
        commits = [s for s in statements if s == "COMMIT"]
        assert len(commits) < 8, commits  # eight writes, fewer commits
        assert any(s.startswith("SAVEPOINT") for s in statements)


class _Refused(Exception):
    """A first open's resolution that refuses (raised inside the batched transaction)."""


async def test_sqlite_refusals_in_a_shared_commit_stay_with_their_caller(tmp_path: Path) -> None:
    """G-31, R-6, R-7 under group commit: in one shared transaction, a stale fence (no
    rank, no bump), a replay key another group holds (R-6), a first open's refused
    resolution (R-7), a value the database refuses and a batched finalize refused after
    its first update each write nothing and reach only their own caller; every other caller's write in the same commit is recorded whole."""
    async with running(SqliteStore(tmp_path / "refusals.sqlite3")) as (store,):
        await store.create_group("g", "all", "run_to_completion", 3)
        await store.insert_children(
            "g", [spec(f"g.c{i}", i, claim=True) for i in range(3)], "a:1", 30
        )
        await store.create_group("h", "all", "run_to_completion", 1)
        await store.insert_children("h", [spec("h.c0", 0, claim=True)], "a:1", 30)
        assert store._inline_conn is not None
        statements: list[str] = []
        store._inline_conn.set_trace_callback(statements.append)
        # two groups in one batched finalize: refused after its first fenced update
        across = [Finalize("g.c1", "h", 1, ok("x")), Finalize("h.c0", "h", 1, ok("y"))]

        def refuse() -> None:
            raise _Refused("resolution refused")

        def open_(key: str, child: str, before: Any = lambda: None) -> Any:
            return store.open_group(
                key, "all", "cancel", 1, [spec(child, 0, claim=True)], "a:1", 30.0, before
            )

        results = await asyncio.gather(
            store.finalize("g.c0", "h", "a:1", 1, ok("c0")),
            store.finalize("g.c1", "h", "a:1", 2, ok("stale")),  # fenced off
            open_("taken", "g.c2"),  # g.c2 is g's
            store.finalize("g.c2", "h", "a:1", 1, ok("c2")),
            open_("resolved-not", "r.c0", refuse),
            store.release("a:1", "g.c1", 2**70),  # out of SQLite's integer range
            open_("fresh", "f.c0"),
            store.create_group("plain", "all", "cancel", 1),
            store.finalize_many("a:1", across),
            return_exceptions=True,
        )
        assert results[0] == 1
        assert results[1] is None
        assert isinstance(results[2], ReplayKeyTaken) and results[2].holder == "g"
        assert results[3] == 2
        assert isinstance(results[4], _Refused)
        assert isinstance(results[5], OverflowError)
        assert results[6].created and results[7][0]  # type: ignore[union-attr,index]
        assert isinstance(results[8], ValueError)
        assert any(s.startswith("SAVEPOINT") for s in statements)  # they shared commits
        assert sum(s == "COMMIT" for s in statements) < len(results)
        rows = {r.replay_key: r for r in await store.children("g")}
        assert [rows[f"g.c{i}"].seq for i in range(3)] == [1, None, 2]
        assert rows["g.c1"].state == "claimed" and rows["g.c1"].lease_owner == "a:1"
        group = await store.get_group("g")
        assert group is not None and group.counter == 2
        assert [(r.state, r.seq) for r in await store.children("h")] == [("claimed", None)]
        for refused in ("taken", "resolved-not"):
            assert await store.lookup(refused) == (None, None)
        assert [c.replay_key for c in await store.children("fresh")] == ["f.c0"]
        assert await store.get_group("plain") is not None


async def test_large_batch_gets_dense_ranks_in_the_order_given(store: Store) -> None:
    """A batch above the small-batch size (set-based on PostgreSQL, planned per call)
    keeps the same rules: dense ranks in the order given, fenced-off children skipped."""
    keys = [f"L{i}" for i in range(40)]
    await store.create_group("big", "all", "run_to_completion", len(keys))
    await store.insert_children(
        "big", [spec(k, i, claim=True) for i, k in enumerate(keys)], "a:1", 30.0
    )
    order = keys[::-1]
    batch = [Finalize(k, "h", 7 if k in ("L3", "L30") else 1, ok(k)) for k in order]
    seqs = await store.finalize_many("a:1", batch)
    live = [k for k in order if k not in ("L3", "L30")]
    assert [s for s in seqs if s is not None] == list(range(1, len(live) + 1))
    assert [seqs[order.index(k)] for k in ("L3", "L30")] == [None, None]
    group = await store.get_group("big")
    assert group is not None and group.counter == len(live)
    assert await store.settlement_order("big") == [keys.index(k) for k in live]


async def test_sqlite_batch_waits_for_another_writer_and_then_commits(tmp_path: Path) -> None:
    """When another connection (another process) holds the write lock, a batch of writes
    waits for it on the store's writer thread and commits after it, in order."""
    import sqlite3

    path = tmp_path / "busy.sqlite3"
    store = SqliteStore(path, busy_timeout=30.0)
    await store.start()
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        await store.create_group("warm", "all", "cancel", 1)
        other.execute("BEGIN IMMEDIATE")
        writes = asyncio.gather(
            *(store.create_group(f"w{i}", "all", "cancel", 1) for i in range(4))
        )
        while store._last is None or store._last.done():  # handed to the writer thread
            await asyncio.sleep(0)
            assert not writes.done()
        other.execute("COMMIT")
        created = await writes
        assert [c for c, _row in created] == [True] * 4
        assert {g.group_key for g in await store.open_groups()} >= {f"w{i}" for i in range(4)}
    finally:
        other.close()
        await store.aclose()
