"""A caller the SQL telemetry tests SIGKILL (run as a script, never imported by pytest):
it opens the telemetry program's group with tools that never return, prints ``running``
with its group span's trace id and span id (hex) once every child runs, and waits to be
killed. Its spans go to the file ``EFFECTHOST_TEST_SPANS`` names (``otel_support`` on
``PYTHONPATH``).

Usage: ``_otel_caller.py sqlite PATH KEY`` or ``_otel_caller.py postgres DSN SCHEMA KEY``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import otel_support
from opentelemetry.sdk.trace import SpanProcessor

from effecthost.contract import ToolRegistry
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store


class _GroupSpan(SpanProcessor):
    """Keeps the group span's context when it starts (it never ends: the process is
    killed), so the test can check the children another process ran hang under it."""

    def __init__(self) -> None:
        self.started: Any = None

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if span.name == "effecthost.group":
            self.started = span.get_span_context()


async def main(store: Store, key: str) -> None:
    started = 0
    every = asyncio.Event()

    async def stuck(_value: Any) -> Any:
        nonlocal started
        started += 1
        if started == otel_support.WIDTH:
            every.set()
        await asyncio.Event().wait()

    group_span = _GroupSpan()
    assert otel_support._provider is not None
    otel_support._provider.add_span_processor(group_span)
    host = SqlEffectHost(store, ToolRegistry({"work": stuck}), lease_ttl=0.6, renew_every=0.1)
    await host.start()
    await host.open_effect_group(otel_support.program_group(key))
    await every.wait()
    ids = group_span.started
    print(f"running {ids.trace_id:032x} {ids.span_id:016x}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1] == "sqlite":
        store: Store = SqliteStore(sys.argv[2])
        key = sys.argv[3]
    else:
        store = PostgresStore(sys.argv[2], schema=sys.argv[3], pool_size=2)
        key = sys.argv[4]
    asyncio.run(main(store, key))
