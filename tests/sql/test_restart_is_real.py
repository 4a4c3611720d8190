"""The SQL conformance factories restart for real: the process that ran the children is
SIGKILLed, so a dead incarnation's child cannot make a broken host pass."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from effecthost.conformance import FactoryEnv, mark_killed, run_suite
from effecthost.hosts.sql import SqliteStore
from effecthost.hosts.sql.testing import SqlHostUnderTest, sqlite_factory

pytestmark = pytest.mark.anyio

MUTANTS = str(Path(__file__).parents[1] / "mutants")


def _broken_drain_factory(env: FactoryEnv) -> SqlHostUnderTest:
    path = env.work_dir / "effecthost.sqlite3"
    return SqlHostUnderTest(
        env,
        {"store": "sqlite", "path": str(path)},
        lambda: SqliteStore(path),
        host_class="sql_mutants:CancellingDrainSqlHost",
        sys_path=[MUTANTS],
    )


class _ZombieHost(SqlHostUnderTest):
    """A factory whose restart says it killed the deployment process but leaves it
    running (what the old in-process restart amounted to)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zombies: list[subprocess.Popen[bytes]] = []

    async def restart(self) -> None:
        proc, self._proc = self._proc, None
        await super().restart()
        if proc is not None:
            self.zombies.append(proc)
            mark_killed(self._env.lab_path, proc.pid)

    async def aclose(self) -> None:
        await super().aclose()
        for proc in self.zombies:
            proc.kill()
            proc.wait()


def _zombie_factory(env: FactoryEnv) -> SqlHostUnderTest:
    path = env.work_dir / "effecthost.sqlite3"
    return _ZombieHost(env, {"store": "sqlite", "path": str(path)}, lambda: SqliteStore(path))


@pytest.mark.timeout(120)
async def test_G28_G29_a_drain_that_cancels_run_to_completion_losers_fails_the_suite() -> None:
    """G-28, G-29 (issue: restart was not a restart): a drain that settles a gone caller's
    RUN_TO_COMPLETION loser as cancelled used to pass, because the dead incarnation's
    child task, still running in the test process, reported ``finished``. With the
    children in a deployment process that restart SIGKILLs, the check fails it."""
    report = await run_suite(_broken_drain_factory, select="drain_finishes_losers")
    assert [r.status for r in report.results] == ["failed"], report.results


@pytest.mark.timeout(120)
async def test_G28_the_correct_host_passes_the_same_check() -> None:
    """G-28: the control — the unbroken host passes the check the broken one fails."""
    report = await run_suite(sqlite_factory, select="drain_finishes_losers")
    assert [r.status for r in report.results] == ["passed"], report.results


@pytest.mark.timeout(120)
async def test_G15_an_event_from_a_killed_process_fails_the_check() -> None:
    """G-15, G-09: a restart must leave no child of the dead incarnation running. A
    factory that does not really kill its deployment process is caught by the lab: the
    old process's child reports an event after the restart, from a pid marked killed."""
    report = await run_suite(_zombie_factory, select="drain_finishes_losers")
    (result,) = report.results
    assert result.status == "failed"
    assert "killed process" in result.reason, result.reason
