"""docs/conformance.md states the suite's counts (checks, what each shipped factory runs
and skips, the cited obligations and rulings, the mutant catalog per harness and per id);
they are generated from the suite by scripts/conformance_counts.py, and this keeps them
true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_conformance_page_counts_are_the_suites() -> None:
    """A new check, capability or mutant without the page regenerated fails here."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "conformance_counts.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
