"""R-9: a combinator cancelled from outside closes its group with the declared
disposition, shielded from the cancellation, before re-raising — on memory and SQLite."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from gated_tools import Lab

from effecthost.combinators import (
    Call,
    Scope,
    all_,
    all_settled,
    any_,
    next_group_key,
    race,
    tool,
    with_deadline,
)
from effecthost.contract import EffectController, LoserPolicy
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.sql import sqlite_host

pytestmark = pytest.mark.anyio

WAIT = 10.0  # a hang guard, never an ordering


class StopLab(Lab):
    """A :class:`Lab` whose ``stopped`` events tell when a started child ended (cancelled
    or finished), so a test waits for the losers instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def step(self, spec: dict[str, Any]) -> Any:
        try:
            return await super().step(spec)
        finally:
            self.stopped[spec["label"]].set()


@pytest.fixture
def lab() -> StopLab:
    return StopLab()


@pytest.fixture(params=["memory", "sqlite"])
async def host(
    request: pytest.FixtureRequest, lab: StopLab, tmp_path: Path
) -> AsyncIterator[EffectController]:
    if request.param == "memory":
        memory = MemoryEffectHost(lab.registry())
        yield memory
        for gate in list(lab.gates.values()):
            gate.set()
        await memory.aclose()
    else:
        sql = await sqlite_host(tmp_path / "cancel.sqlite3", lab.registry(), poll_interval=0.05)
        yield sql
        for gate in list(lab.gates.values()):
            gate.set()
        await sql.aclose()


Combinator = Callable[[EffectController, Scope, list[Call]], Awaitable[Any]]

COMBINATORS: dict[str, tuple[Combinator, LoserPolicy]] = {
    "race-cancel": (
        lambda c, s, calls: race(c, s, calls, disposition=LoserPolicy.CANCEL),
        LoserPolicy.CANCEL,
    ),
    "race": (lambda c, s, calls: race(c, s, calls), LoserPolicy.RUN_TO_COMPLETION),
    "any-cancel": (
        lambda c, s, calls: any_(c, s, calls, disposition=LoserPolicy.CANCEL),
        LoserPolicy.CANCEL,
    ),
    "all": (lambda c, s, calls: all_(c, s, calls), LoserPolicy.RUN_TO_COMPLETION),
    "all_settled": (lambda c, s, calls: all_settled(c, s, calls), LoserPolicy.RUN_TO_COMPLETION),
    "with_deadline": (
        lambda c, s, calls: with_deadline(c, s, calls[0], 3600.0),
        LoserPolicy.CANCEL,
    ),
}


async def _outer_cancel(how: str, lab: Lab, labels: list[str], work: Awaitable[Any]) -> None:
    """Cancel ``work`` from outside once its children have started, the way ``how`` says."""

    async def started() -> None:
        for label in labels:
            await lab.started[label].wait()

    if how == "task.cancel":
        task = asyncio.ensure_future(work)
        await asyncio.wait_for(started(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)
    elif how == "timeout":
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as scope:
                waiter = asyncio.ensure_future(started())
                waiter.add_done_callback(
                    lambda _f: scope.reschedule(asyncio.get_running_loop().time())
                )
                await work
    else:  # wait_for: a deadline that passes while the children wait on their gates
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(work, 0.3)


@pytest.mark.parametrize("how", ["task.cancel", "timeout", "wait_for"])
@pytest.mark.parametrize("name", sorted(COMBINATORS))
async def test_r9_outer_cancellation_closes_the_group_with_its_disposition(
    host: EffectController, lab: StopLab, name: str, how: str
) -> None:
    """R-9: cancelling a combinator from outside (``task.cancel()``, ``asyncio.timeout``,
    ``asyncio.wait_for``) closes its group before the cancellation propagates: the group
    is no longer open; under ``CANCEL`` the losers are cancelled, under
    ``RUN_TO_COMPLETION`` they run on and finish."""
    combinator, disposition = COMBINATORS[name]
    labels = ["a"] if name == "with_deadline" else ["a", "b"]
    calls = [tool("step", {"label": label}) for label in labels]
    scope = Scope(scope_id=f"outer-{name}-{how}")
    key = next_group_key(
        scope, calls if name != "with_deadline" else [calls[0], _deadline_arm(3600.0)]
    )
    await _outer_cancel(how, lab, labels, combinator(host, scope, calls))
    assert key not in await host.open_group_keys()
    if disposition is LoserPolicy.CANCEL:
        for label in labels:  # every run that started was cancelled; none finished
            if lab.runs[label]:
                await asyncio.wait_for(lab.stopped[label].wait(), WAIT)
            assert lab.cancelled[label] == lab.runs[label]
            assert not lab.finished[label].is_set()
    else:
        assert sum(lab.cancelled.values()) == 0
        for label in labels:
            lab.gates[label].set()
        for label in labels:
            await asyncio.wait_for(lab.finished[label].wait(), WAIT)


def _deadline_arm(seconds: float) -> Call:
    from effecthost.combinators import sleep

    return sleep(seconds)
