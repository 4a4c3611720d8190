"""Running checks against a factory's host, independent of pytest."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import re
import secrets
import shutil
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ._context import CheckContext
from ._host import FactoryEnv, HostCapabilities, HostUnderTest
from ._lab import Lab, LabEvent
from ._registry import OBLIGATIONS, Check, all_checks
from ._reports import now_iso

Factory = Callable[[FactoryEnv], "HostUnderTest | Awaitable[HostUnderTest]"]
Status = Literal["passed", "failed", "skipped"]

LAST_EVENTS = 10
"""How many of the lab events a failing check saw its failure text shows."""


@dataclass(frozen=True)
class CheckResult:
    check: Check
    status: Status
    reason: str = ""
    seconds: float = 0.0
    missing: tuple[str, ...] = ()
    """The undeclared capabilities that made a check skip."""
    events: tuple[LabEvent, ...] = ()
    """A failed check's last :data:`LAST_EVENTS` lab events (journal entries), oldest
    first, with ``at`` relative to the check's start."""
    seen: int = 0
    """How many lab events the failed check saw in all."""
    scope: str = ""
    """The prefix of the check's tags, left out when its events are shown."""

    def failure_text(self) -> str:
        """The reason, then the last lab events the check saw: what the host's children
        did (started, finished, cancelled) and which gates opened, just before it failed."""
        if not self.events:
            return self.reason
        lines = [
            self.reason,
            f"last lab events ({len(self.events)} of {self.seen} during the check):",
        ]
        width = max(len(e.kind) for e in self.events)
        for event in self.events:
            tag = event.tag.removeprefix(f"{self.scope}.") if self.scope else event.tag
            data = " ".join(f"{k}={_short(v)}" for k, v in sorted(event.data.items()))
            lines.append(f"  +{event.at:.3f}s  {event.kind:<{width}}  {tag}  {data}".rstrip())
        return "\n".join(lines)


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 12 else f"{text[:8]}…"


@dataclass
class SuiteReport:
    """Results of a run, and the obligation table that ends every run."""

    results: list[CheckResult] = field(default_factory=list)
    factory: str = ""
    """The factory's ``MODULE:FACTORY`` name."""
    capabilities: HostCapabilities | None = None
    """What the host under test declared (``None`` until it was made)."""
    timeout: float | None = None
    started_at: str = ""
    kept: Path | None = None
    """The run's directory, when it was kept."""
    logs: list[Path] = field(default_factory=list)
    """The logs in the kept directory."""

    def counts(self) -> dict[str, int]:
        return {
            "checks": len(self.results),
            **{s: len(self.by_status(s)) for s in ("passed", "failed", "skipped")},
        }

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    def by_status(self, status: Status) -> list[CheckResult]:
        return [r for r in self.results if r.status == status]

    def failed_ids(self) -> set[str]:
        return {i for r in self.by_status("failed") for i in r.check.ids}

    def missing_capabilities(self) -> set[str]:
        """Every capability whose absence skipped a check."""
        return {c for r in self.by_status("skipped") for c in r.missing}

    def table(self) -> str:
        return obligation_table(self.results)


def obligation_table(results: Iterable[CheckResult]) -> str:
    """Obligation id, checks run, passed, failed, skipped (why) — one row per id.

    A run of every registered check lists every obligation (one no check covers shows
    0); a selection (``-k``, ``-m``) lists only the obligations of the checks it ran."""
    results = list(results)
    everything = {c.name for c in all_checks()} <= {r.check.name for r in results}
    rows: dict[str, list[CheckResult]] = (
        {obligation: [] for obligation in OBLIGATIONS} if everything else {}
    )
    for result in results:
        for obligation in result.check.ids:
            rows.setdefault(obligation, []).append(result)
    lines = [
        f"{'obligation':<11}{'checks':>7}{'passed':>8}{'failed':>8}{'skipped':>9}  why skipped"
    ]
    for obligation in sorted(rows, key=_id_order):
        entries = rows[obligation]
        skipped = [r for r in entries if r.status == "skipped"]
        reasons = sorted({r.reason for r in skipped})
        lines.append(
            f"{obligation:<11}{len(entries):>7}"
            f"{sum(r.status == 'passed' for r in entries):>8}"
            f"{sum(r.status == 'failed' for r in entries):>8}"
            f"{len(skipped):>9}  {'; '.join(reasons)}".rstrip()
        )
    totals = results
    lines.append(
        f"{len(totals)} checks: {sum(r.status == 'passed' for r in totals)} passed, "
        f"{sum(r.status == 'failed' for r in totals)} failed, "
        f"{sum(r.status == 'skipped' for r in totals)} skipped"
    )
    return "\n".join(lines)


