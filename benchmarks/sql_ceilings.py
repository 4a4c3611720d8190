"""Honest SQL ceilings: the fewest round trips that do a group's durable work.

    .venv/bin/python benchmarks/sql_ceilings.py [--seconds 3] [--rounds 3] [--callers 1,4,16]
        [--big 1000] [--big-rounds 3] [--substrates postgres,sqlite] [--no-fsync] [--notify]
        [--out FILE]

The baseline an effecthost SQL figure is divided by. A 2-child group is 4 round trips:

1. open: ONE call that checks the tombstone (``eh_retired``) and inserts the group row and
   its children, leased, each with its canonical envelope and its sha256;
2. finalize: ONE call with the fenced UPDATE of every child (key, hash, owner, fence,
   state), then one counter bump for the rows that matched and their sequences;
3. ONE range read of the ranks (the group row and the children by ``seq``);
4. close and retire in ONE call: child rows locked, the group row deleted, the children
   deleted, the tombstone written.

PostgreSQL: each step is one plpgsql function call (the read, one statement) on one
asyncpg connection per caller. ``--notify`` adds the ``pg_notify`` a host needs to wake
waiters in other processes (not durable work; it serializes commits). SQLite (WAL,
``synchronous=NORMAL``): one writer, so the callers' groups move through the steps
together, each step one ``BEGIN IMMEDIATE`` transaction shared by all callers (group
commit), and each caller reads its own ranks. The big group is one group of ``--big``
children through the same 4 steps, the finalize of all its children in one call.

The tables are the host's own (its DDL), in a schema (PostgreSQL) or database file
(SQLite) of their own, so the host's tables are never touched. PostgreSQL is a throwaway
``PostgresServer`` with fsync on unless ``--no-fsync`` or ``EFFECTHOST_POSTGRES_DSN``.
Rows are the median (and range) of ``--rounds`` rounds of ``--seconds``/``--rounds``
each. Importable: :class:`PostgresCeiling` and :class:`SqliteCeiling` give ``small(callers,
seconds)`` and ``big(n, rounds)`` returning ``{"children", "children_per_s"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _bench import machine, postgres, ruled, run, substrate_options

from effecthost.contract import Outcome
from effecthost.hosts.sql._postgres import DDL as POSTGRES_DDL
from effecthost.hosts.sql._sqlite import DDL as SQLITE_DDL

OWNER = "bench:ceiling"
TTL = 30.0
OUTCOME = Outcome.success(0).model_dump_json()
EFFECTIVE = "run_to_completion"

_RUN = iter(range(1_000_000))


def children(key: str, n: int) -> tuple[list[str], list[str], list[str]]:
    """Replay keys, canonical envelopes and their sha256, as a host computes them once."""
    keys, envelopes, hashes = [], [], []
    for i in range(n):
        replay_key = f"{key}.c{i}"
        envelope = json.dumps(
            {"input": i, "kind": "tool_call", "name": "work", "replay_key": replay_key},
            sort_keys=True,
            separators=(",", ":"),
        )
        keys.append(replay_key)
        envelopes.append(envelope)
        hashes.append(hashlib.sha256(envelope.encode()).hexdigest())
    return keys, envelopes, hashes


def prep_us_per_group(n: int, groups: int = 500) -> float:
    """CPU µs per group of ``n`` children that :func:`children` costs (the envelopes and
    their hashes): work a host does in its seam too, so a bound that adds a host's seam to a
    ceiling takes it off the ceiling to count it once."""
    started = time.process_time()
    for i in range(groups):
        children(f"prep:group:{i}:0", n)
    return (time.process_time() - started) / groups * 1e6


def _result(children: int, elapsed: float) -> dict[str, Any]:
    return {"children": children, "children_per_s": children / elapsed}


# -- PostgreSQL ------------------------------------------------------------------------------

NOW = "extract(epoch from clock_timestamp())::float8"

FUNCTIONS = [
    f"""CREATE OR REPLACE FUNCTION ceil_open(
            p_key text, p_count integer, p_owner text, p_ttl float8, p_keys text[],
            p_envelopes text[], p_hashes text[])
        RETURNS float8 LANGUAGE plpgsql AS $$
        DECLARE
            created float8 := {NOW};
        BEGIN
            PERFORM 1 FROM eh_retired WHERE group_key = p_key;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'EH001', MESSAGE = 'group retired';
            END IF;
            INSERT INTO eh_groups (group_key, wake, disposition, effective, child_count,
                                   created_at, owner, owner_expires)
            VALUES (p_key, 'all', 'run_to_completion', 'run_to_completion', p_count,
                    created, p_owner, created + p_ttl)
            ON CONFLICT (group_key) DO NOTHING;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
            INSERT INTO eh_children (replay_key, group_key, position, kind, name, envelope,
                   envelope_hash, state, lease_owner, fence, lease_expires, attempt)
            SELECT k, p_key, (i - 1)::integer, 'tool_call', 'work', e, h, 'claimed',
                   p_owner, 1, created + p_ttl, 1
              FROM unnest(p_keys, p_envelopes, p_hashes) WITH ORDINALITY AS t(k, e, h, i);
            RETURN created;
        END $$""",
    f"""CREATE OR REPLACE FUNCTION ceil_finalize(
            p_group text, p_keys text[], p_hashes text[], p_owner text, p_fences bigint[],
            p_outcomes text[], p_channel text)
        RETURNS bigint LANGUAGE plpgsql
        SET plan_cache_mode = force_custom_plan AS $$
        DECLARE
            matched integer[];
            m integer;
            top bigint;
        BEGIN
            WITH done AS (
                UPDATE eh_children c SET state = 'settled', outcome = u.outcome,
                       lease_owner = NULL, lease_expires = NULL, settled_at = {NOW}
                  FROM unnest(p_keys, p_hashes, p_fences, p_outcomes)
                       WITH ORDINALITY AS u(key, hash, fence, outcome, i)
                 WHERE c.replay_key = u.key AND c.envelope_hash = u.hash
                   AND c.lease_owner = p_owner AND c.fence = u.fence AND c.state = 'claimed'
                RETURNING u.i)
            SELECT array_agg(i ORDER BY i) INTO matched FROM done;
            m := coalesce(array_length(matched, 1), 0);
            IF m = 0 THEN
                RETURN NULL;
            END IF;
            UPDATE eh_groups SET counter = counter + m WHERE group_key = p_group
            RETURNING counter INTO top;
            UPDATE eh_children c SET seq = top - m + r.k
              FROM unnest(matched) WITH ORDINALITY AS r(i, k)
             WHERE c.replay_key = p_keys[r.i];
            IF p_channel IS NOT NULL THEN
                PERFORM pg_notify(p_channel, 's:' || p_group);
            END IF;
            RETURN top;
        END $$""",
    f"""CREATE OR REPLACE FUNCTION ceil_close_retire(
            p_key text, p_effective text, p_channel text)
        RETURNS integer LANGUAGE plpgsql AS $$
        DECLARE
            n bigint;
        BEGIN
            SELECT count(*) FILTER (WHERE s.state <> 'settled') INTO n
              FROM (SELECT state FROM eh_children WHERE group_key = p_key
                     ORDER BY replay_key FOR UPDATE) s;
            IF p_channel IS NOT NULL THEN
                PERFORM pg_notify(p_channel, 'c:' || p_key);
            END IF;
            IF n > 0 THEN
                UPDATE eh_groups SET effective = p_effective, state = 'closed',
                       closed_at = coalesce(closed_at, {NOW})
                 WHERE group_key = p_key;
                RETURN 1;
            END IF;
            DELETE FROM eh_groups WHERE group_key = p_key;
            IF NOT FOUND THEN
                RETURN 0;
            END IF;
            DELETE FROM eh_children WHERE group_key = p_key;
            DELETE FROM eh_payloads WHERE group_key = p_key;
            INSERT INTO eh_retired (group_key, effective, retired_at)
            VALUES (p_key, p_effective, {NOW}) ON CONFLICT DO NOTHING;
            RETURN 2;
        END $$""",
]

RANKS = (
    "SELECT g.counter, g.state, c.seq, c.position, c.replay_key, c.outcome "
    "FROM eh_groups g LEFT JOIN eh_children c ON c.group_key = g.group_key "
    "AND c.seq >= $2 AND c.seq < $2 + $3 WHERE g.group_key = $1 ORDER BY c.seq"
)


class PostgresCeiling:
    """The 4-call group on PostgreSQL, in a schema of its own (dropped by ``aclose``)."""

    def __init__(self, dsn: str, *, notify: bool = False) -> None:
        self.dsn = dsn
        self.schema = f"ehceil_{secrets.token_hex(4)}"
        self.channel = f"effecthost_{self.schema}" if notify else None
        self.conns: list[Any] = []

    async def start(self, connections: int) -> None:
        import asyncpg  # type: ignore[import-untyped]

        admin = await asyncpg.connect(self.dsn)
        try:
            await admin.execute(f"CREATE SCHEMA {self.schema}")
            await admin.execute(f"SET search_path = {self.schema}")
            for statement in [*POSTGRES_DDL, *FUNCTIONS]:
                await admin.execute(statement)
        finally:
            await admin.close()
        for _ in range(connections):
            self.conns.append(
                await asyncpg.connect(self.dsn, server_settings={"search_path": self.schema})
            )

    async def aclose(self) -> None:
        import asyncpg

        for conn in self.conns:
            await conn.close()
        self.conns.clear()
        admin = await asyncpg.connect(self.dsn)
        try:
            await admin.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        finally:
            await admin.close()

    async def group(self, conn: Any, key: str, n: int) -> None:
        """One group's durable work in 4 round trips."""
        keys, envelopes, hashes = children(key, n)
        created = await conn.fetchval(
            "SELECT ceil_open($1, $2, $3, $4, $5, $6, $7)",
            key,
            n,
            OWNER,
            TTL,
            keys,
            envelopes,
            hashes,
        )
        assert created is not None, key
        top = await conn.fetchval(
            "SELECT ceil_finalize($1, $2, $3, $4, $5, $6, $7)",
            key,
            keys,
            hashes,
            OWNER,
            [1] * n,
            [OUTCOME] * n,
            self.channel,
        )
        assert top == n, (key, top)
        ranks = await conn.fetch(RANKS, key, 1, n)
        assert len(ranks) == n and ranks[-1]["seq"] == n, key
        retired = await conn.fetchval(
            "SELECT ceil_close_retire($1, $2, $3)", key, EFFECTIVE, self.channel
        )
        assert retired == 2, key

    async def small(self, callers: int, seconds: float) -> dict[str, Any]:
        run, done = next(_RUN), [0]
        stop = time.perf_counter() + seconds

        async def caller(c: int, conn: Any) -> None:
            i = 0
            while time.perf_counter() < stop:
                await self.group(conn, f"ceil{run}:group:{c}-{i}:0", 2)
                done[0] += 2
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(caller(c, conn) for c, conn in enumerate(self.conns[:callers])))
        return _result(done[0], time.perf_counter() - started)

    async def big(self, n: int, rounds: int) -> dict[str, Any]:
        rates = []
        for _ in range(rounds):
            started = time.perf_counter()
            await self.group(self.conns[0], f"ceilbig{next(_RUN)}:group:g:0", n)
            rates.append(n / (time.perf_counter() - started))
        return {"children": n * rounds, "children_per_s": statistics.median(rates)}


