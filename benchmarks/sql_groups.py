"""SQL tier benchmark: settled children/s through effecthost against the raw SQL it issues.

    .venv/bin/python benchmarks/sql_groups.py [--seconds 4.5] [--rounds 3] [--callers 1,4,16]
        [--big 1000] [--big-rounds 3] [--substrates postgres,sqlite] [--out FILE]

Starts a throwaway PostgreSQL (the tier's ``PostgresServer``) unless
``EFFECTHOST_POSTGRES_DSN`` is set (then a fresh schema on that server), and uses a SQLite
file in a temp dir. Side by side in the same run, per substrate:

- ``effecthost``: callers open a group through the host (``open_effect_group``, a trivial
  tool per child), wait for every rank (``await_next_settlement``) and close it (the group
  retires). Children/s counts settled-and-consumed children. Wake latency is measured from
  the moment a finalize transaction's commit is acknowledged to the store (the store's
  ``finalize``/``finalize_many`` returning) to the waiter's ``await_next_settlement``
  returning that child.
- ``raw``: the same work as the library's own SQL, with no effecthost layer: PostgreSQL
  through one asyncpg connection per caller calling the tier's ``eh_finalize`` function,
  SQLite through a bare ``sqlite3`` loop running the same statements under
  ``BEGIN IMMEDIATE``. Per 2-child group: insert the group row, insert the children
  (leased), finalize each child, read each rank (point lookup), close, retire.
- the 1,000-child group: one group opened and consumed by one caller through effecthost,
  against the raw single-row ceiling (the group row and children inserted, then every
  child finalized one transaction each from 16 connections: every commit bumps the one
  counter row) and, for reference, the raw batched form (``eh_finalize_many``, 8 children
  per transaction). SQLite's raw loop is one connection (one writer).

Each 2-child row alternates effecthost and raw rounds (``--rounds``, together
``--seconds`` per side); its rates are the medians of the rounds and its ratio the median
of the per-round ratios, so the drift of a shared machine cancels. Prints a table and
writes JSON (``--out``, default benchmarks/results/sql.json). The ratio is effecthost
children/s divided by raw children/s. The server, connections and
hosts are stopped in ``finally``, even on error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    Outcome,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store
from effecthost.hosts.sql._store import Finalize, GroupRow, Opened
from effecthost.hosts.sql.testing import PostgresServer

BIG_CONNECTIONS = 16
BATCH = 8
OWNER = "bench:raw"


def _registry() -> ToolRegistry:
    async def work(value: Any) -> Any:
        return value

    return ToolRegistry({"work": work})


def _group(key: str, n: int) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[
            EffectEnvelope(
                replay_key=f"{key}.c{i}", kind=EffectKind.TOOL_CALL, name="work", input=i
            )
            for i in range(n)
        ],
    )


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
            wakes.extend(await _consume(host, commits, _group(f"b{run}:group:{c}-{i}:0", 2)))
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
        wakes += await _consume(host, commits, _group(f"big{run}:group:g:0", n))
        rates.append(n / (time.perf_counter() - started))
    return {
        "children": n * rounds,
        "children_per_s": statistics.median(rates),
        "wake_p50_ms": _pct(wakes, 0.5) * 1e3,
        "wake_p95_ms": _pct(wakes, 0.95) * 1e3,
    }


def _result(children: int, elapsed: float, wakes: list[float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"children": children, "children_per_s": children / elapsed}
    if wakes is not None:
        out["wake_p50_ms"] = _pct(wakes, 0.5) * 1e3
        out["wake_p95_ms"] = _pct(wakes, 0.95) * 1e3
    return out


# -- the host alone ----------------------------------------------------------------------------


class NullStore:
    """A store that records nothing durable: just enough for one caller's 2-child groups
    to run through :class:`SqlEffectHost`. The row it gives is the host's own per-group
    cost (validation, hashing, tasks, cursor) with no SQL at all: the floor under every
    substrate's figure, measured on the same machine in the same run."""

    wakes_across_processes = False

    def __init__(self) -> None:
        self.open_at_finalize: set[str] = set()
        self.groups: dict[str, tuple[GroupRow, dict[str, int], dict[int, tuple[int, str, str]]]]
        self.groups = {}

    async def start(self) -> None:
        return None

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
    ) -> Opened:
        before()
        if sent is not None:
            sent.mark()
        row = GroupRow(group_key, wake, disposition, disposition, child_count, 0, "open", 0, None)
        self.groups[group_key] = (row, {s.replay_key: s.position for s in specs}, {})
        return Opened(True, row)

    async def insert_children(
        self, group_key: str, specs: list[Any], owner: str, ttl: float, sent: Any = None
    ) -> list[str]:
        self.groups[group_key][1].update((s.replay_key, s.position) for s in specs)
        return [s.replay_key for s in specs]

    async def finalize_many(self, owner: str, items: list[Finalize]) -> list[int | None]:
        seqs: list[int | None] = []
        for item in items:
            _row, positions, ranks = self.groups[item.replay_key.rsplit(".", 1)[0]]
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


