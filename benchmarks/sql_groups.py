"""SQL tier benchmark: settled children/s through effecthost against the honest ceiling.

    .venv/bin/python benchmarks/sql_groups.py [--seconds 4.5] [--rounds 3] [--callers 1,4,16]
        [--big 1000] [--big-rounds 3] [--substrates postgres,sqlite] [--fsync on,off]
        [--raw] [--out FILE]

Starts a throwaway PostgreSQL (the tier's ``PostgresServer``) per ``--fsync`` setting, fsync
on first (durable: the headline), unless ``EFFECTHOST_POSTGRES_DSN`` is set (then fresh
schemas on that server, as it is configured); SQLite files live in a temp dir. Per
substrate, side by side in the same run:

- ``effecthost``: callers open a group through the host (``open_effect_group``, a trivial
  tool per child), wait for every rank (``await_next_settlement``) and close it (the group
  retires). Children/s counts settled-and-consumed children. Wake latency runs from a
  finalize transaction's commit being acknowledged to the store (``finalize`` /
  ``finalize_many`` returning) to the waiter's ``await_next_settlement`` returning that child.
- ``ceiling``: the honest ceiling of ``sql_ceilings.py``, the fewest round trips doing the
  same durable work on the host's own tables (open, one batched finalize, one range read,
  close-and-retire: 4 calls per group, whatever its width).
- ``raw`` (``--raw`` only): the earlier baseline, the tier's own statements one by one
  (16 round trips per 2-child group on PostgreSQL; the big group finalized one transaction
  per child from 16 connections).

Every row alternates its sides round by round (``--rounds`` for the 2-child rows, together
``--seconds`` per side; ``--big-rounds`` for the big group), the first to go rotating. The
ratio is effecthost children/s ÷ ceiling children/s per round; a row gives the median and
the range of those ratios, and the median and range of each side's rate, so the drift of
a shared machine cancels. ``host alone`` (unless ``--no-floor``) is a third side of every
2-child row: the same callers' groups through the host over a store that records nothing
(:class:`NullStore`), the host's own cost per group with no SQL.

``bound`` (SQLite rows): the largest ratio any host on this seam could reach. SQLite runs
in the caller's process on its one thread, so a host's time per group is at least its
seam's time with no SQL (``host alone``) plus the SQL work, which the ceiling does with the
fewest statements G-31 allows; per round, bound = ceiling µs per group ÷ (ceiling µs per
group + host alone µs per group), µs per group = 2e6 ÷ children/s. The ceiling's envelopes
and hashes (``prep_us_per_group``, timed beside each ceiling round) are work the host alone
does too, so they are taken off the ceiling's side of the sum. A ratio near its bound
leaves nothing to win without changing the seam. No bound for PostgreSQL: its server works
in another process, on the other core, overlapping the host's time rather than adding to it.

Prints one table per substrate and writes JSON (``--out``, default
benchmarks/results/sql.json). The servers, connections and hosts are stopped in
``finally``, even on error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _bench import echo_tools, machine, percentile, postgres, run, work_group
from sql_ceilings import PostgresCeiling, SqliteCeiling, prep_us_per_group

from effecthost.contract import EffectGroup, Outcome
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store
from effecthost.hosts.sql._store import Finalize, GroupRow, Opened

BIG_CONNECTIONS = 16
OWNER = "bench:raw"


_RUN = iter(range(1_000_000))


# -- effecthost -----------------------------------------------------------------------------


class _Commits:
    """Records when each child's finalize commit was acknowledged (the store returning)."""

    def __init__(self, store: Store) -> None:
        self.at: dict[str, float] = {}
        single, many = store.finalize, store.finalize_many

        async def finalize(
            replay_key: str, envelope_hash: str, owner: str, fence: int, outcome: str
        ) -> int | None:
            seq = await single(replay_key, envelope_hash, owner, fence, outcome)
            if seq is not None:
                self.at[replay_key] = time.perf_counter()
            return seq

        async def finalize_many(owner: str, items: list[Finalize]) -> list[int | None]:
            seqs = await many(owner, items)
            now = time.perf_counter()
            for item, seq in zip(items, seqs, strict=True):
                if seq is not None:
                    self.at[item.replay_key] = now
            return seqs

        store.finalize = finalize  # type: ignore[method-assign]
        store.finalize_many = finalize_many  # type: ignore[method-assign]


