"""``effecthost demo``: a race against a deadline and an ``all`` decided in rank order, on a
SQLite file, with the process running them SIGKILLed halfway and a new one taking over.

The parent starts a worker process. The worker races a slow tool against a deadline, opens
an ``all`` of four fetches, consumes two ranks (the second is the first rejection, so the
``all`` is decided), saves its cursor to a file and says so. The parent kills it with
SIGKILL, opens a new host on the same file, re-reads ranks 1–2 with a fresh cursor (same
children: the decision is a durable fact), continues from the saved cursor while the drain
re-runs the two fetches the dead worker left, and closes the group.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from effecthost.combinators import (
    DeadlineExceeded,
    Scope,
    build_group,
    tool,
    with_deadline,
)
from effecthost.contract import (
    EffectController,
    EffectGroup,
    GroupHandle,
    LoserPolicy,
    Settlement,
    ToolError,
    ToolRegistry,
    WakePolicy,
)

LEASE_TTL = 1.2
FETCHES = [
    {"url": "a.example", "after": 0.05},
    {"url": "b.example", "after": 1.5, "fail": 500},
    {"url": "c.example", "after": 0.3, "fail": 404},
    {"url": "d.example", "after": 2.0},
]


def tools(slow_seconds: float) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool("slow_search")
    async def slow_search(query: Any) -> Any:
        await asyncio.sleep(slow_seconds)
        return {"hits": 3, "query": query}

    @registry.tool("fetch")
    async def fetch(spec: Any) -> Any:
        await asyncio.sleep(float(spec.get("after", 0)))
        if spec.get("fail"):
            raise ToolError("FetchFailed", f"{spec['url']} answered {spec['fail']}")
        return f"body of {spec['url']}"

    return registry


class Trace:
    """Lines stamped from one start time shared by both processes (a system-wide clock)."""

    def __init__(self, who: str, started: float) -> None:
        self.who = who
        self.started = started

    def say(self, text: str) -> None:
        print(f"  [{time.monotonic() - self.started:6.3f}s {self.who}] {text}", flush=True)

    def rank(self, settlement: Settlement) -> None:
        outcome = settlement.outcome
        detail = (
            repr(outcome.value)
            if outcome.ok
            else (outcome.error.message if outcome.error else "cancelled")
        )
        self.say(
            f"rank {settlement.rank}: position {settlement.position} {outcome.status} {detail}"
        )


def _all_group(scope: Scope) -> EffectGroup:
    return build_group(
        scope,
        [tool("fetch", spec) for spec in FETCHES],
        WakePolicy.ALL,
        LoserPolicy.RUN_TO_COMPLETION,
    )


async def _host(db: Path, slow_seconds: float, **options: Any) -> EffectController:
    from effecthost.hosts.sql import sqlite_host

    return await sqlite_host(
        db, tools(slow_seconds), lease_ttl=LEASE_TTL, renew_every=0.2, **options
    )


async def worker(
    db: Path, state: Path, slow_seconds: float, deadline_seconds: float, started: float
) -> None:
    """The process that gets killed."""
    trace = Trace(f"worker {os.getpid()}", started)
    host = await _host(db, slow_seconds)
    scope = Scope(scope_id="demo")
    trace.say(f"race: slow_search ({slow_seconds}s) against a {deadline_seconds}s deadline")
    try:
        await with_deadline(host, scope, tool("slow_search", "durable effects"), deadline_seconds)
        trace.say("the tool won the race")
    except DeadlineExceeded as exc:
        trace.say(f"deadline won at rank {exc.rank}; the slow tool is cancelled (CANCEL)")

    group = _all_group(scope)
    trace.say(f"all: four fetches in group {group.key}")
    handle = await host.open_effect_group(group)
    seen = []
    while True:
        settlement = await host.await_next_settlement(handle)
        trace.rank(settlement)
        seen.append(settlement.model_dump(mode="json"))
        if not settlement.outcome.ok:
            trace.say(
                f"all() is rejected by position {settlement.position}: the first rejection "
                "in rank order (position 1 fails too, but later)"
            )
            break
    await asyncio.to_thread(
        state.write_text,
        json.dumps(
            {"group": group.model_dump(mode="json"), "cursor": handle.to_json(), "seen": seen}
        ),
    )
    trace.say(f"cursor saved at consumed={handle.consumed}; fetches b and d still running")
    print("READY", flush=True)
    await asyncio.Event().wait()


async def survivor(db: Path, state: Path, slow_seconds: float, started: float) -> int:
    """The process that takes over from the saved cursor."""
    trace = Trace("new host", started)
    saved = json.loads(await asyncio.to_thread(state.read_text))
    host = await _host(db, slow_seconds, drain_every=0.2)
    try:
        group = EffectGroup.model_validate(saved["group"])
        fresh = await host.open_effect_group(group)
        trace.say(f"reopened {group.key}: consumed={fresh.consumed}; re-reading ranks 1-2")
        again = [await host.await_next_settlement(fresh) for _ in saved["seen"]]
        same = [s.model_dump(mode="json") for s in again] == saved["seen"]
        for settlement in again:
            trace.rank(settlement)
        trace.say(
            "ranks 1-2 are byte-identical to what the killed worker read"
            if same
            else "RANKS DIFFER"
        )
        cursor = GroupHandle.from_json(saved["cursor"])
        trace.say(
            f"continuing from the saved cursor (consumed={cursor.consumed}); the drain re-runs b and d"
        )
        while not cursor.exhausted:
            trace.rank(await host.await_next_settlement(cursor))
        order = await host.settlement_order(group.key)
        await host.close_effect_group(cursor)
        trace.say(f"settlement order by position: {order}; group closed")
        return 0 if same else 1
    finally:
        aclose = getattr(host, "aclose", None)
        if aclose is not None:
            await aclose()


async def _relay(process: asyncio.subprocess.Process, ready: asyncio.Event) -> None:
    """Print the worker's lines until it says ``READY``, then read the rest of its
    output to the end unprinted: a pipe left unread would block a worker that writes
    more than the pipe holds."""
    assert process.stdout is not None
    pending = b""
    while chunk := await process.stdout.read(65536):
        if ready.is_set():
            continue
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip() == b"READY":
                ready.set()
                break
            print(line.decode(errors="replace"), flush=True)


async def run_demo(*, slow_seconds: float = 2.0, deadline_seconds: float = 0.3) -> int:
    with tempfile.TemporaryDirectory(prefix="effecthost-demo-") as tmp:
        db, state = Path(tmp) / "effects.sqlite3", Path(tmp) / "cursor.json"
        started = time.monotonic()
        print(f"SQLite file: {db}")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "effecthost._demo",
            str(db),
            str(state),
            str(slow_seconds),
            str(deadline_seconds),
            str(started),
            stdout=asyncio.subprocess.PIPE,  # read to the end below; stderr is ours
        )
        ready = asyncio.Event()
        relay = asyncio.ensure_future(_relay(process, ready))
        said = asyncio.ensure_future(ready.wait())
        await asyncio.wait({relay, said}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():  # the output ended: the worker exited
            said.cancel()
            await process.wait()
            print("the worker exited before it saved its cursor", file=sys.stderr)
            return 1
        process.send_signal(signal.SIGKILL)
        await process.wait()
        await relay
        print(
            f"  [{time.monotonic() - started:6.3f}s] SIGKILL -> worker {process.pid} "
            f"(exit {process.returncode}); a new host opens the same file",
            flush=True,
        )
        return await survivor(db, state, slow_seconds, started)


if __name__ == "__main__":
    db_arg, state_arg, slow_arg, deadline_arg, started_arg = sys.argv[1:6]
    asyncio.run(
        worker(
            Path(db_arg), Path(state_arg), float(slow_arg), float(deadline_arg), float(started_arg)
        )
    )
