"""The examples the README points at run as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("quickstart.py", "{'hits': 3, 'query': 'a'}"),
        ("cursor.py", "restored cursor reads rank 1 again: fast"),
    ],
)
def test_example_runs(script: str, expected: str) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert expected in run.stdout
