"""Real SIGKILLs of a child-running process (G-35, G-15, G-17) and many processes opening
and finalizing groups at once on PostgreSQL (G-32)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sql_support import running

from effecthost.hosts.sql import PostgresStore

WORKER = str(Path(__file__).with_name("_worker.py"))
CHILDREN = 4


def run_worker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, WORKER, *args], capture_output=True, text=True, timeout=timeout
    )


def recorded(path: Path, key: str) -> dict[int, str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT seq, replay_key FROM eh_children WHERE group_key = ? AND seq IS NOT NULL",
            (key,),
        ).fetchall()
    return {int(seq): str(rk) for seq, rk in rows}


def check_settled_once(path: Path, key: str) -> None:
    with sqlite3.connect(path) as conn:
        counter = conn.execute(
            "SELECT counter FROM eh_groups WHERE group_key = ?", (key,)
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT replay_key, state, seq FROM eh_children WHERE group_key = ?", (key,)
        ).fetchall()
    assert len(rows) == CHILDREN
    assert all(state == "settled" for _, state, _ in rows), rows
    assert sorted(seq for _, _, seq in rows) == list(range(1, CHILDREN + 1))
    assert counter == CHILDREN  # no burned or double-counted sequence


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("point", "k"),
    [
        ("finalize:after_update", 2),  # between the fenced update and the commit
        ("finalize:before_commit", 3),
        ("finalize:after_commit", 2),  # after commit, before the wake
        ("wake", 1),
        ("close:before_commit", 1),  # during close (a CANCEL group)
    ],
)
def test_G35_sigkill_keeps_recorded_ranks_and_settles_each_child_once(
    tmp_path: Path, point: str, k: int
) -> None:
    """G-35, G-15: SIGKILLed at a point of the finalize, the wake or the close, the record
    holds each settled child with its rank (a settlement and its sequence commit
    together); a fresh process serves the ranks recorded before unchanged and settles
    every other child exactly once."""
    path = tmp_path / "crash.sqlite3"
    key = f"crash:group:{point.replace(':', '_')}:0"
    done = run_worker("crash", str(path), key, str(CHILDREN), point, str(k))
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)
    with sqlite3.connect(path) as conn:
        unranked = conn.execute(
            "SELECT replay_key FROM eh_children WHERE group_key = ? AND state = 'settled' "
            "AND seq IS NULL",
            (key,),
        ).fetchall()
    assert not unranked, f"settled without a rank after the SIGKILL: {unranked}"
    before = recorded(path, key)
    out = run_worker("recover", str(path), key, str(CHILDREN))
    assert out.returncode == 0, out.stderr
    ranks = json.loads(out.stdout.strip().splitlines()[-1])
    after = {rank: replay_key for rank, replay_key, _status in ranks}
    for rank, replay_key in before.items():  # G-15: a recorded rank never changes
        assert after[rank] == replay_key
    assert sorted(after) == list(range(1, CHILDREN + 1))
    assert len(set(after.values())) == CHILDREN
    check_settled_once(path, key)
    if point.startswith("close"):  # the declared CANCEL applies though no close committed
        assert any(status == "cancelled" for _r, _k, status in ranks) or len(before) == CHILDREN


@pytest.mark.timeout(120)
def test_G35_sigkill_during_a_drain_claim_then_drain_finishes(tmp_path: Path) -> None:
    path = tmp_path / "claim.sqlite3"
    key = "claim:group:g:0"
    first = run_worker("crash", str(path), key, str(CHILDREN), "finalize:after_update", "2")
    assert first.returncode == -signal.SIGKILL
    before = recorded(path, key)
    claim = run_worker("recover", str(path), key, str(CHILDREN), "claim", "1")
    assert claim.returncode == -signal.SIGKILL, claim.stderr
    assert recorded(path, key) == before or set(before.items()) <= set(recorded(path, key).items())
    out = run_worker("recover", str(path), key, str(CHILDREN))
    assert out.returncode == 0, out.stderr
    after = {rank: rk for rank, rk, _ in json.loads(out.stdout.strip().splitlines()[-1])}
    for rank, replay_key in before.items():
        assert after[rank] == replay_key
    check_settled_once(path, key)


@pytest.mark.timeout(180)
def test_G32_many_groups_opened_and_finalized_from_several_processes(
    pg_dsn: str, pg_schema: str, pg_log: Path | None
) -> None:
    """Three processes open the same 25 groups (and so race on every group row and child
    row) and finalize them all: no deadlock abort (the server's log is read: a deadlock
    victim retried inside the host never reaches a worker's stderr), one group per key,
    dense ranks."""
    offset = pg_log.stat().st_size if pg_log is not None else 0
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "concurrent", pg_dsn, pg_schema, "shared", "25", "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err
        assert "deadlock" not in err.lower()
    if pg_log is not None:
        with pg_log.open("rb") as log:
            log.seek(offset)
            deadlocks = log.read().decode(errors="replace").count("deadlock detected")
        assert deadlocks == 0, f"{deadlocks} deadlocks in the server's log"

    async def check() -> None:
        async with running(PostgresStore(pg_dsn, schema=pg_schema)) as (store,):
            groups = await store.open_groups()
            assert len(groups) == 25  # one group per key
            assert all(g.settled == g.child_count == 4 for g in groups)
            assert await store.unfinished() == []
            for g in groups:
                rows = await store.children(g.group_key)
                assert sorted(r.seq or 0 for r in rows) == [1, 2, 3, 4]  # dense, once each

    asyncio.run(check())
