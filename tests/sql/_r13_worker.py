"""A caller process for the R-13 tests (run as a script, never imported by pytest but
for :func:`race_group` and :func:`record_start`).

  race STORE WAKE DISPOSITION KEY STARTS   open a 4-child group on STORE (``sqlite:PATH``
                                           or ``postgres:DSN|SCHEMA``), read ranks until
                                           its wake policy is met, print ``decided`` and
                                           wait to be SIGKILLed

Every tool start appends its replay key to the file STARTS. Child 0 settles at once (it
fails under ``first_success``, where child 1 succeeds and takes rank 2); the others never
return in this process.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    ToolError,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore
from effecthost.hosts.sql._store import Store

CHILDREN = 4


def store_of(spec: str) -> Store:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        return SqliteStore(where)
    dsn, _, schema = where.partition("|")
    return PostgresStore(dsn, schema=schema)


def race_group(key: str, wake: WakePolicy, disposition: LoserPolicy) -> EffectGroup:
    """Children ``0..3``; each one's input says what it does in the first incarnation."""
    success = wake is WakePolicy.FIRST_SUCCESS
    plan = ["fail" if success else "ok", "ok" if success else "block", "block", "block"]
    return EffectGroup(
        key=key,
        wake=wake,
        disposition=disposition,
        children=[
            EffectEnvelope(
                replay_key=f"{key}/{i}",
                kind=EffectKind.TOOL_CALL,
                name="rec",
                input={"key": f"{key}/{i}", "plan": plan[i]},
            )
            for i in range(CHILDREN)
        ],
    )


def record_start(starts: str, replay_key: str) -> None:
    with open(starts, "a", encoding="utf-8") as out:
        out.write(replay_key + "\n")


async def race(spec: str, wake: str, disposition: str, key: str, starts: str) -> None:
    async def rec(value: Any) -> str:
        record_start(starts, value["key"])
        if value["plan"] == "block":
            await asyncio.Event().wait()
        if value["plan"] == "fail":
            raise ToolError("fails first")
        return str(value["plan"])

    group = race_group(key, WakePolicy(wake), LoserPolicy(disposition))
    host = SqlEffectHost(store_of(spec), ToolRegistry({"rec": rec}), lease_ttl=0.6, renew_every=0.1)
    await host.start()
    handle = await host.open_effect_group(group)
    while True:
        settlement = await host.await_next_settlement(handle)
        if group.wake is not WakePolicy.FIRST_SUCCESS or settlement.outcome.status == "success":
            break
    print("decided", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode != "race":
        raise SystemExit(f"unknown mode {mode}")
    asyncio.run(race(*args))


if __name__ == "__main__":
    main(sys.argv[1:])