async def _consume(host: SqlEffectHost, commits: _Commits, group: EffectGroup) -> list[float]:
    wakes = []
    handle = await host.open_effect_group(group)
    while not handle.exhausted:
        settlement = await host.await_next_settlement(handle)
        at = commits.at.pop(settlement.replay_key, None)
        if at is not None:
            wakes.append(time.perf_counter() - at)
    await host.close_effect_group(handle)
    return wakes


async def lib_small(
    host: SqlEffectHost, commits: _Commits, callers: int, seconds: float
) -> dict[str, Any]:
    run = next(_RUN)
    wakes: list[float] = []
    done = [0]
    stop = time.perf_counter() + seconds

    async def caller(c: int) -> None:
        i = 0
        while time.perf_counter() < stop:
            wakes.extend(await _consume(host, commits, work_group(f"b{run}:group:{c}-{i}:0", 2)))
            done[0] += 2
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    elapsed = time.perf_counter() - started
    return _result(done[0], elapsed, wakes)


async def lib_big(host: SqlEffectHost, commits: _Commits, n: int, rounds: int) -> dict[str, Any]:
    rates, wakes = [], []
    for _ in range(rounds):
        run = next(_RUN)
        started = time.perf_counter()
        wakes += await _consume(host, commits, work_group(f"big{run}:group:g:0", n))
        rates.append(n / (time.perf_counter() - started))
    return {
        "children": n * rounds,
        "children_per_s": statistics.median(rates),
        "wake_p50_ms": percentile(wakes, 0.5) * 1e3,
        "wake_p95_ms": percentile(wakes, 0.95) * 1e3,
    }


