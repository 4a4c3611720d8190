"""The engine examples run as their READMEs say: each script a process of its own in the
example's directory, a long-running one stopped as a process manager stops it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_script(example: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``examples/EXAMPLE``, to completion (bounded), output captured."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=EXAMPLES / example,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def start_script(example: str, *args: str) -> subprocess.Popen[bytes]:
    """``python ARGS`` in ``examples/EXAMPLE``, left running, its output dropped."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=EXAMPLES / example,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_script(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as a process manager stops it; its exit code (SIGKILL after a bound)."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"{process.args} still ran 15 s after SIGTERM") from None
