"""R-13 on SQLite and PostgreSQL: the losers of a decided ``CANCEL`` group stay down after
a crash. A caller process opens a 4-child race, reads until its wake policy is met and is
SIGKILLed with the losers running; a second incarnation (this process) then reopens. Every
tool start, in either process, appends the child's replay key to a file."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _r13_worker import race_group, record_start
from sql_support import running

from effecthost.contract import GroupHandle, LoserPolicy, Settlement, ToolRegistry, WakePolicy
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

WORKER = str(Path(__file__).with_name("_r13_worker.py"))
KEY = "r13:group:race:0"
LOSERS = [f"{KEY}/{i}" for i in (1, 2, 3)]
FIRST, FIRST_SUCCESS, ALL = WakePolicy.FIRST, WakePolicy.FIRST_SUCCESS, WakePolicy.ALL
CANCEL, RTC = LoserPolicy.CANCEL, LoserPolicy.RUN_TO_COMPLETION


@dataclass
class Db:
    spec: str  # how the worker names the store
    starts: Path
    make: Any  # () -> Store

    def count(self) -> Counter[str]:
        text = self.starts.read_text() if self.starts.exists() else ""
        return Counter(text.splitlines())


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    starts = tmp_path / "starts.txt"
    if request.param == "sqlite":
        path = tmp_path / "r13.sqlite3"
        return Db(f"sqlite:{path}", starts, lambda: SqliteStore(path))
    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    return Db(f"postgres:{dsn}|{schema}", starts, lambda: PostgresStore(dsn, schema=schema))


class Restarts:
    """The tool of this (second) incarnation: records its start and returns at once."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.here: Counter[str] = Counter()
        self.changed = asyncio.Event()

    async def rec(self, value: Any) -> str:
        record_start(str(self.db.starts), value["key"])
        self.here[value["key"]] += 1
        self.changed.set()
        return "ran again"

    async def until(self, count: int) -> None:
        while sum(self.here.values()) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)


@pytest.fixture
async def second(db: Db) -> AsyncIterator[tuple[SqlEffectHost, Restarts]]:
    restarts = Restarts(db)
    async with running(
        SqlEffectHost(
            db.make(), ToolRegistry({"rec": restarts.rec}), lease_ttl=0.6, renew_every=0.1
        )
    ) as (host,):
        yield host, restarts


async def crashed_caller(db: Db, host: SqlEffectHost, wake: WakePolicy, disposition: str) -> None:
    """Run the first incarnation until its group is decided, SIGKILL it, and wait until its
    leases and its claim on the group expired on the database clock."""
    worker = await asyncio.create_subprocess_exec(
        *[sys.executable, WORKER, "race", db.spec, wake.value, disposition, KEY, str(db.starts)],
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 60)
        assert line.decode().strip() == "decided", line
    finally:
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
    assert all(db.count()[key] == 1 for key in LOSERS), db.count()
    while True:  # a bounded wait for the database clock to pass the dead leases
        rows = [r for r in await host.store.unfinished() if r.group_key == KEY]
        if all(r.lease_expired and not r.owner_live for r in rows):
            break
        await asyncio.sleep(0.05)


async def read(host: SqlEffectHost, handle: GroupHandle) -> Settlement:
    return await asyncio.wait_for(host.await_next_settlement(handle), 15)


def group(wake: WakePolicy, disposition: LoserPolicy = CANCEL) -> Any:
    return race_group(KEY, wake, disposition)


async def test_R13_a_restarted_race_rereads_rank_1_and_closes_without_a_loser_starting(
    db: Db, second: tuple[SqlEffectHost, Restarts]
) -> None:
    """R-13: a restarted ``race`` caller reopens after the leases expired, re-reads rank 1,
    runs its own drain pass and closes: no loser's tool starts a second time, and every
    loser ranks as cancelled."""
    host, _ = second
    await crashed_caller(db, host, FIRST, "cancel")
    handle = await host.open_effect_group(group(FIRST))
    first = await read(host, handle)
    assert first.replay_key == f"{KEY}/0"
    report = await host.drain().run_pass()
    assert not report.resumed and not report.cancelled, report
    await host.close_effect_group(handle)
    await host.idle()
    assert await host.store.retired(KEY) is not None  # every loser settled (cancelled)
    assert [db.count()[key] for key in LOSERS] == [1, 1, 1]