def _result(children: int, elapsed: float, wakes: list[float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"children": children, "children_per_s": children / elapsed}
    if wakes is not None:
        out["wake_p50_ms"] = percentile(wakes, 0.5) * 1e3
        out["wake_p95_ms"] = percentile(wakes, 0.95) * 1e3
    return out


# -- the host alone ----------------------------------------------------------------------------


class NullStore:
    """A store that records nothing durable: just enough for groups that run to completion
    (any width, any number of concurrent callers, through ``all_`` too) to run through
    :class:`SqlEffectHost`. What it gives is the host's own per-group cost (validation,
    hashing, tasks, cursor) with no SQL at all: the floor under every substrate's figure,
    measured on the same machine in the same run."""

    wakes_across_processes = False
    change_poll = None
    input_errors: tuple[type[BaseException], ...] = ()
    driver_errors: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self.open_at_finalize: set[str] = set()
        self.groups: dict[str, tuple[GroupRow, dict[str, int], dict[int, tuple[int, str, str]]]]
        self.groups = {}
        self.group_of: dict[str, str] = {}

    async def start(self) -> None:
        return None

    async def recorded_sealing(self) -> bool | None:
        return False  # a plaintext deployment

    async def aclose(self) -> None:
        return None

    async def now(self) -> float:
        return time.time()

    async def next_due(self) -> float | None:
        return None

    async def due_sleeps(self) -> list[Any]:
        return []

    async def renew(
        self, owner: str, ttl: float, keys: list[str], groups: list[str], sent: Any = None
    ) -> tuple[list[Any], list[str]]:
        return [], groups

    async def open_group(
        self,
        group_key: str,
        wake: str,
        disposition: str,
        child_count: int,
        specs: list[Any],
        owner: str,
        ttl: float,
        before: Any,
        *,
        reopen: Any = None,
        sent: Any = None,
        trace_context: Any = None,
    ) -> Opened:
        before()
        if sent is not None:
            sent.mark()
        row = GroupRow(group_key, wake, disposition, disposition, child_count, 0, "open", 0, None)
        self.groups[group_key] = (row, {}, {})
        await self.insert_children(group_key, specs, owner, ttl)
        return Opened(True, row)

    async def insert_children(
        self, group_key: str, specs: list[Any], owner: str, ttl: float, sent: Any = None
    ) -> list[str]:
        self.groups[group_key][1].update((s.replay_key, s.position) for s in specs)
        self.group_of.update((s.replay_key, group_key) for s in specs)
        return [s.replay_key for s in specs]

    async def finalize_many(self, owner: str, items: list[Finalize]) -> list[int | None]:
        seqs: list[int | None] = []
        for item in items:
            _row, positions, ranks = self.groups[self.group_of.pop(item.replay_key)]
            ranks[len(ranks) + 1] = (positions[item.replay_key], item.replay_key, item.outcome)
            seqs.append(len(ranks))
        return seqs

    async def finalize(
        self, replay_key: str, envelope_hash: str, owner: str, fence: int, outcome: str
    ) -> int | None:
        return (await self.finalize_many(owner, [Finalize(replay_key, "", fence, outcome)]))[0]

    async def read_ranks(self, group_key: str, seq: int, limit: int) -> Any:
        row, _positions, ranks = self.groups[group_key]
        return row, [(s, *v) for s, v in ranks.items() if seq <= s < seq + limit]

    async def close_group(
        self, group_key: str, decide: Any, expect: Any = None
    ) -> tuple[GroupRow, bool, bool]:
        row = self.groups.pop(group_key)[0]
        decide(row, None)
        return row, True, True

    async def retire_closed(self, group_key: str) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(f"NullStore.{name}: not on the 2-child path")


# -- raw PostgreSQL (asyncpg, the tier's own SQL) -------------------------------------------

NOW = "extract(epoch from clock_timestamp())::float8"
OUTCOME = Outcome.success(0).model_dump_json()


class RawPostgres:
    def __init__(self, asyncpg: Any, dsn: str, schema: str) -> None:
        self.asyncpg, self.dsn, self.schema = asyncpg, dsn, schema
        self.channel = f"effecthost_{schema}"

    async def connect(self) -> Any:
        return await self.asyncpg.connect(self.dsn, server_settings={"search_path": self.schema})

    async def open(self, conn: Any, key: str, n: int) -> list[str]:
        await conn.fetchrow(
            "INSERT INTO eh_groups (group_key, wake, disposition, effective, child_count, "
            f"created_at) VALUES ($1, 'all', 'run_to_completion', 'run_to_completion', $2, "
            f"{NOW}) ON CONFLICT (group_key) DO NOTHING RETURNING group_key",
            key,
            n,
        )
        keys = [f"{key}.c{i}" for i in range(n)]
        await conn.fetch(
            "INSERT INTO eh_children (replay_key, group_key, position, kind, name, envelope, "
            "envelope_hash, state, lease_owner, fence, lease_expires, attempt) "
            f"SELECT k, $1, p, 'tool_call', 'work', '{{}}', 'h', 'claimed', $2, 1, {NOW} + 30, "
            "1 FROM unnest($3::text[], $4::int[]) AS t(k, p) "
            "ON CONFLICT DO NOTHING RETURNING replay_key",
            key,
            OWNER,
            keys,
            list(range(n)),
        )
        return keys

    async def finalize(self, conn: Any, replay_key: str) -> None:
        await conn.fetchval(
            "SELECT eh_finalize($1, 'h', $2, 1, $3, $4)", replay_key, OWNER, OUTCOME, self.channel
        )

    async def finalize_many(self, conn: Any, keys: list[str]) -> None:
        await conn.fetchval(
            "SELECT eh_finalize_many($1, $2, $3, $4, $5, $6)",
            keys,
            ["h"] * len(keys),
            OWNER,
            [1] * len(keys),
            [OUTCOME] * len(keys),
            self.channel,
        )

    async def read_rank(self, conn: Any, key: str, seq: int) -> None:
        await conn.fetchrow(
            "SELECT g.group_key, g.counter, g.state, c.position, c.replay_key, c.outcome "
            "FROM eh_groups g LEFT JOIN eh_children c ON c.group_key = g.group_key "
            "AND c.seq = $1 WHERE g.group_key = $2",
            seq,
            key,
        )

    async def close_and_retire(self, conn: Any, key: str) -> None:
        async with conn.transaction():
            await conn.execute(
                "UPDATE eh_groups SET effective = 'run_to_completion', state = 'closed', "
                f"closed_at = coalesce(closed_at, {NOW}) WHERE group_key = $1",
                key,
            )
            await conn.execute("SELECT pg_notify($1, $2)", self.channel, "c:" + key)
        async with conn.transaction():
            await conn.fetch("SELECT state FROM eh_children WHERE group_key = $1 FOR UPDATE", key)
            await conn.fetchval(
                "DELETE FROM eh_groups WHERE group_key = $1 AND state = 'closed' "
                "RETURNING effective",
                key,
            )
            await conn.execute("DELETE FROM eh_children WHERE group_key = $1", key)
            await conn.execute(
                "INSERT INTO eh_retired (group_key, effective, retired_at) "
                f"VALUES ($1, 'run_to_completion', {NOW}) ON CONFLICT DO NOTHING",
                key,
            )

    async def small(self, conns: list[Any], seconds: float) -> dict[str, Any]:
        run = next(_RUN)
        done = [0]
        stop = time.perf_counter() + seconds

        async def caller(c: int, conn: Any) -> None:
            i = 0
            while time.perf_counter() < stop:
                key = f"r{run}:group:{c}-{i}:0"
                keys = await self.open(conn, key, 2)
                for replay_key in keys:
                    await self.finalize(conn, replay_key)
                for seq in (1, 2):
                    await self.read_rank(conn, key, seq)
                await self.close_and_retire(conn, key)
                done[0] += 2
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(caller(c, conn) for c, conn in enumerate(conns)))
        return _result(done[0], time.perf_counter() - started)

    async def big(self, conns: list[Any], n: int, rounds: int, batch: int) -> dict[str, Any]:
        rates = []
        for _ in range(rounds):
            key = f"rbig{next(_RUN)}:group:g:0"
            started = time.perf_counter()
            keys = await self.open(conns[0], key, n)
            chunks = [keys[i : i + batch] for i in range(0, n, batch)]

            async def worker(conn: Any, chunks: list[list[str]] = chunks) -> None:
                while chunks:
                    chunk = chunks.pop()
                    if len(chunk) == 1:
                        await self.finalize(conn, chunk[0])
                    else:
                        await self.finalize_many(conn, chunk)

            await asyncio.gather(*(worker(conn) for conn in conns))
            rates.append(n / (time.perf_counter() - started))
        return {"children": n * rounds, "children_per_s": statistics.median(rates)}


