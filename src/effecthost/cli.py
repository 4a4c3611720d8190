"""The ``effecthost`` command: ``conformance``, ``inspect`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Sequence

from effecthost.contract import EffectController


async def _load_controller(spec: str) -> EffectController:
    """``MODULE:ATTR`` naming a controller, or a callable (sync or async) returning one."""
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise SystemExit(f"effecthost: host must be given as MODULE:ATTR, got {spec!r}")
    target = getattr(importlib.import_module(module_name), attribute)
    made = target if isinstance(target, EffectController) else target()
    if inspect.isawaitable(made):
        made = await made
    if not isinstance(made, EffectController):
        raise SystemExit(f"effecthost: {spec} did not give an EffectController")
    return made


def _conformance(args: argparse.Namespace) -> int:
    from effecthost.conformance import CheckResult, all_checks, load_factory, matches, run_suite

    if args.list:
        for check in all_checks():
            if matches(args.k, check):
                print(f"{check.node_name:<72} {check.doc}")
        return 0
    factory = load_factory(args.factory)
    width = max(len(c.node_name) for c in all_checks())

    def show(result: CheckResult) -> None:
        mark = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[result.status]
        line = f"{mark}  {result.check.node_name:<{width}}  {result.seconds:6.2f}s"
        if result.reason:
            line += f"  {result.reason}"
        print(line, flush=True)

    report = asyncio.run(run_suite(factory, select=args.k, on_result=show))
    print()
    print(report.table())
    return 0 if report.ok else 1


def _inspect(args: argparse.Namespace) -> int:
    spec = args.host or os.environ.get("EFFECTHOST_HOST")
    if not spec:
        print("effecthost inspect: give --host MODULE:ATTR or set EFFECTHOST_HOST", file=sys.stderr)
        return 2

    async def main() -> list[str]:
        controller = await _load_controller(spec)
        return await controller.open_group_keys()

    keys = asyncio.run(main())
    for key in keys:
        print(key)
    print(f"{len(keys)} open group(s)", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from effecthost._demo import run_demo

    return asyncio.run(run_demo(slow_seconds=args.slow, deadline_seconds=args.deadline))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="effecthost", description="Durable concurrent effects: tools for hosts and users."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    conformance = commands.add_parser(
        "conformance", help="run the conformance suite against a host factory"
    )
    conformance.add_argument("factory", nargs="?", metavar="MODULE:FACTORY")
    conformance.add_argument("-k", metavar="EXPR", help="select checks (ids, names; and/or/not)")
    conformance.add_argument("--list", action="store_true", help="list the checks and exit")
    conformance.set_defaults(run=_conformance)

    inspect_ = commands.add_parser("inspect", help="list the open group keys of a host")
    inspect_.add_argument(
        "--host", metavar="MODULE:ATTR", help="a controller, or a callable returning one"
    )
    inspect_.set_defaults(run=_inspect)

    demo = commands.add_parser("demo", help="a race against a deadline and an all, traced")
    demo.add_argument("--slow", type=float, default=2.0, help="seconds the slow tool takes")
    demo.add_argument("--deadline", type=float, default=0.3, help="the race's deadline")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "conformance" and not args.list and not args.factory:
        build_parser().error("conformance needs MODULE:FACTORY (or --list)")
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
