"""SQL tier benchmark: how soon a waiter in one process learns of a commit in another.

    .venv/bin/python benchmarks/sql_wake.py [--samples 60] [--substrates postgres,sqlite]
        [--no-fsync] [--out FILE]

Two processes share one database. The waiter (this process, through its own
:class:`SqlEffectHost`) opens a group of one ``await_event`` child and waits for rank 1;
the deliverer (a child process with a host of its own on the same database) delivers the
event, which commits the child's settlement, and reports the wall-clock time its
``deliver_event`` returned (the commit acknowledged). The wake latency is the waiter's
``await_next_settlement`` returning minus that time (one machine, one clock; a notification
can arrive before the deliverer's driver has handed it the acknowledgement, so a figure
can be slightly negative). The waiter is
parked before each delivery: it announces the group, starts waiting, and the deliverer acts
only when it reads the announcement.

PostgreSQL wakes other processes by ``LISTEN``/``NOTIFY``; SQLite has no notification, so
the host watches the database for other connections' commits. Prints a table (p50, p95,
max in milliseconds) and writes JSON (``--out``, default benchmarks/results/sql_wake.json).
PostgreSQL is a throwaway ``PostgresServer`` (fsync on unless ``--no-fsync``) unless
``EFFECTHOST_POSTGRES_DSN`` is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Queue
from typing import IO, Any

from _bench import machine, percentile, postgres, ruled, run, substrate_options

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store


def _store(substrate: str, target: str) -> Store:
    if substrate == "postgres":
        return PostgresStore(target, schema="ehwake")
    return SqliteStore(target)


def _group(key: str) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[
            EffectEnvelope(
                replay_key=f"{key}.event", kind=EffectKind.AWAIT_EVENT, name="go", input=None
            )
        ],
    )


async def deliverer(substrate: str, target: str) -> None:
    """The other process: deliver the event of each group named on stdin, answer the
    time the commit was acknowledged."""
    host = SqlEffectHost(_store(substrate, target), ToolRegistry({}))
    await host.start()
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            key = line.strip()
            reached = await host.deliver_event(key, "go")
            answer = json.dumps({"key": key, "at": time.time(), "reached": reached})
            print(f"{ANSWER}{answer}", flush=True)
    finally:
        await host.aclose()


ANSWER = "answer: "
"""Marks the deliverer's answers among whatever else it writes to stdout."""


def _answers(stream: IO[str], answers: Queue[dict[str, Any] | None]) -> None:
    """Read the deliverer's stdout to the end (a pipe left unread would block it once
    full): its answers to ``answers``, anything else to our stderr; ``None`` at EOF."""
    for line in stream:
        if line.startswith(ANSWER):
            answers.put(json.loads(line[len(ANSWER) :]))
        else:
            sys.stderr.write(line)
    answers.put(None)


def _spawn(substrate: str, target: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--deliver", substrate, target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def measure(substrate: str, target: str, samples: int) -> dict[str, Any]:
    host = SqlEffectHost(_store(substrate, target), ToolRegistry({}))
    await host.start()
    other = _spawn(substrate, target)
    assert other.stdin is not None and other.stdout is not None
    answers: Queue[dict[str, Any] | None] = Queue()
    threading.Thread(target=_answers, args=(other.stdout, answers), daemon=True).start()
    loop = asyncio.get_running_loop()
    wakes: list[float] = []
    try:
        for i in range(samples + 3):  # the first three warm both processes up
            key = f"wake{os.getpid()}:group:{i}:0"
            handle = await host.open_effect_group(_group(key))
            waiting = asyncio.ensure_future(host.await_next_settlement(handle))
            await asyncio.sleep(0)  # the waiter reads, finds nothing and parks
            other.stdin.write(key + "\n")
            other.stdin.flush()
            settlement = await asyncio.wait_for(waiting, 60)
            woke = time.time()
            answer = await loop.run_in_executor(None, answers.get)
            assert answer is not None, "the deliverer exited"
            assert answer["key"] == key and answer["reached"] == 1, answer
            assert settlement.rank == 1
            await host.close_effect_group(handle)
            if i >= 3:
                wakes.append(woke - answer["at"])
    finally:
        other.stdin.close()
        try:
            other.wait(30)
        except subprocess.TimeoutExpired:
            other.kill()
        await host.aclose()
    ordered = sorted(wakes)
    return {
        "substrate": substrate,
        "samples": len(wakes),
        "p50_ms": statistics.median(wakes) * 1e3,
        "p95_ms": percentile(ordered, 0.95) * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


async def main(options: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    document: dict[str, Any] = {**machine(sqlite=True, load="load_average"), "rows": rows}
    if "postgres" in options.substrates:
        with postgres(fsync=not options.no_fsync) as dsn:
            rows.append(await measure("postgres", dsn, options.samples))
    if "sqlite" in options.substrates:
        rows.append(await measure("sqlite", str(work_dir / "wake.sqlite3"), options.samples))
    return document


def table(document: dict[str, Any]) -> str:
    header = f"{'db':<10}{'samples':>8}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}"
    lines = ruled(
        f"cross-process wake (commit acknowledged in one process -> waiter returns in another)"
        f"  python={document['python']}  cpus={document['cpus']}"
        f"  load={document['load_average'][0]:.1f}",
        header,
    )
    for row in document["rows"]:
        lines.append(
            f"{row['substrate']:<10}{row['samples']:>8}{row['p50_ms']:>10.2f}"
            f"{row['p95_ms']:>10.2f}{row['max_ms']:>10.2f}"
        )
    return "\n".join(lines)


def cli() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--deliver":
        asyncio.run(deliverer(sys.argv[2], sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60)
    substrate_options(parser, "postgres,sqlite")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "sql_wake.json"
    )
    options = parser.parse_args()
    options.substrates = options.substrates.split(",")
    run(lambda tmp: main(options, tmp), options.out, table, prefix="effecthost-wake-")


if __name__ == "__main__":
    cli()
