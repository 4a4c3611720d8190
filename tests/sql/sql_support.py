"""Builders the SQL tier tests share: groups of tool or event children, store-level
child specs and outcomes, started hosts and stores, a database with its raw SQL, and a
bounded poll of the database."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from group_support import event as event
from group_support import group as group
from group_support import tool as tool

from effecthost.contract import (
    EffectGroup,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
    WakePolicy,
)
from effecthost.hosts.sql import SqlEffectHost, Store
from effecthost.hosts.sql._store import ChildSpec


@dataclass
class Substrate:
    """One database of the ``substrate`` fixture: its kind, a maker of stores on it, its
    raw SQL (``testing.sqlite_sql`` or ``postgres_sql``) and, on SQLite, the file."""

    name: str
    make_store: Callable[[], Store]
    sql: Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]]
    path: Path | None = None


@contextlib.asynccontextmanager
async def running(*made: Any) -> AsyncIterator[tuple[Any, ...]]:
    """The hosts or stores ``made``, started in order; at the end, whatever happened, those
    that started are closed, the last first."""
    up: list[Any] = []
    try:
        for each in made:
            await each.start()
            up.append(each)
        yield made
    finally:
        for each in reversed(up):
            await each.aclose()


def tools_group(
    key: str,
    n: int = 2,
    disposition: LoserPolicy = LoserPolicy.CANCEL,
    wake: WakePolicy = WakePolicy.FIRST,
) -> EffectGroup:
    """``n`` children of tool ``t``, replay keys ``{key}.c{i}``, input ``i``."""
    return group(key, [tool(f"{key}.c{i}", i) for i in range(n)], wake, disposition)


def event_group(key: str) -> EffectGroup:
    """A ``first``/``cancel`` group of one ``await_event`` child ``{key}.e`` on event ``go``."""
    return group(key, [event(f"{key}.e", value=0)], WakePolicy.FIRST, LoserPolicy.CANCEL)


def spec(key: str, position: int = 0, *, claim: bool = False) -> ChildSpec:
    """A store-level child of tool ``t``."""
    return ChildSpec(
        replay_key=key,
        position=position,
        kind="tool_call",
        name="t",
        envelope="{}",
        envelope_hash="h",
        claim=claim,
    )


def ok(value: str) -> str:
    """A success outcome as the store records it."""
    return Outcome.success(value).model_dump_json()


async def until(probe: Callable[[], Awaitable[Any]], what: str, bound: float = 10.0) -> Any:
    """Poll ``probe`` until it returns something truthy (a bounded wait, not an ordering)."""
    async with asyncio.timeout(bound):
        while not (got := await probe()):  # noqa: ASYNC110 - polls the database
            await asyncio.sleep(0.02)
    assert got, what
    return got


async def parked_wait(waiter: SqlEffectHost, handle: GroupHandle) -> asyncio.Future[Settlement]:
    """``waiter.await_next_settlement(handle)`` started and parked (gone to sleep on its
    wake-up once, having found nothing to return); the host's sleep is its own again once
    the wait ends."""
    parked = asyncio.Event()
    real_sleep = waiter._sleep

    async def sleep(w: asyncio.Future[None]) -> None:
        parked.set()
        await real_sleep(w)

    waiter._sleep = sleep  # type: ignore[method-assign]
    waiting = asyncio.ensure_future(waiter.await_next_settlement(handle))
    waiting.add_done_callback(lambda _: setattr(waiter, "_sleep", real_sleep))
    async with asyncio.timeout(10):
        await parked.wait()
    return waiting


async def drain_until_settled(host: SqlEffectHost, key: str, what: str) -> None:
    """Drain passes of ``host`` until every child of group ``key`` has settled (bounded:
    the database clock must first pass a killed driver's lease)."""
    passes = host.drain()
    deadline = time.monotonic() + 30
    while any(r.state != "settled" for r in await host.store.children(key)):
        assert time.monotonic() < deadline, what
        await passes.run_pass()
        await asyncio.sleep(0.05)  # the database clock passing the dead lease's TTL


def kill_once_running(command: list[str]) -> None:
    """Start a caller process, wait for it to print ``running`` (its children are under
    way) and SIGKILL it there: a crash, not a shutdown."""
    caller = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    line = caller.stdout.readline()
    caller.send_signal(signal.SIGKILL)
    _out, err = caller.communicate(timeout=30)
    assert line.strip() == "running", err
