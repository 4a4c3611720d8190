"""The ``effecthost`` command: ``conformance``, ``inspect``, ``drain`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Sequence

from effecthost.contract import EffectController, GroupExecutors


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

    if args.explain:
        from effecthost.conformance import UnknownRule, explain

        try:
            print(explain(args.explain))
        except UnknownRule as exc:
            print(f"effecthost: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.list:
        for check in all_checks():
            if matches(args.k, check):
                needs = f"  (needs {', '.join(check.requires)})" if check.requires else ""
                print(f"{check.node_name}{needs}")
                for line in check.doc.splitlines():
                    print(f"    {line}".rstrip())
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


async def _open_host(args: argparse.Namespace, resolver: GroupExecutors | None) -> EffectController:
    """The host named by ``--sqlite FILE``, ``--postgres DSN`` or ``--host MODULE:ATTR``."""
    if args.sqlite or args.postgres:
        from effecthost.hosts.sql import postgres_host, sqlite_host

        if args.sqlite:
            return await sqlite_host(args.sqlite, resolver)
        return await postgres_host(args.postgres, resolver, schema=args.schema)
    spec = args.host or os.environ.get("EFFECTHOST_HOST")
    if not spec:
        print(
            "effecthost: name a host with --sqlite FILE, --postgres DSN or --host MODULE:ATTR "
            "(or set EFFECTHOST_HOST)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return await _load_controller(spec)


async def _close(controller: EffectController) -> None:
    aclose = getattr(controller, "aclose", None)
    if aclose is not None:
        await aclose()


def _inspect(args: argparse.Namespace) -> int:
    async def main() -> int:
        controller = await _open_host(args, None)
        try:
            listing = getattr(controller, "open_groups", None)
            if listing is not None:
                groups = await listing()
                for g in groups:
                    print(
                        f"{g.group_key}  age={g.age_seconds:.0f}s  settled={g.settled}/"
                        f"{g.child_count}  wake={g.wake}  losers={g.effective}"
                    )
                count = len(groups)
            else:
                keys = await controller.open_group_keys()
                for key in keys:
                    print(key)
                count = len(keys)
        finally:
            await _close(controller)
        print(f"{count} open group(s)", file=sys.stderr)
        return 0

    return asyncio.run(main())


def _drain(args: argparse.Namespace) -> int:
    async def main() -> int:
        resolver = _load_resolver(args.resolver) if args.resolver else None
        controller = await _open_host(args, resolver)
        drain = controller.drain()
        try:
            passes = 0
            while True:
                passes += 1
                report = await drain.run_pass()
                print(
                    f"pass {passes}: resumed {len(report.resumed)}, cancelled "
                    f"{len(report.cancelled)}, no executor {len(report.no_executor)}",
                    flush=True,
                )
                for missing in report.no_executor:
                    print(f"  no executor: {missing.group_key} {missing.replay_key}", flush=True)
                if args.once or (args.passes and passes >= args.passes):
                    idle = getattr(controller, "idle", None)
                    if idle is not None:
                        await idle()  # let the children this pass resumed finish
                    return 0
                await asyncio.sleep(args.interval)  # the drain's cadence, not an ordering
        finally:
            await _close(controller)

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 130


def _load_resolver(spec: str) -> GroupExecutors:
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise SystemExit(f"effecthost: resolver must be given as MODULE:ATTR, got {spec!r}")
    target = getattr(importlib.import_module(module_name), attribute)
    made = target if isinstance(target, GroupExecutors) else target()
    if not isinstance(made, GroupExecutors):
        raise SystemExit(f"effecthost: {spec} did not give a GroupExecutors resolver")
    return made


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
    conformance.add_argument(
        "--list", action="store_true", help="list the checks with their descriptions and exit"
    )
    conformance.add_argument(
        "--explain",
        metavar="ID",
        help="print obligation (G-20) or ruling (R-4) ID of docs/spec.md and the checks citing it",
    )
    conformance.set_defaults(run=_conformance)

    inspect_ = commands.add_parser("inspect", help="list the open groups of a host")
    _host_options(inspect_)
    inspect_.set_defaults(run=_inspect)

    drain = commands.add_parser(
        "drain", help="finish children whose caller or process is gone (SQL tiers)"
    )
    _host_options(drain)
    drain.add_argument(
        "--resolver",
        metavar="MODULE:ATTR",
        help="the GroupExecutors (or a callable returning one); without it every unfinished "
        "child is reported as NoExecutor",
    )
    drain.add_argument("--once", action="store_true", help="one pass, then exit")
    drain.add_argument("--passes", type=int, default=0, help="stop after N passes")
    drain.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    drain.set_defaults(run=_drain)

    demo = commands.add_parser("demo", help="a race against a deadline and an all, traced")
    demo.add_argument("--slow", type=float, default=2.0, help="seconds the slow tool takes")
    demo.add_argument("--deadline", type=float, default=0.3, help="the race's deadline")
    demo.set_defaults(run=_demo)
    return parser


def _host_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sqlite", metavar="FILE", help="a SQLite host's database file")
    where.add_argument("--postgres", metavar="DSN", help="a PostgreSQL host's DSN")
    where.add_argument(
        "--host", metavar="MODULE:ATTR", help="a controller, or a callable returning one"
    )
    parser.add_argument("--schema", default="effecthost", help="PostgreSQL schema")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "conformance" and not (args.list or args.explain or args.factory):
        build_parser().error("conformance needs MODULE:FACTORY (or --list, or --explain ID)")
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
