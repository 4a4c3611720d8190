"""Real SQLite groups for the timeline page: a race whose losers were cancelled and a
20-child all, both left open the way an operator finds them. Used by the page tests and
by scripts/timeline_screenshot.py (the picture in docs/)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from gated_tools import Lab, group, step

from effecthost.contract import LoserPolicy, WakePolicy
from effecthost.hosts.sql import sqlite_host

WAIT = 20.0  # a hang guard, never an ordering

RACE = "search:race:0"
RACE_TOOLS = ("search.web", "search.cache", "search.index")
RACE_LABELS = ("web", "cache", "index")
"""Position 1 (``search.cache``) settles first; 0 and 2 are the cancelled losers."""

ALL = "ingest:all:0"
ALL_TOOLS = ("fetch.page", "parse.html", "embed.chunk", "store.vector")
ORDER = [(7 * i + 3) % 20 for i in range(20)]
"""The positions of the 20-child all in the order their gates open (rank order)."""
HELD = 3
"""How many of the all's children are still running in the first picture."""


async def race_with_cancelled_losers(db: Path) -> None:
    """A ``race`` declared ``CANCEL`` whose caller died after rank 1 without closing: a
    drain applied the declared disposition (G-29), so the losers settled cancelled and
    took ranks 2 and 3, and the group is still open (no close came, G-30)."""
    lab = Lab()
    caller = await sqlite_host(db, lab.registry(*RACE_TOOLS), lease_ttl=1.0, renew_every=0.2)
    race = group(
        RACE,
        *(step(label, name=tool) for label, tool in zip(RACE_LABELS, RACE_TOOLS, strict=True)),
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
    )
    handle = await caller.open_effect_group(race)
    lab.gates["cache"].set()
    first = await asyncio.wait_for(caller.await_next_settlement(handle), WAIT)
    assert first.position == 1
    orphans = await caller.abandon()  # the caller's process dies before it closes
    other = await sqlite_host(db, lab.registry(*RACE_TOOLS))
    try:
        cancelled: list[tuple[str, str]] = []
        async with asyncio.timeout(WAIT):
            while len(cancelled) < 2:  # until the dead caller's leases have expired
                cancelled += (await other.drain().run_pass()).cancelled
                if len(cancelled) < 2:
                    await asyncio.sleep(0.05)  # polls the database
    finally:
        await other.aclose()
        for task in orphans:
            task.cancel()
        await asyncio.gather(*orphans, return_exceptions=True)


async def all_of_twenty(db: Path, picture: Callable[[], Awaitable[None]]) -> None:
    """A 20-child ``all`` whose children settle in :data:`ORDER`; ``picture`` is called
    twice: with the last :data:`HELD` children still running, then with every child
    settled (the group stays open)."""
    lab = Lab()
    host = await sqlite_host(db, lab.registry(*ALL_TOOLS))
    try:
        children = [step(f"c{i:02d}", name=ALL_TOOLS[i % len(ALL_TOOLS)]) for i in range(20)]
        handle = await host.open_effect_group(group(ALL, *children))
        for index, position in enumerate(ORDER):
            if index == len(ORDER) - HELD:
                await picture()
            lab.gates[f"c{position:02d}"].set()
            settled = await asyncio.wait_for(host.await_next_settlement(handle), WAIT)
            assert (settled.rank, settled.position) == (index + 1, position)
        await picture()
    finally:
        await host.aclose()