def _row(
    workload: str, substrate: str, callers: int, lib: Any, raw: Any, ratio: float | None = None
) -> dict[str, Any]:
    if ratio is None and lib is not None and raw is not None:
        ratio = lib["children_per_s"] / raw["children_per_s"]
    return {
        "workload": workload,
        "substrate": substrate,
        "callers": callers,
        "effecthost": lib,
        "raw": raw,
        "ratio": ratio,
    }


async def _paired(
    rounds: int, lib: Callable[[], Awaitable[Any]], raw: Callable[[], Awaitable[Any]]
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Alternate effecthost and raw rounds; medians of each and of the per-round ratios
    (a shared machine drifts: a ratio of two runs taken apart would carry the drift)."""
    libs, raws = [], []
    for _ in range(rounds):
        libs.append(await lib())
        raws.append(await raw())
    ratio = statistics.median(
        a["children_per_s"] / b["children_per_s"] for a, b in zip(libs, raws, strict=True)
    )
    return _median(libs), _median(raws), ratio


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in results)
    out["children"] = sum(r["children"] for r in results)
    return out


async def _with_host(
    store: Store, body: Callable[[SqlEffectHost, _Commits], Awaitable[None]]
) -> None:
    host = SqlEffectHost(store, _registry())
    commits = _Commits(store)
    try:
        await host.start()
        await body(host, commits)
    finally:
        await host.aclose()


async def _measure(
    substrate: str,
    host: SqlEffectHost,
    commits: _Commits,
    options: argparse.Namespace,
    rows: list[Any],
    raw_small: Callable[[int, float], Awaitable[dict[str, Any]]],
    raw_big: Callable[[int, int, int], Awaitable[dict[str, Any]]],
) -> None:
    """The rows of one substrate: 2-child groups per caller count, then the big group."""
    await lib_small(host, commits, 1, min(1.0, options.seconds))  # warm up
    await raw_small(1, min(1.0, options.seconds))
    each = options.seconds / options.rounds
    for callers in options.callers:
        lib, base, ratio = await _paired(
            options.rounds,
            lambda c=callers: lib_small(host, commits, c, each),
            lambda c=callers: raw_small(c, each),
        )
        rows.append(_row("2-child groups", substrate, callers, lib, base, ratio))
        print(
            f"  {substrate} 2-child x{callers}: {lib['children_per_s']:.0f}/s "
            f"raw {base['children_per_s']:.0f}/s",
            file=sys.stderr,
        )
    if options.big:
        n, rounds = options.big, options.big_rounds
        lib = await lib_big(host, commits, n, rounds)
        single = await raw_big(n, rounds, 1)
        batched = await raw_big(n, rounds, BATCH)
        rows.append(_row(f"{n}-child group", substrate, 1, lib, single))
        rows.append(_row(f"raw batched ({BATCH}/tx)", substrate, 1, None, batched))


async def bench_postgres(dsn: str, options: argparse.Namespace, rows: list[Any]) -> None:
    import asyncpg  # type: ignore[import-untyped]

    schema = f"ehbench_{secrets.token_hex(4)}"
    pool = max(options.callers) + 4
    raw = RawPostgres(asyncpg, dsn, schema)
    conns: list[Any] = []
    try:

        async def body(host: SqlEffectHost, commits: _Commits) -> None:
            conns.extend(
                [await raw.connect() for _ in range(max(*options.callers, BIG_CONNECTIONS))]
            )
            await _measure(
                "postgres",
                host,
                commits,
                options,
                rows,
                lambda c, seconds: raw.small(conns[:c], seconds),
                lambda n, rounds, batch: raw.big(conns[:BIG_CONNECTIONS], n, rounds, batch),
            )

        await _with_host(PostgresStore(dsn, schema=schema, pool_size=pool), body)
    finally:
        for conn in conns:
            await conn.close()


async def bench_sqlite(work_dir: Path, options: argparse.Namespace, rows: list[Any]) -> None:
    path = work_dir / "bench.sqlite3"
    raw: RawSqlite | None = None
    try:

        async def body(host: SqlEffectHost, commits: _Commits) -> None:
            nonlocal raw
            raw = bare = RawSqlite(path)

            async def small(_callers: int, seconds: float) -> dict[str, Any]:
                return bare.small(seconds)  # one writer: the bare loop has no callers

            async def big(n: int, rounds: int, batch: int) -> dict[str, Any]:
                return bare.big(n, rounds, batch)

            await _measure("sqlite", host, commits, options, rows, small, big)

        await _with_host(SqliteStore(path), body)
    finally:
        if raw is not None:
            raw.close()


async def main(options: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    document: dict[str, Any] = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "seconds": options.seconds,
        "rows": rows,
    }
    if "postgres" in options.substrates:
        dsn = os.environ.get("EFFECTHOST_POSTGRES_DSN")
        server: PostgresServer | None = None
        try:
            if not dsn:
                server = PostgresServer(fsync=not options.no_fsync)
                dsn = server.start()
            import asyncpg

            conn = await asyncpg.connect(dsn)
            try:
                document["postgres"] = await conn.fetchval("SHOW server_version")
                document["postgres_fsync"] = await conn.fetchval("SHOW fsync")
            finally:
                await conn.close()
            await bench_postgres(dsn, options, rows)
        finally:
            if server is not None:
                server.stop()
    if "sqlite" in options.substrates:
        await bench_sqlite(work_dir, options, rows)
    if options.floor:
        store: Any = NullStore()

        async def floor(host: SqlEffectHost, commits: _Commits) -> None:
            await lib_small(host, commits, 1, min(1.0, options.seconds))  # warm up
            lib = await lib_small(host, commits, 1, options.seconds / 2)
            rows.append(_row("host alone (no SQL)", "none", 1, lib, None))

        await _with_host(store, floor)
    return document


def table(document: dict[str, Any]) -> str:
    header = (
        f"{'workload':<24}{'db':<10}{'callers':>7}{'eh children/s':>15}{'raw children/s':>16}"
        f"{'ratio':>7}{'wake p50 ms':>13}{'wake p95 ms':>13}"
    )
    lines = [
        f"postgres={document.get('postgres', '-')} (fsync={document.get('postgres_fsync', '-')})"
        f"  sqlite={document['sqlite']}  python={document['python']}  cpus={document['cpus']}"
        "  (eh = effecthost end to end, raw = the same SQL without effecthost)",
        header,
        "-" * len(header),
    ]
    for row in document["rows"]:
        lib, raw = row["effecthost"], row["raw"]
        if raw is None:
            lines.append(
                f"{row['workload']:<24}{row['substrate']:<10}{row['callers']:>7}"
                f"{lib['children_per_s']:>15.0f}"
            )
            continue
        if lib is None:
            lines.append(
                f"{row['workload']:<24}{row['substrate']:<10}{'':>7}{'':>15}"
                f"{raw['children_per_s']:>16.0f}"
            )
            continue
        lines.append(
            f"{row['workload']:<24}{row['substrate']:<10}{row['callers']:>7}"
            f"{lib['children_per_s']:>15.0f}{raw['children_per_s']:>16.0f}{row['ratio']:>7.2f}"
            f"{lib['wake_p50_ms']:>13.2f}{lib['wake_p95_ms']:>13.2f}"
        )
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.5, help="per side of each 2-child row")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating effecthost/raw rounds per row"
    )
    parser.add_argument(
        "--callers", default="1,4,16", help="concurrent callers for the 2-child groups"
    )
    parser.add_argument("--big", type=int, default=1000, help="children of the big group (0: skip)")
    parser.add_argument("--big-rounds", type=int, default=3)
    parser.add_argument("--substrates", default="postgres,sqlite")
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="run the throwaway PostgreSQL with fsync=off (not durable; default: fsync=on)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the host-alone row (2-child groups over a store that records nothing)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sql.json")
    options = parser.parse_args()
    options.callers = [int(c) for c in options.callers.split(",")]
    options.substrates = options.substrates.split(",")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="effecthost-bench-") as tmp:
        try:
            document = asyncio.run(main(options, Path(tmp)))
        except KeyboardInterrupt:
            raise SystemExit("interrupted; the server was stopped") from None
    document["wall_s"] = round(time.perf_counter() - started, 1)
    print(table(document))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {options.out} in {document['wall_s']} s")


if __name__ == "__main__":
    cli()
