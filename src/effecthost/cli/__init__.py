"""The ``effecthost`` command: ``conformance``, ``inspect``, ``ui``, ``drain`` and ``demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import _conformance, _demo, _drain, _inspection, _ui
from ._common import EXIT_CODES, ExitCode, Refused, _shown, exit_code_help

__all__ = ["EXIT_CODES", "ExitCode", "build_parser", "exit_code_help", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="effecthost", description="Durable concurrent effects: tools for hosts and users."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (_conformance, _inspection, _ui, _drain, _demo):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "conformance" and not (args.list or args.explain or args.factory):
        build_parser().error("conformance needs MODULE:FACTORY (or --list, or --explain ID)")
    try:
        code: int = args.run(args)
    except Refused as refused:
        print(f"effecthost: {_shown(str(refused), 1000)}", file=sys.stderr)
        return refused.code
    finally:
        _release_runtimes()
    return code


def _release_runtimes() -> None:
    """A command that ran a Temporal host or factory drops the SDK's runtime before the
    process exits (see :func:`effecthost.hosts.temporal.release_temporal_runtime`)."""
    if "temporalio.runtime" in sys.modules:
        from effecthost.hosts.temporal import release_temporal_runtime

        release_temporal_runtime()