# -- SQLite ----------------------------------------------------------------------------------

SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class SqliteCeiling:
    """The 4-step group on SQLite, one writer: the callers' groups share each step's
    transaction (group commit), in a database file of its own."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        for statement in SQLITE_DDL:
            self.conn.execute(statement)

    def close(self) -> None:
        self.conn.close()

    def _tx(self, body: Any, groups: list[Any]) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for group in groups:
                body(c, *group)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    @staticmethod
    def _open(
        c: sqlite3.Connection, key: str, keys: list[str], envs: list[str], hashes: Any
    ) -> None:
        if c.execute("SELECT 1 FROM eh_retired WHERE group_key = ?", (key,)).fetchone():
            raise RuntimeError(f"group retired: {key}")
        c.execute(
            "INSERT INTO eh_groups (group_key, wake, disposition, effective, child_count, "
            "created_at, owner, owner_expires) VALUES (?, 'all', 'run_to_completion', "
            f"'run_to_completion', ?, {SQLITE_NOW}, ?, {SQLITE_NOW} + ?)",
            (key, len(keys), OWNER, TTL),
        )
        c.executemany(
            "INSERT INTO eh_children (replay_key, group_key, position, kind, name, envelope, "
            "envelope_hash, state, lease_owner, fence, lease_expires, attempt) VALUES "
            f"(?, ?, ?, 'tool_call', 'work', ?, ?, 'claimed', ?, 1, {SQLITE_NOW} + ?, 1)",
            [
                (k, key, i, e, h, OWNER, TTL)
                for i, (k, e, h) in enumerate(zip(keys, envs, hashes, strict=True))
            ],
        )

    @staticmethod
    def _finalize(
        c: sqlite3.Connection, key: str, keys: list[str], envs: list[str], hashes: Any
    ) -> None:
        matched = [
            k
            for k, h in zip(keys, hashes, strict=True)
            if c.execute(
                "UPDATE eh_children SET state = 'settled', outcome = ?, lease_owner = NULL, "
                f"lease_expires = NULL, settled_at = {SQLITE_NOW} WHERE replay_key = ? "
                "AND envelope_hash = ? AND lease_owner = ? AND fence = 1 "
                "AND state = 'claimed'",
                (OUTCOME, k, h, OWNER),
            ).rowcount
        ]
        m = len(matched)
        if not m:
            return
        top = c.execute(
            "UPDATE eh_groups SET counter = counter + ? WHERE group_key = ? RETURNING counter",
            (m, key),
        ).fetchone()[0]
        c.executemany(
            "UPDATE eh_children SET seq = ? WHERE replay_key = ?",
            [(top - m + i + 1, k) for i, k in enumerate(matched)],
        )

    @staticmethod
    def _close_retire(c: sqlite3.Connection, key: str, *_: Any) -> None:
        (unsettled,) = c.execute(
            "SELECT count(*) FROM eh_children WHERE group_key = ? AND state <> 'settled'",
            (key,),
        ).fetchone()
        assert unsettled == 0, key
        c.execute("DELETE FROM eh_groups WHERE group_key = ?", (key,))
        c.execute("DELETE FROM eh_children WHERE group_key = ?", (key,))
        c.execute("DELETE FROM eh_payloads WHERE group_key = ?", (key,))
        c.execute(
            "INSERT INTO eh_retired (group_key, effective, retired_at) "
            f"VALUES (?, ?, {SQLITE_NOW}) ON CONFLICT DO NOTHING",
            (key, EFFECTIVE),
        )

    def ranks(self, key: str, n: int) -> list[Any]:
        return self.conn.execute(
            "SELECT g.counter, g.state, c.seq, c.position, c.replay_key, c.outcome "
            "FROM eh_groups g LEFT JOIN eh_children c ON c.group_key = g.group_key "
            "AND c.seq >= ? AND c.seq < ? WHERE g.group_key = ? ORDER BY c.seq",
            (1, 1 + n, key),
        ).fetchall()

    def groups(self, keys: list[str], n: int) -> None:
        """Several callers' groups, each step one transaction shared by all of them."""
        groups = [(key, *children(key, n)) for key in keys]
        self._tx(self._open, groups)
        self._tx(self._finalize, groups)
        for key in keys:
            ranks = self.ranks(key, n)
            assert len(ranks) == n and ranks[-1][2] == n, key
        self._tx(self._close_retire, groups)

    def small(self, callers: int, seconds: float) -> dict[str, Any]:
        run, done, i = next(_RUN), 0, 0
        started = time.perf_counter()
        stop = started + seconds
        while time.perf_counter() < stop:
            self.groups([f"ceil{run}:group:{c}-{i}:0" for c in range(callers)], 2)
            done += 2 * callers
            i += 1
        return _result(done, time.perf_counter() - started)

    def big(self, n: int, rounds: int) -> dict[str, Any]:
        rates = []
        for _ in range(rounds):
            started = time.perf_counter()
            self.groups([f"ceilbig{next(_RUN)}:group:g:0"], n)
            rates.append(n / (time.perf_counter() - started))
        return {"children": n * rounds, "children_per_s": statistics.median(rates)}


