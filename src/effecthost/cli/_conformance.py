"""``effecthost conformance``: the conformance suite against a host factory."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from effecthost._inspect import safe_text

from ._common import ExitCode, Refused, _module, _problem, _Progress, _shown, command


def _conformance(args: argparse.Namespace) -> int:
    from effecthost.conformance import (
        Check,
        CheckResult,
        all_checks,
        matches,
        run_suite,
    )
    from effecthost.conformance._reports import write_json, write_junit

    if args.explain is not None:
        from effecthost.conformance import UnknownRule, explain

        if len(args.explain) > 40:
            raise Refused(
                ExitCode.USAGE,
                f"unknown rule id {_shown(repr(args.explain), 40)}: ids are like G-20 or R-4",
            )
        try:
            print(explain(args.explain))
        except (UnknownRule, ValueError) as exc:
            raise Refused(ExitCode.USAGE, _shown(str(exc).splitlines()[0], 300)) from None
        return 0
    if args.k is not None:
        _check_selection(args.k)
    if args.list:
        for check in all_checks():
            if matches(args.k, check):
                needs = f"  (needs {', '.join(check.requires)})" if check.requires else ""
                print(f"{check.node_name}{needs}")
                for line in check.doc.splitlines():
                    print(f"    {line}".rstrip())
        return 0
    from effecthost.hosts import EngineMissing, MissingExtra

    if not 0 < args.factory_timeout < 1e9:
        raise Refused(ExitCode.USAGE, "--factory-timeout must be a positive number of seconds")
    factory = _guarded_factory(args.factory, args.factory_timeout)
    width = max(len(c.node_name) for c in all_checks())
    progress = _Progress(sys.stdout)
    failures = 0

    def show(result: CheckResult) -> None:
        nonlocal failures
        failures += result.status == "failed"
        mark = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[result.status]
        line = f"{mark}  {result.check.node_name:<{width}}  {result.seconds:6.2f}s"
        if result.reason:
            line += f"  {safe_text((result.reason.splitlines() or [''])[0])}"
        progress.line(line)

    def running(number: int, total: int, check: Check) -> None:
        failed = f", {failures} failed" if failures else ""
        progress.status(f"[{number}/{total}, {total - number} left{failed}] {check.node_name}")

    progress.status(f"starting {args.factory}")

    kept: list[str] = []

    def keep(root: Path, logs: list[Path]) -> None:
        kept.append(f"kept: {root} (the factory's work/ and the lab's lab/)")
        kept.append("logs:" if logs else "logs: none written under it")
        kept.extend(f"  {log}" for log in logs)

    report = None
    try:
        report = asyncio.run(
            run_suite(
                factory,
                select=args.k,
                on_result=show,
                on_start=running,
                name=args.factory,
                keep=args.keep,
                on_kept=keep,
            )
        )
    except FactoryProblem as exc:
        raise Refused(exc.code, str(exc)) from None
    except (EngineMissing, MissingExtra) as exc:
        raise Refused(ExitCode.ENGINE_MISSING, f"{_shown(args.factory)}: {exc}") from None
    finally:
        progress.status("")
        if report is None and kept:
            print("\n".join(kept), file=sys.stderr)
    if args.junit_xml:
        write_junit(report, args.junit_xml)
    if args.json:
        write_json(report, args.json)
    failed = report.by_status("failed")
    if failed:
        print()
        for result in failed:
            text = "\n".join(safe_text(line) for line in result.failure_text().splitlines())
            print(f"FAILED {result.check.node_name}: {text}")
    print()
    print(report.table())
    if kept:
        print()
        print("\n".join(kept))
    return 0 if report.ok else 1


def _check_selection(expression: str) -> None:
    """Refuse a ``-k`` expression the selection cannot parse, in one line."""
    import warnings

    from effecthost.conformance import all_checks, matches

    if len(expression) > 1000:
        raise Refused(ExitCode.USAGE, f"-k: expression too long ({len(expression)} characters)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # what the expression compiles to may warn
            for check in all_checks()[:1]:
                matches(expression, check)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        raise Refused(
            ExitCode.USAGE,
            f"-k: cannot parse {_shown(repr(expression), 200)} (words, and, or, not, parentheses)",
        ) from None


class FactoryProblem(Exception):
    """The conformance factory could not give a host: :class:`Refused` once caught."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _guarded_factory(spec: str, timeout: float) -> Any:
    """The factory named by ``spec``, loaded now and wrapped so that whatever it does
    wrong — raises, exits, hangs past ``timeout`` seconds, returns something that is not
    a host — is one line naming it and the problem, with exit ``factory`` or
    ``factory-timeout``. A factory that blocks its thread is stopped by a watchdog: the
    process prints that line and exits."""
    import threading

    from effecthost.conformance import HostUnderTest
    from effecthost.hosts import EngineMissing, MissingExtra

    name = _shown(spec)
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise Refused(ExitCode.USAGE, f"factory must be given as MODULE:FACTORY, got {name}")
    module = _module(module_name, f"factory {name}", ExitCode.FACTORY)
    target = getattr(module, attribute, None)
    if target is None or not callable(target):
        what = "has no such attribute" if target is None else "is not callable"
        raise Refused(ExitCode.FACTORY, f"factory {name}: {what}")

    async def call(env: Any) -> Any:
        def overdue() -> None:
            print(
                f"effecthost: factory {name}: gave no host within {timeout:g} s "
                "(see --factory-timeout); stopped",
                file=sys.stderr,
                flush=True,
            )
            os._exit(ExitCode.FACTORY_TIMEOUT)

        watchdog = threading.Timer(timeout + 5.0, overdue)  # a factory blocking its thread
        watchdog.daemon = True
        watchdog.start()
        try:
            made = target(env)
            if inspect.isawaitable(made):
                made = await asyncio.wait_for(made, timeout)
        except (EngineMissing, MissingExtra):
            raise
        except TimeoutError:
            raise FactoryProblem(
                ExitCode.FACTORY_TIMEOUT,
                f"factory {name}: gave no host within {timeout:g} s (see --factory-timeout)",
            ) from None
        except SystemExit as exc:
            raise FactoryProblem(
                ExitCode.FACTORY, f"factory {name}: called sys.exit({_shown(exc.code, 40)})"
            ) from None
        except Exception as exc:
            raise FactoryProblem(
                ExitCode.FACTORY, f"factory {name}: raised {_shown(_problem(exc))}"
            ) from None
        finally:
            watchdog.cancel()
        if not isinstance(made, HostUnderTest):
            if hasattr(made, "aclose") and inspect.iscoroutinefunction(made.aclose):
                with contextlib.suppress(Exception):
                    await made.aclose()
            raise FactoryProblem(
                ExitCode.FACTORY,
                f"factory {name}: returned {_shown(type(made).__name__, 80)}, not a HostUnderTest",
            )
        return made

    return call


def add_parser(commands: Any) -> None:
    """Add the command to ``commands`` (the ``effecthost`` subparsers)."""
    conformance = command(
        commands,
        "conformance",
        help="run the conformance suite against a host factory",
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
    conformance.add_argument(
        "--factory-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long the factory may take to give a host (default 600)",
    )
    conformance.add_argument(
        "--keep",
        action="store_true",
        help="keep the work dir and the logs of every process the factory started; "
        "print where they are at the end",
    )
    conformance.add_argument(
        "--junit-xml",
        metavar="FILE",
        help="also write a JUnit XML report (a testcase per check, classname its ids)",
    )
    conformance.add_argument(
        "--json",
        metavar="FILE",
        help="also write a JSON report (each check, the factory's capabilities)",
    )
    conformance.set_defaults(run=_conformance)
