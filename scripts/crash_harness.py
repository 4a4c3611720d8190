"""Crash and concurrency harness of the SQL tiers (SQLite, PostgreSQL).

Each *round* opens fresh groups in a caller process — an ``ALL`` group of tool calls, a
``race`` (FIRST/CANCEL) of tool calls, a deadline/signal select (``await_event`` + ``sleep``,
FIRST/CANCEL), a ``RUN_TO_COMPLETION`` race narrowed to ``CANCEL`` at close, and an
abandoned group (opened, never closed) — while a drainer process runs drain passes
concurrently. One process is SIGKILLed: at a named phase (``open``, inside the finalize,
between ranks, inside the close, a claim during a drain or a recovery) or after a random
delay. A recovery process then reopens the groups, restores the cursors the callers had
reached, delivers the events, consumes, closes and drains; sometimes that recovery is
killed too and another one follows. Special rounds: a *takeover* (the caller SIGSTOPped
past its lease while the drainer takes its children over, then SIGCONT), a *late* reopen
(no drainer; the caller is SIGKILLed after reading the race's rank 1, before its close,
and the recovery reopens only once the race's leases expired: R-13's case) and, on
PostgreSQL, a *server crash* (``pg_ctl stop -m immediate``, fsync on) with crash recovery.

Everything is checked from the database's own record, not from what a worker believed:
triggers the harness installs on ``eh_children`` log every settlement (``h_settled``) and
every claim (``h_claims``, with the group's state at the claim) in the same transaction,
so a rolled-back finalize leaves no trace and a retired group's ranks stay readable. Each
tool execution is appended to a side file with its pid. Per round:

- lost: a child with no settlement once recovery is done; double: more than one;
- divergent: ranks not dense ``1..n``, a rank recorded before recovery that changed, or a
  rank served to a caller that the record does not hold;
- stuck: a child still unsettled while a recovery host lives past the deadline (with its
  row, so the finding can be matched to a cause);
- hung: a process that had to end and did not (its Python stack is dumped first);
- cancel_ran: a loser of a closed ``CANCEL`` group claimed after the close and executed;
- loser_restarts: a loser of a decided ``CANCEL`` group (an open ``FIRST`` group whose rank 1
  existed at the claim) claimed again and executed, in a group no caller read past rank 1:
  R-13 says such a loser is started again only for a caller awaiting a missing rank;
- wrong: a live caller served ``cancelled`` for rank 1 of a group it had not closed
  (a drain treating a live owner's children as orphans);
- deadlocks: ``deadlock detected`` in the PostgreSQL server log.

Usage::

    python scripts/crash_harness.py --db sqlite --kills 300 --json out.json
    python scripts/crash_harness.py --db postgres --kills 300 --json out.json  # fsync on
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

LEASE_TTL = 1.5
RENEW_EVERY = 0.25
SQLITE_POINTS = ["finalize:after_update", "finalize:before_commit", "finalize:after_commit"]
CALLER_POINTS = ["open", "rank", "close:before", "close:before_commit", "close:after", "wake"]
CALLER_TIMEOUT = 40.0
RECOVERY_SETTLE = 20.0  # seconds a recovery host may take to settle every child
RECOVERY_TIMEOUT = 90.0

# -- the workers ------------------------------------------------------------------------------


def _store(config: dict[str, Any], fault: Any) -> Any:
    from effecthost.hosts.sql import PostgresStore, SqliteStore

    if config["db"] == "sqlite":
        return SqliteStore(config["path"], fault=fault)
    return PostgresStore(config["dsn"], schema=config["schema"], pool_size=4)


def _killer(point: str | None, k: int) -> Any:
    hits: Counter[str] = Counter()

    def fault(name: str) -> None:
        if name == point:
            hits[name] += 1
            if hits[name] >= k:
                os.kill(os.getpid(), signal.SIGKILL)

    return fault


def _resolver(exec_dir: str) -> Any:
    from effecthost.contract import EffectExecutor, ExecutionInput, GroupExecutors

    log = open(Path(exec_dir) / f"{os.getpid()}.log", "a")

    class Tool(EffectExecutor):
        async def run(self, call: ExecutionInput) -> Any:
            log.write(f"{call.envelope.replay_key} {call.attempt}\n")
            log.flush()
            await asyncio.sleep(float(call.envelope.input["delay"]))  # the tool's own work
            return call.envelope.input["v"]

    class Resolver(GroupExecutors):
        def resolve(self, envelope: Any) -> Any:
            return Tool() if envelope.name == "work" else None

    return Resolver()


def _group(spec: dict[str, Any]) -> Any:
    from effecthost.contract import EffectEnvelope, EffectGroup, LoserPolicy, WakePolicy

    children = []
    for child in spec["children"]:
        if child["kind"] == "tool_call":
            body = {"name": "work", "input": {"delay": child["delay"], "v": child["v"]}}
        elif child["kind"] == "sleep":
            body = {"name": "sleep", "input": {"seconds": child["seconds"]}}
        else:
            body = {"name": child["event"], "input": None}
        children.append(EffectEnvelope(replay_key=child["rk"], kind=child["kind"], **body))
    return EffectGroup(
        key=spec["key"],
        wake=WakePolicy(spec["wake"]),
        disposition=LoserPolicy(spec["disposition"]),
        children=children,
    )


def _host(config: dict[str, Any], fault: Any, **extra: Any) -> Any:
    from effecthost.hosts.sql import SqlEffectHost

    return SqlEffectHost(
        _store(config, fault),
        _resolver(config["exec_dir"]),
        node_id=config["role"],
        lease_ttl=LEASE_TTL,
        renew_every=RENEW_EVERY,
        poll_interval=0.1,
        fault=fault,
        **extra,
    )


def _served(config: dict[str, Any]) -> Any:
    handle = open(Path(config["run_dir"]) / f"served-{config['role']}-{os.getpid()}.log", "a")

    def write(record: dict[str, Any]) -> None:
        handle.write(json.dumps(record) + "\n")
        handle.flush()

    return write


async def caller(config: dict[str, Any]) -> None:
    from effecthost.contract import LoserPolicy

    fault = _killer(config.get("point"), int(config.get("k", 1)))
    host = _host(config, fault)
    await host.start()
    write = _served(config)
    write({"owner": host.owner})

    async def one(spec: dict[str, Any]) -> None:
        group = _group(spec)
        handle = await host.open_effect_group(group)
        write({"opened": spec["key"]})
        fault("open")
        if spec["plan"] == "select" and spec["event_first"]:
            await host.deliver_event(spec["key"], "go", {"ok": 1})
        ranks = 1
        if spec["plan"] == "all":
            ranks = group.child_count
        elif spec["plan"] == "abandon":
            ranks = spec["consume"]
        for _ in range(ranks):
            s = await host.await_next_settlement(handle)
            write({"g": spec["key"], "rank": s.rank, "rk": s.replay_key, "st": s.outcome.status})
            fault("rank")
        if spec["plan"] == "abandon":
            return
        if spec["plan"] == "race" and config.get("hold_race"):
            await asyncio.Event().wait()  # a late round: killed before this close
        fault("close:before")
        narrow = LoserPolicy.CANCEL if spec["plan"] == "narrow" else None
        await host.close_effect_group(handle, narrow)
        write({"closed": spec["key"]})
        fault("close:after")

    await asyncio.gather(*(one(spec) for spec in config["plan"]))
    if config.get("linger"):  # a takeover round: stay alive after SIGCONT to be watched
        await asyncio.sleep(config["linger"])
    await host.aclose()
    print("survived", flush=True)


async def drainer(config: dict[str, Any]) -> None:
    fault = _killer(config.get("point"), int(config.get("k", 1)))
    host = _host(config, fault)
    await host.start()
    _served(config)({"owner": host.owner})
    drain = host.drain()
    while True:
        await drain.run_pass()
        await asyncio.sleep(0.15)  # the pass cadence of a drain worker


async def recover(config: dict[str, Any]) -> None:
    from effecthost.contract import EffectHostError, GroupClosed, LoserPolicy

    fault = _killer(config.get("point"), int(config.get("k", 1)))
    host = _host(config, fault, drain_every=0.2)
    await host.start()
    write = _served(config)
    write({"owner": host.owner})
    consumed: dict[str, int] = dict(config["consumed"])
    closed = set(config["closed"])
    notes: list[str] = []

    async def one(spec: dict[str, Any]) -> None:
        key = spec["key"]
        if spec["plan"] == "abandon":
            return  # the caller is gone for good: the drain finishes it
        group = _group(spec)
        try:
            handle = await host.open_effect_group(group)
        except GroupClosed:
            return
        if spec["plan"] == "select":
            await host.deliver_event(key, "go", {"ok": 2})
        handle.consumed = consumed.get(key, 0)
        want = group.child_count if spec["plan"] == "all" else 1
        try:
            while handle.consumed < want:
                s = await asyncio.wait_for(host.await_next_settlement(handle), RECOVERY_SETTLE)
                write({"g": key, "rank": s.rank, "rk": s.replay_key, "st": s.outcome.status})
        except TimeoutError:
            notes.append(f"await of rank {handle.consumed + 1} of {key} timed out")
        except GroupClosed:
            if key not in closed:
                notes.append(f"{key} reopened but GroupClosed on await though never closed")
            return
        except EffectHostError as exc:
            notes.append(f"{key}: {type(exc).__name__}")
            return
        narrow = LoserPolicy.CANCEL if spec["plan"] == "narrow" else None
        with contextlib.suppress(GroupClosed):
            await host.close_effect_group(handle, narrow)
        write({"closed": key})

    await asyncio.gather(*(one(spec) for spec in config["plan"]))
    keys = [c["rk"] for spec in config["plan"] for c in spec["children"]]
    deadline = time.monotonic() + RECOVERY_SETTLE
    while True:  # wait, host alive and draining, until the record shows every child settled
        unsettled = await _unsettled(config, keys)
        if not unsettled or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    print(json.dumps({"unsettled": unsettled, "notes": notes}), flush=True)
    await host.aclose()


async def _unsettled(config: dict[str, Any], keys: list[str]) -> list[str]:
    db = Db(config)
    rows = await db.fetch("SELECT DISTINCT replay_key FROM h_settled", ())
    done = {r[0] for r in rows}
    return [k for k in keys if k not in done]


def worker_main(path: str) -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    config = json.loads(Path(path).read_text())
    role = {"caller": caller, "drainer": drainer, "recover": recover}[config["role"]]
    asyncio.run(role(config))


# -- the database's own record ----------------------------------------------------------------


class Db:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def fetch(self, sql: str, args: tuple[Any, ...], raw: bool = False) -> list[Any]:
        """Rows of one statement; ``$`` marks a placeholder unless ``raw``."""
        if self.config["db"] == "sqlite":

            def go() -> list[Any]:
                conn = sqlite3.connect(self.config["path"], timeout=60, isolation_level=None)
                try:
                    return conn.execute(sql if raw else sql.replace("$", "?"), args).fetchall()
                finally:
                    conn.close()

            return await asyncio.to_thread(go)
        import asyncpg

        conn = await asyncpg.connect(
            self.config["dsn"], server_settings={"search_path": self.config["schema"]}
        )
        try:
            return list(await conn.fetch(sql if raw else _number(sql), *args))
        finally:
            await conn.close()

    async def script(self, statements: list[str]) -> None:
        for statement in statements:
            await self.fetch(statement, (), raw=True)


def _number(sql: str) -> str:
    out, n = [], 0
    for ch in sql:
        if ch == "$":
            n += 1
            out.append(f"${n}")
        else:
            out.append(ch)
    return "".join(out)


SQLITE_AUDIT = [
    """CREATE TABLE IF NOT EXISTS h_settled (id INTEGER PRIMARY KEY AUTOINCREMENT,
        group_key TEXT, replay_key TEXT, seq INTEGER, status TEXT, owner TEXT, old_seq INTEGER)""",
    """CREATE TABLE IF NOT EXISTS h_claims (id INTEGER PRIMARY KEY AUTOINCREMENT,
        group_key TEXT, replay_key TEXT, attempt INTEGER, owner TEXT, gstate TEXT,
        geffective TEXT, gwake TEXT, gcounter INTEGER)""",
    """CREATE TRIGGER IF NOT EXISTS h_settle AFTER UPDATE OF seq ON eh_children
        WHEN NEW.seq IS NOT NULL AND (OLD.seq IS NULL OR OLD.seq <> NEW.seq) BEGIN
        INSERT INTO h_settled (group_key, replay_key, seq, status, owner, old_seq)
        VALUES (NEW.group_key, NEW.replay_key, NEW.seq, json_extract(NEW.outcome, '$.status'),
                NEW.lease_owner, OLD.seq); END""",
    """CREATE TRIGGER IF NOT EXISTS h_claim AFTER UPDATE OF fence ON eh_children
        WHEN NEW.fence > OLD.fence BEGIN
        INSERT INTO h_claims (group_key, replay_key, attempt, owner, gstate, geffective, gwake,
                              gcounter)
        SELECT NEW.group_key, NEW.replay_key, NEW.attempt, NEW.lease_owner, g.state, g.effective,
               g.wake, g.counter
        FROM eh_groups g WHERE g.group_key = NEW.group_key; END""",
]


def postgres_audit(schema: str) -> list[str]:
    s = schema
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.h_settled (id bigserial PRIMARY KEY, group_key text,
            replay_key text, seq bigint, status text, owner text, old_seq bigint)""",
        f"""CREATE TABLE IF NOT EXISTS {s}.h_claims (id bigserial PRIMARY KEY, group_key text,
            replay_key text, attempt bigint, owner text, gstate text, geffective text,
            gwake text, gcounter bigint)""",
        f"""CREATE OR REPLACE FUNCTION {s}.h_settle_fn() RETURNS trigger AS $$ BEGIN
            INSERT INTO {s}.h_settled (group_key, replay_key, seq, status, owner, old_seq)
            VALUES (NEW.group_key, NEW.replay_key, NEW.seq, (NEW.outcome::jsonb)->>'status',
                    NEW.lease_owner, OLD.seq);
            RETURN NULL; END $$ LANGUAGE plpgsql""",
        f"""CREATE OR REPLACE FUNCTION {s}.h_claim_fn() RETURNS trigger AS $$ BEGIN
            INSERT INTO {s}.h_claims (group_key, replay_key, attempt, owner, gstate, geffective,
                                      gwake, gcounter)
            SELECT NEW.group_key, NEW.replay_key, NEW.attempt, NEW.lease_owner, g.state,
                   g.effective, g.wake, g.counter
            FROM {s}.eh_groups g WHERE g.group_key = NEW.group_key;
            RETURN NULL; END $$ LANGUAGE plpgsql""",
        f"""CREATE OR REPLACE TRIGGER h_settle AFTER UPDATE OF seq ON {s}.eh_children
            FOR EACH ROW WHEN (NEW.seq IS NOT NULL AND OLD.seq IS DISTINCT FROM NEW.seq)
            EXECUTE FUNCTION {s}.h_settle_fn()""",
        f"""CREATE OR REPLACE TRIGGER h_claim AFTER UPDATE OF fence ON {s}.eh_children
            FOR EACH ROW WHEN (NEW.fence > OLD.fence) EXECUTE FUNCTION {s}.h_claim_fn()""",
    ]


