"""A caller the SQL telemetry test SIGKILLs (run as a script, never imported by pytest):
it opens the telemetry program's group on SQLite with tools that never return, prints
``running`` once every child runs, and waits to be killed. Its spans go to the file
``EFFECTHOST_TEST_SPANS`` names (``otel_support`` on ``PYTHONPATH``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import otel_support

from effecthost.contract import ToolRegistry
from effecthost.hosts.sql import SqlEffectHost, SqliteStore


async def main(path: str, key: str) -> None:
    started = 0
    every = asyncio.Event()

    async def stuck(_value: Any) -> Any:
        nonlocal started
        started += 1
        if started == otel_support.WIDTH:
            every.set()
        await asyncio.Event().wait()

    host = SqlEffectHost(
        SqliteStore(path), ToolRegistry({"work": stuck}), lease_ttl=0.6, renew_every=0.1
    )
    await host.start()
    await host.open_effect_group(otel_support.program_group(key))
    await every.wait()
    print("running", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