async def test_R13_a_caller_that_reads_on_gets_every_rank_from_losers_run_on_demand(
    db: Db, second: tuple[SqlEffectHost, Restarts]
) -> None:
    """R-13: after the reopen nothing starts the losers; a caller that awaits rank 2 (which
    does not exist yet) has them started again, and every rank is served."""
    host, _ = second
    await crashed_caller(db, host, FIRST, "cancel")
    handle = await host.open_effect_group(group(FIRST))
    assert (await read(host, handle)).replay_key == f"{KEY}/0"
    assert [db.count()[key] for key in LOSERS] == [1, 1, 1]
    rest = [await read(host, handle) for _ in LOSERS]
    assert sorted(s.replay_key for s in rest) == LOSERS
    assert all(s.outcome.status == "success" for s in rest), rest
    assert [db.count()[key] for key in LOSERS] == [2, 2, 2]
    await host.close_effect_group(handle)


async def test_R13_a_drain_before_the_reopen_cancels_the_losers(
    db: Db, second: tuple[SqlEffectHost, Restarts]
) -> None:
    """R-13 and G-29: a drain pass while the caller is gone cancels the losers; none runs
    again, and the reopened caller reads them as cancelled ranks."""
    host, _ = second
    await crashed_caller(db, host, FIRST, "cancel")
    report = await host.drain().run_pass()
    assert sorted(ids[1] for ids in report.cancelled) == LOSERS and not report.resumed
    handle = await host.open_effect_group(group(FIRST))
    ranks = [await read(host, handle) for _ in range(4)]
    assert [s.outcome.status for s in ranks[1:]] == ["cancelled"] * 3
    await host.close_effect_group(handle)
    assert [db.count()[key] for key in LOSERS] == [1, 1, 1]


async def test_R13_first_success_with_a_recorded_success_keeps_its_losers_down(
    db: Db, second: tuple[SqlEffectHost, Restarts]
) -> None:
    """R-13: a ``FIRST_SUCCESS`` group is decided once a success holds a rank (here rank 2,
    after a failure): a reopen that re-reads up to the success and closes starts neither
    remaining loser again."""
    host, _ = second
    await crashed_caller(db, host, FIRST_SUCCESS, "cancel")
    handle = await host.open_effect_group(group(FIRST_SUCCESS))
    assert (await read(host, handle)).outcome.status == "error"
    assert (await read(host, handle)).outcome.status == "success"
    report = await host.drain().run_pass()
    assert not report.resumed, report
    await host.close_effect_group(handle)
    await host.idle()
    assert await host.store.retired(KEY) is not None
    assert [db.count()[key] for key in LOSERS[1:]] == [1, 1]


@pytest.mark.parametrize(
    ("wake", "disposition"), [(ALL, CANCEL), (FIRST, RTC)], ids=["all-cancel", "first-rtc"]
)
async def test_R13_all_groups_and_run_to_completion_losers_restart_at_the_reopen(
    db: Db, second: tuple[SqlEffectHost, Restarts], wake: WakePolicy, disposition: LoserPolicy
) -> None:
    """R-13 leaves these as they were (G-28, G-35): an ``ALL`` group is never decided, and
    ``RUN_TO_COMPLETION`` losers run on; the reopen itself starts the unsettled children
    again, before the caller reads anything."""
    host, restarts = second
    await crashed_caller(db, host, wake, disposition.value)
    handle = await host.open_effect_group(group(wake, disposition))
    await restarts.until(3)
    assert sorted(restarts.here) == LOSERS
    ranks = [await read(host, handle) for _ in range(4)]
    assert [s.outcome.status for s in ranks] == ["success"] * 4
    await host.close_effect_group(handle)