# -- raw SQLite (a bare sqlite3 loop, the tier's own statements) ----------------------------

SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class RawSqlite:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")

    def close(self) -> None:
        self.conn.close()

    def tx(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            out = body(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return out

    def open(self, key: str, n: int) -> list[str]:
        keys = [f"{key}.c{i}" for i in range(n)]

        def group(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO eh_groups (group_key, wake, disposition, effective, child_count, "
                f"created_at) VALUES (?, 'all', 'run_to_completion', 'run_to_completion', ?, "
                f"{SQLITE_NOW}) ON CONFLICT (group_key) DO NOTHING",
                (key, n),
            )
            c.execute("SELECT counter FROM eh_groups WHERE group_key = ?", (key,)).fetchone()

        def children(c: sqlite3.Connection) -> None:
            for i, k in enumerate(keys):
                c.execute(
                    "INSERT INTO eh_children (replay_key, group_key, position, kind, name, "
                    "envelope, envelope_hash, state, lease_owner, fence, lease_expires, "
                    f"attempt) VALUES (?, ?, ?, 'tool_call', 'work', '{{}}', 'h', 'claimed', ?, "
                    f"1, {SQLITE_NOW} + 30, 1) ON CONFLICT DO NOTHING",
                    (k, key, i, OWNER),
                )

        self.tx(group)
        self.tx(children)
        return keys

    def finalize(self, keys: list[str]) -> None:
        """One transaction: each child's fenced update, one counter bump, the sequences."""

        def body(c: sqlite3.Connection) -> None:
            matched, group = [], None
            for k in keys:
                row = c.execute(
                    "UPDATE eh_children SET state = 'settled', outcome = ?, lease_owner = NULL, "
                    f"lease_expires = NULL, settled_at = {SQLITE_NOW} WHERE replay_key = ? "
                    "AND envelope_hash = 'h' AND lease_owner = ? AND fence = 1 "
                    "AND state = 'claimed' RETURNING group_key",
                    (OUTCOME, k, OWNER),
                ).fetchone()
                if row is not None:
                    matched.append(k)
                    group = row[0]
            top = c.execute(
                "UPDATE eh_groups SET counter = counter + ? WHERE group_key = ? RETURNING counter",
                (len(matched), group),
            ).fetchone()[0]
            for i, k in enumerate(matched):
                c.execute(
                    "UPDATE eh_children SET seq = ? WHERE replay_key = ?",
                    (top - len(matched) + i + 1, k),
                )

        self.tx(body)

    def read_rank(self, key: str, seq: int) -> None:
        self.conn.execute(
            "SELECT g.group_key, g.counter, g.state, c.position, c.replay_key, c.outcome "
            "FROM eh_groups g LEFT JOIN eh_children c ON c.group_key = g.group_key "
            "AND c.seq = ? WHERE g.group_key = ?",
            (seq, key),
        ).fetchone()

    def close_and_retire(self, key: str) -> None:
        def close(c: sqlite3.Connection) -> None:
            c.execute(
                "UPDATE eh_groups SET effective = 'run_to_completion', state = 'closed', "
                f"closed_at = coalesce(closed_at, {SQLITE_NOW}) WHERE group_key = ?",
                (key,),
            )

        def retire(c: sqlite3.Connection) -> None:
            c.execute(
                "SELECT count(*) FROM eh_children WHERE group_key = ? AND state <> 'settled'",
                (key,),
            ).fetchone()
            c.execute(
                "DELETE FROM eh_groups WHERE group_key = ? AND state = 'closed' "
                "RETURNING effective",
                (key,),
            ).fetchone()
            c.execute("DELETE FROM eh_children WHERE group_key = ?", (key,))
            c.execute(
                "INSERT INTO eh_retired (group_key, effective, retired_at) "
                f"VALUES (?, 'run_to_completion', {SQLITE_NOW}) ON CONFLICT DO NOTHING",
                (key,),
            )

        self.tx(close)
        self.tx(retire)

    def small(self, seconds: float) -> dict[str, Any]:
        run, done, i = next(_RUN), 0, 0
        started = time.perf_counter()
        stop = started + seconds
        while time.perf_counter() < stop:
            key = f"r{run}:group:0-{i}:0"
            for k in self.open(key, 2):
                self.finalize([k])
            for seq in (1, 2):
                self.read_rank(key, seq)
            self.close_and_retire(key)
            done += 2
            i += 1
        return _result(done, time.perf_counter() - started)

    def big(self, n: int, rounds: int, batch: int) -> dict[str, Any]:
        rates = []
        for _ in range(rounds):
            key = f"rbig{next(_RUN)}:group:g:0"
            started = time.perf_counter()
            keys = self.open(key, n)
            for i in range(0, n, batch):
                self.finalize(keys[i : i + batch])
            rates.append(n / (time.perf_counter() - started))
        return {"children": n * rounds, "children_per_s": statistics.median(rates)}


# -- the run --------------------------------------------------------------------------------

Side = Callable[[], Awaitable[dict[str, Any]]]


async def _alternating(rounds: int, sides: dict[str, Side]) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of every side in turn, the first to go rotating: a shared machine
    drifts, and a ratio of two measurements taken apart would carry the drift."""
    names = list(sides)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i in range(rounds):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(await sides[name]())
    return out


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of each figure over the rounds, the range of the rate, and every round."""
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in results)
    rates = [r["children_per_s"] for r in results]
    out.update(children=sum(r["children"] for r in results), min=min(rates), max=max(rates))
    out["rounds"] = rates
    return out


def _us_per_group(results: list[dict[str, Any]]) -> list[float]:
    """Per round, the µs one 2-child group takes (all callers together): 2e6 ÷ children/s."""
    return [2e6 / r["children_per_s"] for r in results]


def _row(
    workload: str,
    substrate: str,
    fsync: str | None,
    callers: int,
    measured: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Ratio = effecthost ÷ honest ceiling, per round; the row gives their median and range.
    On SQLite, with the host alone measured beside them, also the bound per round: ceiling
    µs per group ÷ (ceiling µs per group − its envelopes and hashes + host alone µs per
    group)."""
    row: dict[str, Any] = {
        "workload": workload,
        "substrate": substrate,
        "fsync": fsync,
        "callers": callers,
        "effecthost": _summary(measured["effecthost"]),
        "ceiling": _summary(measured["ceiling"]),
        "raw": _summary(measured["raw"]) if "raw" in measured else None,
        "host_alone": None,
        "bound": None,
    }
    ratios = [
        a["children_per_s"] / b["children_per_s"]
        for a, b in zip(measured["effecthost"], measured["ceiling"], strict=True)
    ]
    row.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
    row["ratios"] = ratios
    if "host alone" in measured:
        alone_us = _us_per_group(measured["host alone"])
        row["host_alone"] = {
            **_summary(measured["host alone"]),
            "us_per_group": statistics.median(alone_us),
            "us_per_group_rounds": alone_us,
        }
        if substrate == "sqlite":
            ceiling_us = _us_per_group(measured["ceiling"])
            prep_us = [r["prep_us_per_group"] for r in measured["ceiling"]]
            bounds = [
                c / (c - p + a) for c, p, a in zip(ceiling_us, prep_us, alone_us, strict=True)
            ]
            row["bound"] = {
                "median": statistics.median(bounds),
                "min": min(bounds),
                "max": max(bounds),
                "rounds": bounds,
                "ceiling_us_per_group_rounds": ceiling_us,
                "prep_us_per_group_rounds": prep_us,
            }
    return row


async def _with_host(
    store: Store, body: Callable[[SqlEffectHost, _Commits], Awaitable[None]]
) -> None:
    host = SqlEffectHost(store, echo_tools("work"))
    commits = _Commits(store)
    try:
        await host.start()
        await body(host, commits)
    finally:
        await host.aclose()


Small = Callable[[int, float], Awaitable[dict[str, Any]]]
Big = Callable[[int], Awaitable[dict[str, Any]]]
Alone = tuple[SqlEffectHost, _Commits] | None
"""The host over a :class:`NullStore`, measured beside every 2-child row (None: not)."""


async def _measure(
    substrate: str,
    fsync: str | None,
    host: SqlEffectHost,
    commits: _Commits,
    options: argparse.Namespace,
    rows: list[Any],
    baselines: dict[str, tuple[Small, Big]],
    alone: Alone,
) -> None:
    """The rows of one substrate: 2-child groups per caller count, then the big group,
    each alternating effecthost with its baselines (the ceiling, and the raw loop when
    asked for) round by round, and the 2-child rows with the host alone."""
    warm = min(1.0, options.seconds)
    await lib_small(host, commits, 1, warm)
    for small, _big in baselines.values():
        await small(1, warm)
    if alone is not None:
        await lib_small(*alone, 1, warm)
    each = options.seconds / options.rounds
    for callers in options.callers:
        sides: dict[str, Side] = {
            "effecthost": lambda c=callers: lib_small(host, commits, c, each)  # type: ignore[misc]
        }
        for name, (small, _big) in baselines.items():
            sides[name] = lambda c=callers, small=small: small(c, each)  # type: ignore[misc]
        if alone is not None:
            sides["host alone"] = lambda c=callers: lib_small(*alone, c, each)  # type: ignore[misc]
        row = _row(
            "2-child groups", substrate, fsync, callers, await _alternating(options.rounds, sides)
        )
        rows.append(row)
        bound = f", bound {row['bound']['median']:.2f}" if row["bound"] else ""
        print(
            f"  {substrate}{'' if fsync is None else f' fsync={fsync}'} 2-child x{callers}: "
            f"{row['effecthost']['children_per_s']:.0f}/s, ceiling "
            f"{row['ceiling']['children_per_s']:.0f}/s, ratio {row['ratio']:.2f}{bound}",
            file=sys.stderr,
        )
    if options.big:
        n = options.big
        sides = {"effecthost": lambda: lib_big(host, commits, n, 1)}
        for name, (_small, big) in baselines.items():
            sides[name] = lambda big=big: big(n)  # type: ignore[misc]
        measured = await _alternating(options.big_rounds, sides)
        rows.append(_row(f"{n}-child group", substrate, fsync, 1, measured))


async def bench_postgres(
    dsn: str, fsync: str, options: argparse.Namespace, rows: list[Any], alone: Alone
) -> None:
    import asyncpg  # type: ignore[import-untyped]

    schema = f"ehbench_{secrets.token_hex(4)}"
    pool = max(options.callers) + 4
    raw = RawPostgres(asyncpg, dsn, schema)
    ceiling = PostgresCeiling(dsn)
    conns: list[Any] = []
    try:
        await ceiling.start(max(options.callers))

        async def body(host: SqlEffectHost, commits: _Commits) -> None:
            baselines: dict[str, tuple[Small, Big]] = {
                "ceiling": (ceiling.small, lambda n: ceiling.big(n, 1))
            }
            if options.raw:
                conns.extend(
                    [await raw.connect() for _ in range(max(*options.callers, BIG_CONNECTIONS))]
                )
                baselines["raw"] = (
                    lambda c, seconds: raw.small(conns[:c], seconds),
                    lambda n: raw.big(conns[:BIG_CONNECTIONS], n, 1, 1),
                )
            await _measure("postgres", fsync, host, commits, options, rows, baselines, alone)

        await _with_host(PostgresStore(dsn, schema=schema, pool_size=pool), body)
    finally:
        for conn in conns:
            await conn.close()
        await ceiling.aclose()


async def bench_sqlite(
    work_dir: Path, options: argparse.Namespace, rows: list[Any], alone: Alone
) -> None:
    path = work_dir / "bench.sqlite3"
    ceiling = SqliteCeiling(work_dir / "ceiling.sqlite3")
    raw: RawSqlite | None = None
    try:

        async def body(host: SqlEffectHost, commits: _Commits) -> None:
            nonlocal raw

            async def small(callers: int, seconds: float) -> dict[str, Any]:
                got = ceiling.small(callers, seconds)
                return {**got, "prep_us_per_group": prep_us_per_group(2)}

            async def big(n: int) -> dict[str, Any]:
                return ceiling.big(n, 1)

            baselines: dict[str, tuple[Small, Big]] = {"ceiling": (small, big)}
            if options.raw:
                raw = bare = RawSqlite(path)

                async def raw_small(_callers: int, seconds: float) -> dict[str, Any]:
                    return bare.small(seconds)  # one writer: the bare loop has no callers

                async def raw_big(n: int) -> dict[str, Any]:
                    return bare.big(n, 1, 1)

                baselines["raw"] = (raw_small, raw_big)
            await _measure("sqlite", None, host, commits, options, rows, baselines, alone)

        await _with_host(SqliteStore(path), body)
    finally:
        if raw is not None:
            raw.close()
        ceiling.close()


async def main(options: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    import asyncpg

    rows: list[dict[str, Any]] = []
    document: dict[str, Any] = {
        **machine(sqlite=True, load=None),
        "seconds": options.seconds,
        "rounds": options.rounds,
        "big_rounds": options.big_rounds,
        "loadavg": os.getloadavg(),
        "rows": rows,
    }

    async def substrates(alone: Alone) -> None:
        if "postgres" in options.substrates:
            external = os.environ.get("EFFECTHOST_POSTGRES_DSN")
            for fsync in [None] if external else options.fsync:
                with postgres(fsync=fsync != "off") as dsn:
                    conn = await asyncpg.connect(dsn)
                    try:
                        document["postgres"] = await conn.fetchval("SHOW server_version")
                        shown = await conn.fetchval("SHOW fsync")
                    finally:
                        await conn.close()
                    await bench_postgres(dsn, shown, options, rows, alone)
        if "sqlite" in options.substrates:
            await bench_sqlite(work_dir, options, rows, alone)

    if options.floor:
        store: Any = NullStore()

        async def measured(host: SqlEffectHost, commits: _Commits) -> None:
            await substrates((host, commits))

        await _with_host(store, measured)
    else:
        await substrates(None)
    return document


def _span(summary: dict[str, Any]) -> str:
    return f"{summary['children_per_s']:.0f} ({summary['min']:.0f}–{summary['max']:.0f})"


def table(document: dict[str, Any]) -> str:
    """One table per substrate (PostgreSQL fsync on first: the headline)."""
    raw = any(row["raw"] is not None for row in document["rows"])
    alone = any(row.get("host_alone") for row in document["rows"])
    header = (
        f"{'workload':<18}{'callers':>7}{'effecthost children/s':>24}{'ceiling children/s':>24}"
        f"{'ratio':>6}{'(range)':>13}{'wake p50/p95 ms':>17}"
        + (f"{'alone µs/grp':>14}{'bound (range)':>19}" if alone else "")
        + (f"{'raw/s':>8}" if raw else "")
    )
    lines = [
        f"sqlite={document['sqlite']}  postgres={document.get('postgres', '-')}"
        f"  python={document['python']}  cpus={document['cpus']}"
        f"  load={' '.join(f'{x:.1f}' for x in document['loadavg'])}",
        "ratio = effecthost ÷ honest ceiling (median of per-round ratios, range in brackets)",
    ]
    if alone:
        lines += [
            "alone = the host over a store that records nothing (no SQL), µs per 2-child group;",
            "bound (SQLite, in the caller's thread) = the largest ratio a host on this seam can"
            " reach:",
            "  ceiling µs/grp ÷ (ceiling µs/grp − its envelopes+hashes + alone µs/grp), per round",
        ]
    keys: list[tuple[str, Any]] = []
    for row in document["rows"]:
        if (row["substrate"], row["fsync"]) not in keys:
            keys.append((row["substrate"], row["fsync"]))
    keys.sort(key=lambda k: (k[0] != "postgres", k[1] != "on"))
    for substrate, fsync in keys:
        title = substrate if fsync is None else f"{substrate}, fsync={fsync}"
        lines += ["", title, header, "-" * len(header)]
        for row in document["rows"]:
            if (row["substrate"], row["fsync"]) != (substrate, fsync):
                continue
            lib = row["effecthost"]
            span = f"({row['ratio_min']:.2f}–{row['ratio_max']:.2f})"
            wake = f"{lib['wake_p50_ms']:.2f}/{lib['wake_p95_ms']:.2f}"
            line = (
                f"{row['workload']:<18}{row['callers']:>7}{_span(lib):>24}"
                f"{_span(row['ceiling']):>24}{row['ratio']:>6.2f}{span:>13}{wake:>17}"
            )
            if alone:
                host_alone, bound = row.get("host_alone"), row.get("bound")
                line += f"{host_alone['us_per_group']:>14.0f}" if host_alone else f"{'':>14}"
                got = (
                    f"{bound['median']:.2f} ({bound['min']:.2f}–{bound['max']:.2f})"
                    if bound
                    else ""
                )
                line += f"{got:>19}"
            if raw:
                line += f"{row['raw']['children_per_s']:>8.0f}" if row["raw"] else ""
            lines.append(line.rstrip())
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=4.5, help="per side of each 2-child row, all rounds"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per row")
    parser.add_argument(
        "--callers", default="1,4,16", help="concurrent callers for the 2-child groups"
    )
    parser.add_argument("--big", type=int, default=1000, help="children of the big group (0: skip)")
    parser.add_argument("--big-rounds", type=int, default=3)
    parser.add_argument("--substrates", default="postgres,sqlite")
    parser.add_argument(
        "--fsync",
        default="on,off",
        help="PostgreSQL servers to run, in order: on (durable, the headline), off, or both",
    )
    parser.add_argument("--no-fsync", action="store_true", help="same as --fsync off")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="also alternate the earlier raw loop (statement by statement, the tier's own SQL)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the host alone (groups over a store that records nothing) and the bound",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sql.json")
    options = parser.parse_args()
    options.callers = [int(c) for c in options.callers.split(",")]
    options.substrates = options.substrates.split(",")
    options.fsync = ["off"] if options.no_fsync else options.fsync.split(",")
    if set(options.fsync) - {"on", "off"}:
        parser.error("--fsync takes on, off or on,off")
    run(lambda tmp: main(options, tmp), options.out, table)


if __name__ == "__main__":
    cli()
