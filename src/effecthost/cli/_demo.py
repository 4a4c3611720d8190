"""``effecthost demo``: a race against a deadline and an all, traced."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any


def _demo(args: argparse.Namespace) -> int:
    from effecthost._demo import run_demo

    return asyncio.run(run_demo(slow_seconds=args.slow, deadline_seconds=args.deadline))


def add_parser(commands: Any) -> None:
    """Add the command to ``commands`` (the ``effecthost`` subparsers)."""
    demo = commands.add_parser("demo", help="a race against a deadline and an all, traced")
    demo.add_argument("--slow", type=float, default=2.0, help="seconds the slow tool takes")
    demo.add_argument("--deadline", type=float, default=0.3, help="the race's deadline")
    demo.set_defaults(run=_demo)