# -- the run ---------------------------------------------------------------------------------


def _row(workload: str, substrate: str, callers: int, rates: list[float]) -> dict[str, Any]:
    return {
        "workload": workload,
        "substrate": substrate,
        "callers": callers,
        "children_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "rounds": rates,
    }


async def _rows(substrate: str, small: Any, big: Any, options: argparse.Namespace) -> list[Any]:
    rows = []
    await small(1, min(1.0, options.seconds))  # warm up
    each = options.seconds / options.rounds
    for callers in options.callers:
        rates = [(await small(callers, each))["children_per_s"] for _ in range(options.rounds)]
        rows.append(_row("2-child groups", substrate, callers, rates))
        print(
            f"  {substrate} 2-child x{callers}: {statistics.median(rates):.0f}/s", file=sys.stderr
        )
    if options.big:
        rates = [(await big(options.big, 1))["children_per_s"] for _ in range(options.big_rounds)]
        rows.append(_row(f"{options.big}-child group", substrate, 1, rates))
    return rows


async def main(options: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    document: dict[str, Any] = {
        **machine(sqlite=True, load=None),
        "seconds": options.seconds,
        "rounds": options.rounds,
        "notify": options.notify,
        "rows": rows,
    }
    if "postgres" in options.substrates:
        with postgres(fsync=not options.no_fsync) as dsn:
            ceiling = PostgresCeiling(dsn, notify=options.notify)
            try:
                await ceiling.start(max(options.callers))
                conn = ceiling.conns[0]
                document["postgres"] = await conn.fetchval("SHOW server_version")
                document["postgres_fsync"] = await conn.fetchval("SHOW fsync")
                rows += await _rows("postgres", ceiling.small, ceiling.big, options)
            finally:
                await ceiling.aclose()
    if "sqlite" in options.substrates:
        lite = SqliteCeiling(work_dir / "ceiling.sqlite3")
        try:

            async def small(callers: int, seconds: float) -> dict[str, Any]:
                return lite.small(callers, seconds)

            async def big(n: int, rounds: int) -> dict[str, Any]:
                return lite.big(n, rounds)

            rows += await _rows("sqlite", small, big, options)
        finally:
            lite.close()
    return document


def table(document: dict[str, Any]) -> str:
    header = f"{'workload':<20}{'db':<10}{'callers':>7}{'children/s':>12}{'range':>16}"
    lines = ruled(
        f"postgres={document.get('postgres', '-')} (fsync={document.get('postgres_fsync', '-')},"
        f" notify={'on' if document['notify'] else 'off'})  sqlite={document['sqlite']}"
        f"  python={document['python']}  cpus={document['cpus']}  (honest ceilings, 4 calls)",
        header,
    )
    for row in document["rows"]:
        span = f"{row['min']:.0f}–{row['max']:.0f}"
        lines.append(
            f"{row['workload']:<20}{row['substrate']:<10}{row['callers']:>7}"
            f"{row['children_per_s']:>12.0f}{span:>16}"
        )
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per 2-child row")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per row (median, range)")
    parser.add_argument("--callers", default="1,4,16")
    parser.add_argument("--big", type=int, default=1000, help="children of the big group (0: skip)")
    parser.add_argument("--big-rounds", type=int, default=3)
    substrate_options(parser, "postgres,sqlite")
    parser.add_argument(
        "--notify",
        action="store_true",
        help="pg_notify on every finalize and close, as a host waking other processes does",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "sql_ceilings.json"
    )
    options = parser.parse_args()
    options.callers = [int(c) for c in options.callers.split(",")]
    options.substrates = options.substrates.split(",")
    run(lambda tmp: main(options, tmp), options.out, table, prefix="effecthost-ceiling-")


if __name__ == "__main__":
    cli()
