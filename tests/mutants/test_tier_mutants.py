"""The tier tests against the tier mutants: every mutant of ``tier_mutants.py`` makes a
test fail whose docstring (or its module's) cites the id the mutant breaks. The mutant is
applied in the pytest process and, through a ``sitecustomize`` on ``PYTHONPATH``, in every
Python process the tier tests start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tier_mutants import CHILD_ENV, MUTANT_ENV, REPORT_ENV, TIER_MUTANTS, TierMutant

ROOT = Path(__file__).parents[2]

SITECUSTOMIZE = f"""\
import os

if os.environ.get({CHILD_ENV!r}):
    import tier_mutants

    tier_mutants.by_name(os.environ[{CHILD_ENV!r}]).apply()
"""
"""Applies the mutant in every Python process the tier tests start (drain workers, crash
workers, the CLI): they inherit the ``PYTHONPATH`` that holds it, and the variable the
plugin sets once pytest has started (pytest itself imports effecthost only afterwards)."""


def _params() -> list[object]:
    return [pytest.param(m, id=f"{m.breaks}-{m.name}") for m in TIER_MUTANTS]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mutant", _params())
def test_tier_mutant_is_killed_on_its_own_id(mutant: TierMutant, tmp_path: Path) -> None:
    report = tmp_path / "failed.json"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ,
        MUTANT_ENV: mutant.name,
        REPORT_ENV: str(report),
        "PYTHONPATH": os.pathsep.join(
            [str(site), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tier_mutants",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *mutant.tests,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert report.exists(), (
        f"the tier run did not report:\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    )
    assert run.returncode in (0, 1), (
        f"the tier run broke:\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    )
    failed = json.loads(report.read_text())
    killers = [f["nodeid"] for f in failed if re.search(rf"\b{mutant.breaks}\b", f["doc"])]
    assert killers, (
        f"{mutant.name} survived: no failing tier test cites {mutant.breaks} ({mutant.doc})\n"
        + "\n".join(f"{f['nodeid']}" for f in failed)
        + run.stdout[-1500:]
    )
