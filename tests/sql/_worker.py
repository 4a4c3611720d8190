"""A child process for the SQL tier tests (run as a script, never imported by pytest).

Modes:
  concurrent DSN SCHEMA PREFIX GROUPS CHILDREN   open and consume GROUPS groups (shared
                                                 keys across processes) on PostgreSQL
  crash PATH GROUP CHILDREN POINT K             open a group on SQLite and SIGKILL this
                                                 process at the K-th hit of fault POINT
  recover PATH GROUP CHILDREN                   reopen the group, drain until every child
                                                 settled, print the ranks as JSON
  hold PATH GROUP CHILDREN                      open a group on SQLite whose tools never
                                                 return, print ``running`` once every child
                                                 runs, and wait to be killed
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared test builders
from group_support import group as sql_group
from group_support import tool as tool_call

from effecthost.contract import (
    EffectGroup,
    LoserPolicy,
    ToolRegistry,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore


async def echo(value: object) -> object:
    await asyncio.sleep(0)
    return value


def registry() -> ToolRegistry:
    return ToolRegistry({"echo": echo})


def group(
    key: str, children: int, disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION
) -> EffectGroup:
    return sql_group(
        key, [tool_call(f"{key}/{i}", i, "echo") for i in range(children)], disposition=disposition
    )


async def concurrent(dsn: str, schema: str, prefix: str, groups: int, children: int) -> None:
    host = SqlEffectHost(
        PostgresStore(dsn, schema=schema, pool_size=4), registry(), lease_ttl=5, renew_every=1
    )
    await host.start()
    try:

        async def one(i: int) -> None:
            g = group(f"{prefix}:group:{i}:0", children)
            handle = await host.open_effect_group(g)
            while not handle.exhausted:
                await host.await_next_settlement(handle)

        await asyncio.gather(*(one(i) for i in range(groups)))
    finally:
        await host.aclose()


async def crash(path: str, key: str, children: int, point: str, k: int) -> None:
    fault = killer(point, k)
    store = SqliteStore(path, fault=fault)
    host = SqlEffectHost(store, registry(), lease_ttl=0.6, renew_every=0.1, fault=fault)
    await host.start()
    disposition = LoserPolicy.CANCEL if point.startswith("close") else LoserPolicy.RUN_TO_COMPLETION
    g = group(key, children, disposition)
    handle = await host.open_effect_group(g)
    await host.await_next_settlement(handle)
    if point.startswith("close"):
        await host.close_effect_group(handle)
    while not handle.exhausted:
        await host.await_next_settlement(handle)
    print("survived", flush=True)


def killer(point: str | None, k: int) -> Callable[[str], None]:
    hits = {"n": 0}

    def fault(name: str) -> None:
        if name == point:
            hits["n"] += 1
            if hits["n"] >= k:
                os.kill(os.getpid(), signal.SIGKILL)

    return fault


async def recover(path: str, key: str, children: int, point: str | None = None, k: int = 1) -> None:
    fault = killer(point, k)
    host = SqlEffectHost(
        SqliteStore(path, fault=fault),
        registry(),
        lease_ttl=0.6,
        renew_every=0.1,
        fault=fault,
    )
    await host.start()
    try:
        record = await host.store.get_group(key)
        assert record is not None
        disposition = LoserPolicy(record.disposition)
        handle = await host.open_effect_group(group(key, children, disposition))
        drain = host.drain()
        while True:
            rows = await host.store.children(key)
            if rows and all(r.state == "settled" for r in rows):
                break
            await drain.run_pass()
            await asyncio.sleep(0.05)  # waiting for leases to expire on the DB clock
        ranks = []
        while not handle.exhausted:
            s = await host.await_next_settlement(handle)
            ranks.append([s.rank, s.replay_key, s.outcome.status])
        print(json.dumps(ranks), flush=True)
    finally:
        await host.aclose()


async def hold(path: str, key: str, children: int) -> None:
    running = 0
    all_run = asyncio.Event()

    async def never(_value: object) -> object:
        nonlocal running
        running += 1
        if running == children:
            all_run.set()
        await asyncio.Event().wait()

    host = SqlEffectHost(
        SqliteStore(path), ToolRegistry({"echo": never}), lease_ttl=0.6, renew_every=0.1
    )
    await host.start()
    await host.open_effect_group(group(key, children))
    await all_run.wait()
    print("running", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "concurrent":
        asyncio.run(concurrent(args[0], args[1], args[2], int(args[3]), int(args[4])))
    elif mode == "crash":
        asyncio.run(crash(args[0], args[1], int(args[2]), args[3], int(args[4])))
    elif mode == "recover":
        point = args[3] if len(args) > 3 else None
        k = int(args[4]) if len(args) > 4 else 1
        asyncio.run(recover(args[0], args[1], int(args[2]), point, k))
    elif mode == "hold":
        asyncio.run(hold(args[0], args[1], int(args[2])))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