# -- the orchestrator -------------------------------------------------------------------------


class Proc:
    """A worker process with its stderr in a file."""

    def __init__(self, run_dir: Path, config: dict[str, Any], name: str) -> None:
        self.name = name
        path = run_dir / f"{name}.json"
        path.write_text(json.dumps(config))
        self.err_path = run_dir / f"{name}.err"
        self.out_path = run_dir / f"{name}.out"
        with open(self.err_path, "wb") as err, open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "worker", str(path)],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        self.killed = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.killed = True
        self.proc.wait()

    async def wait(self, timeout: float) -> bool:
        """True when it ended in time; else its stack is dumped and it is killed."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.send_signal(signal.SIGUSR1)  # faulthandler: stacks to stderr
                await asyncio.sleep(0.5)
                self.kill()
                return False
            await asyncio.sleep(0.05)
        return True

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")


def make_plan(rng: random.Random, prefix: str) -> list[dict[str, Any]]:
    def tools(label: str, n: int, slow: float) -> list[dict[str, Any]]:
        return [
            {
                "rk": f"{prefix}/{label}/{i}",
                "kind": "tool_call",
                "delay": round(rng.uniform(0.0, slow), 3),
                "v": i,
            }
            for i in range(n)
        ]

    def group(label: str, plan: str, wake: str, disposition: str, children: Any) -> Any:
        return {
            "key": f"{prefix}:group:{label}:0",
            "plan": plan,
            "wake": wake,
            "disposition": disposition,
            "children": children,
        }

    select = [
        {"rk": f"{prefix}/sel/ev", "kind": "await_event", "event": "go"},
        {"rk": f"{prefix}/sel/deadline", "kind": "sleep", "seconds": rng.choice([0.2, 0.6, 2.0])},
    ]
    abandon_disposition = rng.choice(["run_to_completion", "cancel"])
    plan = [
        group("all", "all", "all", "run_to_completion", tools("all", 4, 0.3)),
        group("race", "race", "first", "cancel", tools("race", 3, 0.8)),
        {**group("sel", "select", "first", "cancel", select), "event_first": rng.random() < 0.5},
        group("narrow", "narrow", "first", "run_to_completion", tools("narrow", 3, 0.8)),
        {
            **group("abandon", "abandon", "all", abandon_disposition, tools("abandon", 3, 0.6)),
            "consume": rng.choice([0, 1]),
        },
    ]
    return plan


VERDICTS = (
    "lost",
    "double",
    "divergent",
    "stuck",
    "hung",
    "wrong",
    "cancel_ran",
    "loser_restarts",
    "deadlocks",
)
"""The counts each round reports: every one is 0 in a passing run."""


class Harness:
    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.root = Path(tempfile.mkdtemp(prefix="eh-harness-"))
        self.server: Any = None
        self.base: dict[str, Any] = {"db": options.db}
        self.rows: list[dict[str, Any]] = []
        self.findings: list[dict[str, Any]] = []
        self._log_offset = 0

    async def start(self) -> None:
        from effecthost.hosts.sql import PostgresStore, SqliteStore

        if self.options.db == "sqlite":
            self.base["path"] = str(self.root / "harness.sqlite3")
            store: Any = SqliteStore(self.base["path"])
        else:
            from effecthost.hosts.sql.testing import PostgresServer

            self.server = PostgresServer(fsync=not self.options.no_fsync)
            self.base["dsn"] = self.server.start()
            self.base["schema"] = "harness"
            store = PostgresStore(self.base["dsn"], schema="harness")
        await store.start()  # creates the schema
        await store.aclose()
        db = Db(self.base)
        if self.options.db == "sqlite":
            await db.script(SQLITE_AUDIT)
        else:
            await db.script(postgres_audit("harness"))

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def deadlocks(self, row: dict[str, Any]) -> int:
        """``deadlock detected`` in the server log since the last call; the statements
        involved go to the round's notes."""
        if self.server is None:
            return 0
        text = self.server.log_path.read_text(errors="replace")
        fresh, self._log_offset = text[self._log_offset :], len(text)
        lines = fresh.splitlines()
        found = 0
        for i, line in enumerate(lines):
            if "deadlock detected" in line:
                found += 1
                statement = next(
                    (x for x in lines[i + 1 : i + 8] if "STATEMENT:" in x or "CONTEXT:" in x), ""
                )
                row["notes"].append(
                    f"deadlock (issue 10 defect 5): {statement.split(':', 3)[-1].strip()[:160]}"
                )
        return found

    def _config(self, round_dir: Path, role: str, plan: Any, **extra: Any) -> dict[str, Any]:
        return {
            **self.base,
            "role": role,
            "plan": plan,
            "run_dir": str(round_dir),
            "exec_dir": str(round_dir / "exec"),
            **extra,
        }

    # -- one round ------------------------------------------------------------------------

    async def round(self, index: int, mode: str) -> dict[str, Any]:
        rng = self.rng
        round_dir = self.root / f"r{index:04d}"
        (round_dir / "exec").mkdir(parents=True)
        prefix = f"h{index}"
        plan = make_plan(rng, prefix)
        row: dict[str, Any] = {"round": index, "mode": mode, "killed": [], "notes": []}
        drainer = Proc(round_dir, self._config(round_dir, "drainer", plan), "drainer")
        caller_config = self._config(round_dir, "caller", plan)
        target = "caller"
        if mode == "named":
            points = CALLER_POINTS + (SQLITE_POINTS if self.options.db == "sqlite" else [])
            point = rng.choice([*points, "drain:claim"])
            if point == "drain:claim":
                target = "drainer"
                drainer.kill()
                drainer = Proc(
                    round_dir,
                    self._config(round_dir, "drainer", plan, point="claim", k=rng.randint(1, 3)),
                    "drainer",
                )
            else:
                caller_config.update(point=point, k=rng.randint(1, 3))
            row["point"] = point
        if mode == "late":
            drainer.kill()  # no drainer: the recovery's reopen meets the race's losers
            caller_config["hold_race"] = True
        if mode == "takeover":
            caller_config["linger"] = 2 * LEASE_TTL
            for spec in plan:
                for child in spec["children"]:
                    if child["kind"] == "tool_call":
                        child["delay"] = 3 * LEASE_TTL
        caller = Proc(round_dir, caller_config, "caller")
        if mode == "random":
            target = rng.choice(["caller", "caller", "caller", "drainer"])
            row["point"] = f"random:{target}"
            victim = caller if target == "caller" else drainer
            await self._sleep_or_exit(caller, rng.uniform(0.2, 2.0))
            victim.kill()
        elif mode == "takeover":
            await self._takeover(caller, row, prefix)
        elif mode == "late":
            await self._late(caller, round_dir, plan, row)
        elif mode == "pgcrash":
            await self._sleep_or_exit(caller, rng.uniform(0.3, 2.0))
            self.server.crash()
            caller.kill()
            drainer.kill()
            self.server.resume()
            row["point"] = "postgres:immediate-stop"
        finished = await caller.wait(CALLER_TIMEOUT)
        if not finished:
            row["hung"] = row.get("hung", 0) + 1
            row["notes"].append(f"caller hung: {_stack(caller.stderr())}")
        row["caller_killed"] = caller.killed or caller.proc.returncode == -signal.SIGKILL
        if target == "drainer" and drainer.proc.poll() is not None:
            row["killed"].append("drainer")
        if row["caller_killed"]:
            row["killed"].append("caller")
        if drainer.proc.poll() is not None and mode != "late":  # a drain runs on
            drainer = Proc(round_dir, self._config(round_dir, "drainer2", plan), "drainer2")
        before = await self._record_ranks(prefix)
        # the recovery, itself killed sometimes
        attempts = 0
        while True:
            attempts += 1
            consumed, closed = self._progress(round_dir)
            extra: dict[str, Any] = {"consumed": consumed, "closed": sorted(closed)}
            kill_recovery = attempts == 1 and rng.random() < self.options.kill_recovery
            kill_recovery = kill_recovery and mode != "late"
            if kill_recovery and rng.random() < 0.5:
                extra.update(point=rng.choice(["claim", "wake"]), k=1)
            name = f"recover{attempts}"
            rec = Proc(round_dir, self._config(round_dir, "recover", plan, **extra), name)
            if kill_recovery and "point" not in extra:
                await self._sleep_or_exit(rec, rng.uniform(0.2, 1.5))
                rec.kill()
            ended = await rec.wait(RECOVERY_TIMEOUT)
            if not ended:
                row["hung"] = row.get("hung", 0) + 1
                row["notes"].append(f"{name} hung: {_stack(rec.stderr())}")
            if rec.proc.returncode == -signal.SIGKILL:
                row["killed"].append(name)
                before = self._merge(before, await self._record_ranks(prefix))
                if attempts < 3:
                    continue
            if rec.proc.returncode == 0:
                out = json.loads(rec.stdout().strip().splitlines()[-1])
                row["stuck_keys"] = out["unsettled"]
                row["notes"] += out["notes"]
            elif ended:
                row["notes"].append(f"{name} exit {rec.proc.returncode}: {_tail(rec.stderr())}")
            break
        drainer.kill()
        errors = "".join(p.read_text(errors="replace") for p in round_dir.glob("*.err"))
        row["deadlock_errors"] = errors.count("DeadlockDetected")
        await self._check(round_dir, plan, prefix, before, row)
        return row

    async def _sleep_or_exit(self, proc: Proc, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.proc.poll() is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # a random kill point, polled against an early exit

    async def _takeover(self, caller: Proc, row: dict[str, Any], prefix: str) -> None:
        """SIGSTOP the caller once it holds leases, past their expiry, until the drainer
        has claimed its children; then SIGCONT."""
        db = Db(self.base)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and caller.proc.poll() is None:
            rows = await db.fetch(
                "SELECT count(*) FROM eh_children WHERE kind = 'tool_call' AND "
                "lease_owner LIKE 'caller:%' AND state <> 'settled' AND replay_key LIKE $",
                (f"{prefix}/%",),
            )
            if rows[0][0] >= 3:
                break
            await asyncio.sleep(0.05)
        claims = "SELECT count(*) FROM h_claims WHERE owner LIKE 'drainer%' AND replay_key LIKE $"
        caller.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        while time.monotonic() - stopped < 4 * LEASE_TTL:
            rows = await db.fetch(claims, (f"{prefix}/%",))
            if rows[0][0] >= 1 and time.monotonic() - stopped > 1.5 * LEASE_TTL:
                break
            await asyncio.sleep(0.05)
        caller.proc.send_signal(signal.SIGCONT)
        rows = await db.fetch(claims, (f"{prefix}/%",))
        row["point"] = f"takeover:{rows[0][0]}-claims"

    async def _late(
        self, caller: Proc, round_dir: Path, plan: list[dict[str, Any]], row: dict[str, Any]
    ) -> None:
        """SIGKILL the caller once it read the race's rank 1 (it holds its close), then wait
        until the race's leases and the caller's claim on it expired on the database clock."""
        from effecthost.hosts.sql import PostgresStore, SqliteStore

        race = next(spec["key"] for spec in plan if spec["plan"] == "race")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and caller.proc.poll() is None:
            if any(r.get("g") == race and r.get("rank") == 1 for r in self._served(round_dir)):
                break
            await asyncio.sleep(0.05)  # polling another process's progress file
        caller.kill()
        row["point"] = "late:after-race-rank-1"
        if self.options.db == "sqlite":
            store: Any = SqliteStore(self.base["path"])
        else:
            store = PostgresStore(self.base["dsn"], schema=self.base["schema"])
        await store.start()
        try:
            deadline = time.monotonic() + 4 * LEASE_TTL
            while time.monotonic() < deadline:
                rows = [r for r in await store.unfinished() if r.group_key == race]
                if all(r.lease_expired and not r.owner_live for r in rows):
                    break
                await asyncio.sleep(0.05)  # the database clock passing the dead leases
        finally:
            await store.aclose()

    async def _record_ranks(self, prefix: str) -> dict[str, int]:
        rows = await Db(self.base).fetch(
            "SELECT replay_key, seq FROM h_settled WHERE replay_key LIKE $", (f"{prefix}/%",)
        )
        return {str(rk): int(seq) for rk, seq in rows}

    @staticmethod
    def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {**b, **a}

    @staticmethod
    def _served(round_dir: Path) -> list[dict[str, Any]]:
        records = []
        for path in sorted(round_dir.glob("served-*.log")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    records.append({**json.loads(line), "file": path.name})
        return records

    def _progress(self, round_dir: Path) -> tuple[dict[str, int], set[str]]:
        consumed: dict[str, int] = {}
        closed: set[str] = set()
        for record in self._served(round_dir):
            if "rank" in record:
                consumed[record["g"]] = max(consumed.get(record["g"], 0), record["rank"])
            if "closed" in record:
                closed.add(record["closed"])
        return consumed, closed

    async def _check(
        self,
        round_dir: Path,
        plan: list[dict[str, Any]],
        prefix: str,
        before: dict[str, int],
        row: dict[str, Any],
    ) -> None:
        db = Db(self.base)
        settled = await db.fetch(
            "SELECT group_key, replay_key, seq, status, owner, old_seq FROM h_settled "
            "WHERE replay_key LIKE $ ORDER BY id",
            (f"{prefix}/%",),
        )
        per_child: dict[str, list[Any]] = defaultdict(list)
        for record in settled:
            per_child[str(record[1])].append(record)
        present = {
            str(r[0])
            for r in await db.fetch(
                "SELECT replay_key FROM eh_children WHERE replay_key LIKE $", (f"{prefix}/%",)
            )
        }
        served = self._served(round_dir)
        opened = {r["opened"] for r in served if "opened" in r}
        lost = double = divergent = 0
        expected_keys: set[str] = set()
        for spec in plan:
            seqs = []
            for child in spec["children"]:
                got = per_child.get(child["rk"], [])
                expected = spec["key"] in opened or child["rk"] in present or got
                if not expected:
                    continue  # its group was never recorded: the open died first
                expected_keys.add(child["rk"])
                if not got:
                    lost += 1
                elif len(got) > 1:
                    double += 1
                    row["notes"].append(f"double settlement of {child['rk']}")
                if got:
                    seqs.append(int(got[0][2]))
            if seqs and sorted(seqs) != list(range(1, len(seqs) + 1)):
                divergent += 1
                row["notes"].append(f"ranks of {spec['key']} not dense: {sorted(seqs)}")
        final = {rk: int(got[0][2]) for rk, got in per_child.items()}
        for rk, seq in before.items():
            if final.get(rk) != seq:
                divergent += 1
                row["notes"].append(f"rank of {rk} changed: {seq} -> {final.get(rk)}")
        by_rank = {(rec[0], int(rec[2])): str(rec[1]) for rec in settled}
        wrong = 0
        closed_by_caller = {r["closed"] for r in served if "closed" in r and "caller" in r["file"]}
        for record in served:
            if "rank" not in record:
                continue
            recorded = by_rank.get((record["g"], record["rank"]))
            if recorded != record["rk"]:
                divergent += 1
                row["notes"].append(
                    f"served rank {record['rank']} of {record['g']} = {record['rk']}, "
                    f"recorded {recorded}"
                )
            if (
                row["mode"] != "takeover"  # a caller stopped past its lease is gone
                and "caller" in record["file"]
                and record["rank"] == 1
                and record["st"] == "cancelled"
                and record["g"] not in closed_by_caller
            ):
                wrong += 1
                row["notes"].append(
                    f"live caller served rank 1 of {record['g']} as cancelled "
                    "(a drain treated a live owner's child as an orphan: issue 10 defect 4)"
                )
        cancel_ran = await self._cancel_ran(round_dir, prefix, row)
        read_on = {r["g"] for r in served if "rank" in r and r["rank"] > 1}
        loser_restarts = await self._loser_restarts(round_dir, prefix, read_on, row)
        # unsettled while the recovery host lived and drained: stuck (else: lost)
        stuck_keys = [k for k in row.pop("stuck_keys", None) or [] if k in expected_keys]
        stuck = len(stuck_keys)
        for rk in stuck_keys:
            row["notes"].append(await self._describe_stuck(rk))
        lost_really = lost - stuck
        row.update(
            lost=max(lost_really, 0),
            double=double,
            divergent=divergent,
            stuck=stuck,
            hung=row.get("hung", 0),
            wrong=wrong,
            cancel_ran=cancel_ran,
            loser_restarts=loser_restarts,
            deadlocks=self.deadlocks(row),
        )

    async def _cancel_ran(self, round_dir: Path, prefix: str, row: dict[str, Any]) -> int:
        claims = await Db(self.base).fetch(
            "SELECT replay_key, attempt, owner FROM h_claims WHERE replay_key LIKE $ "
            "AND gstate = 'closed' AND geffective = 'cancel'",
            (f"{prefix}/%",),
        )
        late = {(str(rk), int(attempt)): owner for rk, attempt, owner in claims}
        return _noted(
            row,
            [e for e in _executions(round_dir) if e[:2] in late],
            "loser {} of a closed CANCEL group claimed after the close and run "
            "(attempt {}, pid {})",
        )

    async def _loser_restarts(
        self, round_dir: Path, prefix: str, read_on: set[str], row: dict[str, Any]
    ) -> int:
        """Executions of a child claimed again while its open ``FIRST``/``CANCEL`` group
        had rank 1 (decided, R-13), in a group no caller read past rank 1."""
        claims = await Db(self.base).fetch(
            "SELECT group_key, replay_key, attempt FROM h_claims WHERE replay_key LIKE $ "
            "AND gstate = 'open' AND geffective = 'cancel' AND gwake = 'first' "
            "AND gcounter >= 1",
            (f"{prefix}/%",),
        )
        decided = {(str(rk), int(attempt)) for key, rk, attempt in claims if key not in read_on}
        return _noted(
            row,
            [e for e in _executions(round_dir) if e[:2] in decided],
            "loser {} of a decided CANCEL group started again (attempt {}, pid {}) though "
            "no caller awaited a missing rank",
        )

    async def _describe_stuck(self, rk: str) -> str:
        rows = await Db(self.base).fetch(
            "SELECT c.kind, c.state, c.lease_owner, c.cancel_requested, c.attempt, g.state, "
            "g.effective FROM eh_children c LEFT JOIN eh_groups g ON g.group_key = c.group_key "
            "WHERE c.replay_key = $",
            (rk,),
        )
        if not rows:
            return f"stuck {rk}: no row"
        kind, state, owner, cancel, attempt, gstate, effective = rows[0]
        cause = "unclassified"
        if cancel and owner:
            cause = "issue 10 defect 3 (cancelled before its task ran: never settles)"
        return (
            f"stuck {rk}: {kind} {state} owner={str(owner).split(':')[0]} cancel={cancel} "
            f"attempt={attempt} group={gstate}/{effective} -> {cause}"
        )

    def _progress_line(self, row: dict[str, Any]) -> str:
        bad = {k: row[k] for k in VERDICTS if row.get(k)}
        return f"round {row['round']:4d} {row['mode']:8s} {row.get('point', '-'):26s} {bad or 'ok'}"

    async def run(self) -> dict[str, Any]:
        """Rounds until ``--kills`` rounds had a process killed (a named point that is
        never reached kills nothing; at most twice as many rounds)."""
        await self.start()
        try:
            index = 0
            while self.kill_points() < self.options.kills and index < 2 * self.options.kills:
                row = await self.round(index, self._mode(index))
                self.rows.append(row)
                index += 1
                if self.options.json:  # partial figures, readable while a long run goes on
                    _write(self.options.json, {**self.summary(), "partial": True})
                if self.options.verbose or any(row.get(k) for k in VERDICTS if k != "deadlocks"):
                    print(self._progress_line(row), flush=True)
        finally:
            self.stop()
            if not self.options.keep:
                import shutil

                shutil.rmtree(self.root, ignore_errors=True)
        return self.summary()

    def _mode(self, index: int) -> str:
        if self.options.modes:
            cycle = self.options.modes.split(",")
            return cycle[index % len(cycle)]
        special = ["takeover", "pgcrash"] if self.options.db == "postgres" else ["takeover"]
        if index % 12 == 5:
            return special[(index // 12) % len(special)]
        if index % 12 == 11:
            return "late"
        return "named" if index % 2 == 0 else "random"

    def kill_points(self) -> int:
        return sum(1 for r in self.rows if r["killed"] or r["mode"] in ("takeover", "pgcrash"))

    def summary(self) -> dict[str, Any]:
        totals = {k: sum(int(r.get(k, 0)) for r in self.rows) for k in VERDICTS}
        killed = self.kill_points()
        return {
            "db": self.options.db,
            "fsync": None if self.options.db == "sqlite" else not self.options.no_fsync,
            "rounds": len(self.rows),
            "kill_points": killed,
            "processes_killed": sum(len(r["killed"]) for r in self.rows),
            "modes": dict(Counter(r["mode"] for r in self.rows)),
            **totals,
            "deadlock_errors_in_workers": sum(r.get("deadlock_errors", 0) for r in self.rows),
            "findings": [
                {
                    "round": r["round"],
                    "mode": r["mode"],
                    "point": r.get("point"),
                    "notes": r["notes"],
                }
                for r in self.rows
                if r["notes"]
            ],
        }


def _executions(round_dir: Path) -> list[tuple[str, int, str]]:
    """Every tool execution the round's workers logged: (replay key, attempt, pid)."""
    found = []
    for path in (round_dir / "exec").glob("*.log"):
        for line in path.read_text().splitlines():
            rk, _, attempt = line.partition(" ")
            found.append((rk, int(attempt), path.stem))
    return found


def _noted(row: dict[str, Any], runs: list[tuple[str, int, str]], note: str) -> int:
    """Add a note per run (``note`` formatted with its replay key, attempt and pid) to
    the round's row; how many there were."""
    row["notes"] += [note.format(*run) for run in runs]
    return len(runs)


def _write(path: Path, summary: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))


def _stack(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("File")]
    return " | ".join(lines[-4:]) if lines else _tail(text)


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-3:])


def table(summary: dict[str, Any]) -> str:
    cols = ("kill_points", "divergent", "lost", "double", "stuck", "hung", "deadlocks")
    extra = ("wrong", "cancel_ran", "loser_restarts")
    widths = {c: max(12, len(c) + 2) for c in cols + extra}
    head = f"{'db':10s}" + "".join(f"{c:>{widths[c]}s}" for c in cols + extra)
    line = f"{summary['db']:10s}" + "".join(f"{summary[c]:>{widths[c]}d}" for c in cols + extra)
    return head + "\n" + line


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        worker_main(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--kills", type=int, default=20, help="rounds, each with a kill point")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--modes",
        help="cycle of round modes: named, random, takeover, late, pgcrash (default: mixed)",
    )
    parser.add_argument("--kill-recovery", type=float, default=0.3, help="share of rounds")
    parser.add_argument("--no-fsync", action="store_true", help="PostgreSQL with fsync=off")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("-v", "--verbose", action="store_true")
    options = parser.parse_args()
    summary = asyncio.run(Harness(options).run())
    print(table(summary))
    for finding in summary["findings"][:40]:
        print(f"  round {finding['round']} {finding['mode']} {finding['point']}:")
        for note in finding["notes"][:6]:
            print(f"    {note}")
    if options.json:
        _write(options.json, summary)
    bad = sum(summary[k] for k in ("divergent", "lost", "double", "stuck", "hung", "deadlocks"))
    bad += summary["wrong"] + summary["cancel_ran"] + summary["loser_restarts"]
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