def _id_order(obligation: str) -> tuple[int, str]:
    match = re.fullmatch(r"G-(\d+)", obligation)
    return (int(match.group(1)) if match else 10_000, obligation)


def load_factory(spec: str) -> Factory:
    """``"package.module:factory"`` → the factory callable.

    Raises:
        ValueError: the spec has no ``:``, or the attribute is not callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"factory must be given as MODULE:FACTORY, got {spec!r}")
    target = getattr(importlib.import_module(module_name), attribute)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    return target  # type: ignore[no-any-return]


def missing_capabilities(check: Check, host: HostUnderTest) -> tuple[str, ...]:
    """The capabilities ``check`` needs that ``host`` does not declare."""
    return tuple(c for c in check.requires if not getattr(host.capabilities, c, False))


def skip_reason(check: Check, host: HostUnderTest) -> str | None:
    """Why ``check`` cannot run on ``host``, or ``None``."""
    missing = missing_capabilities(check, host)
    return f"host does not declare {', '.join(missing)}" if missing else None


_WORD = re.compile(r"\s*(\(|\)|[^\s()]+)")


def matches(expression: str | None, check: Check) -> bool:
    """A small ``-k``: words match substrings of the check's node name (ids included),
    combined with ``and``, ``or``, ``not`` and parentheses."""
    if not expression:
        return True
    haystack = check.node_name.lower()
    tokens = _WORD.findall(expression)
    python: list[str] = []
    for token in tokens:
        if token in ("and", "or", "not", "(", ")"):
            python.append(token)
        else:
            python.append(repr(token.lower() in haystack))
    try:
        return bool(eval(" ".join(python), {"__builtins__": {}}, {}))
    except SyntaxError:
        raise ValueError(f"cannot parse selection expression {expression!r}") from None


class SuiteRun:
    """One host and one lab for a whole run; checks get fresh scopes."""

    def __init__(
        self, factory: Factory, *, base_dir: Path | None = None, keep: bool = False
    ) -> None:
        self._factory = factory
        self._base_dir = base_dir
        self.keep = keep
        """Leave the run's directory (work dir, lab, the factory's logs) in place."""
        self._root: Path | None = None
        self._owns_root = False
        self.lab: Lab | None = None
        self.host: HostUnderTest | None = None
        self._token = secrets.token_hex(3)
        self._count = 0

    async def start(self) -> None:
        if self._base_dir is None:
            self._root = Path(tempfile.mkdtemp(prefix="ehconf-"))
            self._owns_root = True
        else:
            self._root = self._base_dir
            self._root.mkdir(parents=True, exist_ok=True)
        self.lab = Lab(self._root / "lab")
        await self.lab.start()
        work = self._root / "work"
        work.mkdir(exist_ok=True)
        made = self._factory(FactoryEnv(lab_path=self.lab.path, work_dir=work, keep=self.keep))
        self.host = await made if inspect.isawaitable(made) else made

    async def stop(self) -> None:
        try:
            if self.host is not None:
                await self.host.aclose()
        finally:
            if self.lab is not None:
                await self.lab.stop()
            if self._owns_root and self._root is not None and not self.keep:
                shutil.rmtree(self._root, ignore_errors=True)

    @property
    def root(self) -> Path | None:
        """The run's directory: ``lab/`` and the factory's ``work/``."""
        return self._root

    def logs(self) -> list[Path]:
        """Every ``*.log`` file in the factory's work dir or a directory directly under it
        (links followed), resolved. Deeper ones belong to an engine's data (a RocksDB
        write-ahead log is a ``.log`` too)."""
        if self._root is None:
            return []
        work = self._root / "work"
        found: set[Path] = set()
        for directory, dirs, files in os.walk(work, followlinks=True):
            if Path(directory) != work:
                dirs.clear()
            found.update(Path(directory, f).resolve() for f in files if f.endswith(".log"))
        return sorted(found)

    async def run(self, check: Check) -> CheckResult:
        assert self.host is not None and self.lab is not None, "start() first"
        reason = skip_reason(check, self.host)
        if reason is not None:
            return CheckResult(
                check, "skipped", reason, missing=missing_capabilities(check, self.host)
            )
        self._count += 1
        scope = f"cf{self._token}n{self._count}"
        context = CheckContext(self.host, self.lab, scope)
        started = time.perf_counter()
        began, journal = time.monotonic(), len(self.lab.journal)
        limit = self.host.timeout * 4
        zombies = len(self.lab.zombies)

        def failed(why: str) -> CheckResult:
            seen = self.lab.journal[journal:] if self.lab is not None else []
            last = tuple(LabEvent(e.kind, e.tag, e.data, e.at - began) for e in seen[-LAST_EVENTS:])
            return CheckResult(
                check, "failed", why, _since(started), events=last, seen=len(seen), scope=scope
            )

        try:
            async with asyncio.timeout(limit) as deadline:
                await check.function(context)
            if len(self.lab.zombies) > zombies:
                first = self.lab.zombies[zombies]
                return failed(
                    f"a killed process still ran children: {first.kind!r} of {first.tag!r} "
                    f"came from pid {first.data.get('pid')} after the restart that killed it"
                )
        except TimeoutError as exc:
            return failed(
                f"check did not finish in {limit}s" if deadline.expired() else _describe(exc)
            )
        except Exception as exc:
            return failed(_describe(exc))
        finally:
            await context.cleanup()
        return CheckResult(check, "passed", "", _since(started))


def _since(started: float) -> float:
    return time.perf_counter() - started


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next(
        (f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames) if "checks" in f.filename),
        "",
    )
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} ({where})" if where else text


async def run_suite(
    factory: Factory,
    *,
    select: str | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
    on_start: Callable[[int, int, Check], None] | None = None,
    name: str | None = None,
    keep: bool = False,
    on_kept: Callable[[Path, list[Path]], None] | None = None,
) -> SuiteReport:
    """Run every registered check (or those ``select`` matches) against ``factory``;
    ``on_start(number, total, check)`` is called as each check begins and
    ``on_result(result)`` as it ends. ``name`` is how reports name the factory (default: its module and name). ``keep``
    leaves the run's directory in place; ``on_kept`` is then told where it is and which
    logs it holds, after the host stopped (also when the factory failed)."""
    checks = [c for c in all_checks() if matches(select, c)]
    suite = SuiteRun(factory, keep=keep)
    report = SuiteReport(
        factory=name or f"{factory.__module__}:{getattr(factory, '__qualname__', factory)}",
        started_at=now_iso(),
    )
    try:
        await suite.start()
        assert suite.host is not None
        report.capabilities = suite.host.capabilities
        report.timeout = suite.host.timeout
        for number, check in enumerate(checks, 1):
            if on_start is not None:
                on_start(number, len(checks), check)
            result = await suite.run(check)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        await suite.stop()
        if keep and suite.root is not None:
            report.kept = suite.root
            report.logs = suite.logs()
            if on_kept is not None:
                on_kept(report.kept, report.logs)
    return report
