"""Bounded stops for the long-running engine processes (a Restate endpoint, a Temporal
worker): both engines retry what a stopping process leaves unfinished, so exiting late
is never worth more than exiting."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable

DEFAULT_GRACE = 5.0
"""Seconds a stopping process lets running children finish before cutting them off."""

FORCE_AFTER = 2.0
"""Seconds past the grace after which a stopping process exits even though something
(a tool's thread, a task ignoring cancellation) still holds it."""


def add_grace_option(parser: argparse.ArgumentParser, running: str) -> None:
    """``--grace``: the seconds ``running`` get to finish after SIGTERM/SIGINT."""
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        help=f"seconds {running} get to finish after SIGTERM/SIGINT",
    )


def exit_after(seconds: float) -> None:
    """Make sure this process is gone ``seconds`` from now, whatever still runs in it.

    Exit code 0: what it abandons is retried by the engine, as after any cut-off.
    """

    def force() -> None:
        sys.stderr.write(f"effecthost: still running {seconds:g}s after the stop; exiting\n")
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()


class Stopper:
    """The signal handler of a stopping process: the first signal calls ``stop`` and
    arms :func:`exit_after` (``grace`` + :data:`FORCE_AFTER`); a second exits at once."""

    def __init__(self, stop: Callable[[], None], grace: float) -> None:
        self._stop = stop
        self._grace = grace
        self.stopping = False

    def __call__(self) -> None:
        if self.stopping:
            exit_after(0)
            return
        self.stopping = True
        exit_after(self._grace + FORCE_AFTER)
        self._stop()
