"""The crash and concurrency harness (scripts/crash_harness.py), short variant: real
SIGKILLs at named phases and at random points, a killed recovery, a takeover past the
lease (SIGSTOP/SIGCONT), and on PostgreSQL an immediate server stop with fsync on; every
verdict read from the database's own record (triggers on the child rows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crash_harness.py"
COUNTS = (
    "divergent",
    "lost",
    "double",
    "stuck",
    "hung",
    "deadlocks",
    "wrong",
    "cancel_ran",
    "loser_restarts",
)


def _run(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.exists(), done.stderr[-3000:]
    summary: dict[str, object] = json.loads(out.read_text())
    assert {k: summary[k] for k in COUNTS} == dict.fromkeys(COUNTS, 0), done.stdout[-4000:]
    assert done.returncode == 0, done.stdout[-4000:]
    return summary


@pytest.mark.timeout(180)
def test_G35_G15_G17_crash_harness_short_run_on_sqlite(tmp_path: Path) -> None:
    """G-35, G-15, G-17, G-29, G-33: every recorded child settles exactly once, ranks stay
    dense and unchanged across SIGKILLs (caller, drain, recovery) and a takeover; no loser
    of a closed CANCEL group runs after the close; nothing hangs or stays stuck."""
    summary = _run(
        tmp_path,
        "--db",
        "sqlite",
        "--kills",
        "4",
        "--seed",
        "7",
        "--modes",
        "named,random,takeover",
    )
    assert summary["kill_points"] >= 4


@pytest.mark.timeout(180)
def test_G35_G33_crash_harness_short_run_on_postgres(tmp_path: Path) -> None:
    """G-35, G-33, G-34: as on SQLite, plus a takeover past the lease (SIGSTOP, SIGCONT)
    and a server crash (immediate stop, fsync on) with crash recovery; no deadlock in the
    server log."""
    summary = _run(
        tmp_path,
        "--db",
        "postgres",
        "--kills",
        "4",
        "--seed",
        "7",
        "--modes",
        "takeover,pgcrash,named,random",
    )
    assert summary["fsync"] is True
    assert summary["modes"].get("pgcrash", 0) >= 1  # type: ignore[union-attr]
