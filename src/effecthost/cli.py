"""The ``effecthost`` command: ``conformance``, ``inspect``, ``ui``, ``drain`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO

from effecthost._inspect import safe_text
from effecthost.contract import EffectController, GroupExecutors


class ExitCode(IntEnum):
    """The command's exit codes: one per problem class, so scripts can tell them apart."""

    OK = 0
    FAILED = 1
    USAGE = 2
    MISSING = 3
    NOT_A_FILE = 4
    EMPTY = 5
    NOT_SQLITE = 6
    CORRUPT = 7
    FOREIGN = 8
    SCHEMA_VERSION = 9
    READ_ONLY = 10
    UNREADABLE = 11
    LOCKED = 12
    BAD_DSN = 13
    UNREACHABLE = 14
    SEALED = 15
    ENGINE_MISSING = 16
    UNKNOWN_GROUP = 17
    NOT_LOOPBACK = 18
    CLOBBER = 19
    WRITE_FAILED = 20
    FACTORY = 21
    FACTORY_TIMEOUT = 22
    LEFT_RUNNING = 23


async def _load_controller(spec: str) -> EffectController:
    """``MODULE:ATTR`` naming a controller, or a callable (sync or async) returning one."""
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise SystemExit(f"effecthost: host must be given as MODULE:ATTR, got {_shown(repr(spec))}")
    target = _named(module_name, attribute, spec)
    made = target if isinstance(target, EffectController) else target()
    if inspect.isawaitable(made):
        made = await made
    if not isinstance(made, EffectController):
        raise SystemExit(f"effecthost: {_shown(spec)} did not give an EffectController")
    return made


def _named(module_name: str, attribute: str, spec: str) -> Any:
    """``module_name.attribute``; a module that cannot be imported or a missing attribute
    is a one-line usage refusal."""
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise Refused(
            ExitCode.USAGE, f"{_shown(spec)}: cannot import its module ({_shown(_problem(exc))})"
        ) from None
    if not hasattr(module, attribute):
        raise Refused(ExitCode.USAGE, f"{_shown(spec)}: no such attribute")
    return getattr(module, attribute)


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


def _problem(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


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
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise Refused(
            ExitCode.FACTORY, f"factory {name}: cannot import its module ({_shown(_problem(exc))})"
        ) from None
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


class _Progress:
    """On a terminal, a status line (the running check, how many are left) that the next
    result line overwrites; elsewhere only the result lines, so the output stays one line
    per check and free of control characters."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._shown = False

    def status(self, text: str) -> None:
        if not self._tty:
            return
        columns = shutil.get_terminal_size().columns
        self._stream.write(f"\r\x1b[K{text[: max(columns - 1, 1)]}")
        self._stream.flush()
        self._shown = bool(text)

    def line(self, text: str) -> None:
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._shown = False
        self._stream.write(text + "\n")
        self._stream.flush()


class Refused(Exception):
    """A one-line refusal: printed as ``effecthost: MESSAGE``, exit code ``code``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def _refusals(where: str) -> Iterator[None]:
    """Turn what a database can be wrong with into :class:`Refused` (one line, its own
    exit code). ``where`` names the database in messages (never a DSN: it may carry a
    password)."""
    import sqlite3

    from effecthost.hosts import MissingExtra
    from effecthost.hosts.sql import DatabaseRefused, SchemaVersionError, SealedDeployment

    try:
        yield
    except SealedDeployment as exc:
        raise _sealed_refusal(exc.where) from None
    except DatabaseRefused as exc:
        raise Refused(ExitCode[exc.problem.name.replace("-", "_")], exc.message) from None
    except SchemaVersionError as exc:
        message = exc.message if exc.where is not None else f"{where}: {exc.message}"
        raise Refused(ExitCode.SCHEMA_VERSION, message) from None
    except MissingExtra as exc:
        raise Refused(ExitCode.ENGINE_MISSING, str(exc)) from None
    except sqlite3.Error as exc:
        name = getattr(exc, "sqlite_errorname", "")
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            code, what = ExitCode.LOCKED, "locked by another writer (see --lock-timeout)"
        elif name.startswith("SQLITE_READONLY"):
            code, what = ExitCode.READ_ONLY, "read-only database"
        else:
            code, what = ExitCode.CORRUPT, f"corrupt SQLite database ({name or exc})"
        raise Refused(code, f"{where}: {what}") from None
    except (ValueError, TimeoutError, OSError) as exc:
        if not where.startswith("PostgreSQL"):
            raise
        if isinstance(exc, ValueError):
            raise Refused(ExitCode.BAD_DSN, f"{where}: malformed DSN ({exc})") from None
        why = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        raise Refused(ExitCode.UNREACHABLE, f"{where}: cannot connect ({why})") from None
    except Exception as exc:
        if not where.startswith("PostgreSQL") or not _is_asyncpg_error(exc):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise Refused(ExitCode.UNREACHABLE, f"{where}: cannot connect ({first})") from None


def _is_asyncpg_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("asyncpg")


async def _start(store: Any, args: argparse.Namespace) -> None:
    """Start ``store``, bounded by ``--connect-timeout`` on PostgreSQL."""
    if args.postgres:
        await asyncio.wait_for(store.start(), args.connect_timeout)
    else:
        await store.start()


def _where(args: argparse.Namespace) -> str:
    return str(args.sqlite) if args.sqlite else f"PostgreSQL schema {args.schema!r}"


def _store(args: argparse.Namespace, *, read_only: bool) -> Any:
    """A store over an existing database, never created: read-only for inspection."""
    from effecthost.hosts.sql import PostgresStore, SqliteStore

    if args.sqlite:
        return SqliteStore(
            args.sqlite, busy_timeout=args.lock_timeout, create=False, read_only=read_only
        )
    return PostgresStore(
        args.postgres, schema=args.schema, pool_size=2, create=False, read_only=read_only
    )


async def _load_host(args: argparse.Namespace) -> EffectController:
    """The controller named by ``--host MODULE:ATTR`` (or ``EFFECTHOST_HOST``)."""
    spec = args.host or os.environ.get("EFFECTHOST_HOST")
    if not spec:
        raise Refused(
            ExitCode.USAGE,
            "name a host with --sqlite FILE, --postgres DSN, "
            + ("--restate ADMIN_URL, --temporal ADDRESS " if "restate" in args else "")
            + "or --host MODULE:ATTR "
            "(or set EFFECTHOST_HOST)",
        )
    return await _load_controller(spec)


async def _close(controller: EffectController) -> None:
    aclose = getattr(controller, "aclose", None)
    if aclose is not None:
        await aclose()


class _SqlInspector:
    """The inspection reads of a SQL store (``inspect_groups``, ``inspect_group``), with
    what a database can be wrong with turned into refusals."""

    def __init__(self, store: Any, where: str, start: Any = None) -> None:
        self._store = store
        self._where = where
        self._start = start

    async def _started(self) -> Any:
        if self._start is not None:
            start, self._start = self._start, None
            with _refusals(self._where):
                await start
        return self._store

    async def groups(self) -> list[Any]:
        store = await self._started()
        with _refusals(self._where):
            now = await store.now()
            groups: list[Any] = await store.inspect_groups()
        return [_opened(g, now) for g in groups]

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        from effecthost._inspect import UnknownGroupKey, in_rank_order

        store = await self._started()
        with _refusals(self._where):
            now = await store.now()
            found = await store.inspect_group(group_key)
        if found is None:
            raise UnknownGroupKey(group_key)
        return _opened(found[0], now), in_rank_order(found[1])

    async def aclose(self) -> None:
        await self._store.aclose()


def _opened(group: Any, now: float) -> Any:
    """The group with ``opened_at``: the read gives its age on the database clock, and
    ``now`` is that clock read just before, so the open is never placed after a
    settlement recorded on the same clock."""
    import dataclasses

    if group.age_seconds is None:
        return group
    return dataclasses.replace(group, opened_at=now - group.age_seconds)


class _KeysOnly:
    """A host that lists only its open group keys (no ranks to show)."""

    def __init__(self, controller: EffectController) -> None:
        self._controller = controller

    async def groups(self) -> list[Any]:
        from effecthost._inspect import GroupRow

        keys = await self._controller.open_group_keys()
        return [GroupRow(key, None, None, None, None, None, None) for key in keys]

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        raise Refused(
            ExitCode.USAGE, f"{type(self._controller).__name__} lists open group keys only"
        )

    async def aclose(self) -> None:
        await _close(self._controller)


class _Rows:
    """A host's own inspection (the documented interface, ``docs/writing-a-host.md``):
    ``inspect_groups()`` gives a mapping per open group, ``inspect_group(key)`` one for
    the group and one per child (or ``None``); the mappings' keys are the fields of
    :class:`~effecthost._inspect.GroupRow` and :class:`~effecthost._inspect.ChildRow`,
    any left out shown as ``-``."""

    def __init__(self, controller: EffectController) -> None:
        self._controller = controller

    async def groups(self) -> list[Any]:
        from effecthost._inspect import GroupRow

        found = await self._controller.inspect_groups()  # type: ignore[attr-defined]
        return [_row(GroupRow, g) for g in found]

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        from effecthost._inspect import ChildRow, GroupRow, UnknownGroupKey, in_rank_order

        found = await self._controller.inspect_group(group_key)  # type: ignore[attr-defined]
        if found is None:
            raise UnknownGroupKey(group_key)
        group, children = found
        return _row(GroupRow, group), in_rank_order([_row(ChildRow, c) for c in children])

    async def aclose(self) -> None:
        await _close(self._controller)


def _row(cls: Any, given: Any) -> Any:
    """``cls`` from a mapping (or an object) of its fields; a missing field is ``None``."""
    import dataclasses

    if isinstance(given, cls):
        return given
    names = [f.name for f in dataclasses.fields(cls)]
    if isinstance(given, dict):
        return cls(**{name: given.get(name) for name in names})
    return cls(**{name: getattr(given, name, None) for name in names})


class _KitRows:
    """A kit host (``KitController``) without its own inspection: the columns the kit's
    hooks give (wake, disposition in force, settled of total; per child its rank,
    position, replay key and status), over its open group keys."""

    def __init__(self, controller: Any) -> None:
        self._controller = controller

    async def _row(self, key: str) -> Any:
        from effecthost._inspect import GroupRow, UnknownGroupKey
        from effecthost.contract.kit import GroupRecord

        record = await self._controller.find_group(key)
        if not isinstance(record, GroupRecord) or record.closed:
            raise UnknownGroupKey(key)
        settled = len(await self._controller.settled_positions(key))
        wake, disposition = record.wake.value, record.in_force.value
        return GroupRow(key, None, wake, disposition, settled, record.child_count, None)

    async def groups(self) -> list[Any]:
        from effecthost._inspect import UnknownGroupKey

        rows = []
        for key in await self._controller.open_group_keys():
            with contextlib.suppress(UnknownGroupKey):  # closed since it was listed
                rows.append(await self._row(key))
        return rows

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        from effecthost._inspect import RUNNING, ChildRow

        row = await self._row(group_key)
        recorded = await self._controller.recorded_children(group_key)
        replay_keys = {child.position: child.replay_key for child in recorded}
        children, seen = [], set()
        for rank in range(1, row.total + 1):
            found = await self._controller.read_rank(group_key, rank)
            if found is None:
                break
            seen.add(found.position)
            status = found.outcome.status
            children.append(
                ChildRow(rank, found.position, found.replay_key, None, status, None, None)
            )
        for position in range(row.total):
            if position not in seen:
                replay_key = replay_keys.get(position)
                children.append(ChildRow(None, position, replay_key, None, RUNNING, None, None))
        return row, children

    async def aclose(self) -> None:
        await _close(self._controller)


class _HostInspector:
    """The inspector of a controller named by ``--host``; closing it closes the host."""

    def __init__(self, inner: Any, controller: EffectController) -> None:
        self._inner = inner
        self._controller = controller

    async def groups(self) -> list[Any]:
        groups: list[Any] = await self._inner.groups()
        return groups

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        found: tuple[Any, list[Any]] = await self._inner.group(group_key)
        return found

    async def aclose(self) -> None:
        await _close(self._controller)


def _inspector_of(controller: EffectController) -> Any:
    """How to read ``controller``'s records: its SQL store, its Restate admin API, its
    Temporal client, or only its open group keys."""
    store = getattr(controller, "store", None)
    if store is not None and hasattr(store, "inspect_groups"):
        return _HostInspector(_SqlInspector(store, type(controller).__name__), controller)
    module = type(controller).__module__
    admin = getattr(controller, "admin_urls", None) or getattr(controller, "_admin", None)
    if module.startswith("effecthost.hosts.restate") and isinstance(admin, str | tuple):
        from effecthost.hosts.restate._inspect import RestateInspector

        return _HostInspector(RestateInspector(admin), controller)
    client = getattr(controller, "_client", None)
    if module.startswith("effecthost.hosts.temporal") and client is not None:
        from effecthost.hosts.temporal._inspect import TemporalInspector

        return _HostInspector(TemporalInspector(client), controller)
    if callable(getattr(controller, "inspect_groups", None)):
        return _Rows(controller)
    from effecthost.contract.kit import KitController

    if isinstance(controller, KitController):
        return _KitRows(controller)
    return _KeysOnly(controller)


async def _inspector(args: argparse.Namespace) -> Any:
    if args.sqlite or args.postgres:
        store = _store(args, read_only=True)
        start = (
            asyncio.wait_for(store.start(), args.connect_timeout)
            if args.postgres
            else store.start()
        )
        return _SqlInspector(store, _where(args), start)
    if args.restate:
        from effecthost.hosts.restate._inspect import RestateInspector

        return RestateInspector(args.restate, timeout=args.connect_timeout)
    if args.temporal:
        from effecthost.hosts.temporal._inspect import TemporalInspector

        return await TemporalInspector.connect(
            args.temporal, args.namespace, timeout=args.connect_timeout
        )
    return _inspector_of(await _load_host(args))


def _inspect(args: argparse.Namespace) -> int:
    from effecthost import _inspect as shown
    from effecthost.hosts import MissingExtra

    if args.html is not None and args.group is None:
        raise Refused(ExitCode.USAGE, "--html draws one group: give --group KEY")
    if args.html is not None:
        _writable_page(args.html, args.force)  # before anything is read

    async def main() -> int:
        inspector = await _inspector(args)
        try:
            if args.group is None:
                groups = await inspector.groups()
                print(shown.groups_json(groups) if args.json else shown.groups_table(groups))
                print(f"{len(groups)} open group(s)", file=sys.stderr)
            else:
                group, children = await inspector.group(args.group)
                if args.html is not None:
                    from effecthost._timeline import render_timeline

                    page = render_timeline(group, children)
                    await asyncio.to_thread(_write_page, args.html, page, args.force)
                    print(f"wrote {_shown(args.html, 400)}", file=sys.stderr)
                elif args.json:
                    print(shown.group_json(group, children))
                else:
                    print(shown.groups_table([group]))
                    print()
                    print(shown.ranks_table(children))
        finally:
            await inspector.aclose()
        return ExitCode.OK

    try:
        with _no_side_files(args):
            return asyncio.run(main())
    except shown.UnknownGroupKey as exc:
        raise Refused(
            ExitCode.UNKNOWN_GROUP, f"no open group {_shown(repr(exc.group_key))}"
        ) from None
    except shown.TierUnreachable as exc:
        raise Refused(ExitCode.UNREACHABLE, str(exc)) from None
    except MissingExtra as exc:
        raise Refused(ExitCode.ENGINE_MISSING, str(exc)) from None


def _writable_page(name: str, force: bool) -> Path:
    """The path ``--html`` may write: refused (one line, its own exit code) when it is
    empty, a directory or a special file, or a file that is not a page ``--html`` wrote
    (unless ``force``), or its directory is missing."""
    from effecthost._timeline import PAGE_PREFIX

    if not name:
        raise Refused(ExitCode.USAGE, "--html needs a file name")
    path = Path(name)
    shown = _shown(name)
    try:
        st = path.lstat()
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise Refused(ExitCode.WRITE_FAILED, f"{shown}: no such directory") from None
        return path
    except OSError as exc:
        raise Refused(ExitCode.WRITE_FAILED, f"{shown}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise Refused(ExitCode.NOT_A_FILE, f"{shown}: not a file (a directory)")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise Refused(ExitCode.NOT_A_FILE, f"{shown}: not a file (a special file)")
    if force:
        return path
    try:
        with open(path, "rb") as f:
            ours = stat.S_ISREG(st.st_mode) and f.read(len(PAGE_PREFIX.encode())) == (
                PAGE_PREFIX.encode()
            )
    except OSError:
        ours = False
    if not ours:
        raise Refused(
            ExitCode.CLOBBER,
            f"{shown}: exists and is not a page inspect --html wrote (--force replaces it)",
        )
    return path


def _write_page(name: str, page: str, force: bool) -> None:
    """Write ``page`` to ``name`` atomically (a temporary file beside it, renamed over
    it): a failed write leaves the old file, or none, never half a page."""
    import tempfile

    path = _writable_page(name, force)
    shown = _shown(name)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(page.encode())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise Refused(
            ExitCode.WRITE_FAILED, f"{shown}: cannot write the page ({exc.strerror or exc})"
        ) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _no_side_files(args: argparse.Namespace) -> Iterator[None]:
    """Leave no ``-wal``/``-shm`` file beside a SQLite database that had none: a
    read-only connection to a WAL database creates them and cannot remove them, so
    afterwards a plain connection is opened and closed, which removes them when it is
    the last one (another process still using the database keeps them, as it should)."""
    if not getattr(args, "sqlite", None):
        yield
        return
    path = Path(args.sqlite)
    sides = [Path(f"{path}-wal"), Path(f"{path}-shm")]
    had = any(side.exists() for side in sides)
    try:
        yield
    finally:
        if not had and any(side.exists() for side in sides):
            _release_side_files(path)


def _release_side_files(path: Path) -> None:
    import sqlite3
    import urllib.parse

    with contextlib.suppress(sqlite3.Error, OSError):
        conn = sqlite3.connect(
            f"file:{urllib.parse.quote(str(path.absolute()))}?mode=rw",
            uri=True,
            timeout=0,
            isolation_level=None,
        )
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()


def _ui(args: argparse.Namespace) -> int:
    """Serve every open group's timeline on a loopback address until interrupted."""
    from effecthost import _timeline

    try:
        _timeline.loopback_address(args.bind)
    except _timeline.NotLoopback as exc:
        raise Refused(ExitCode.NOT_LOOPBACK, str(exc)) from None
    with _no_side_files(args):
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from effecthost import _inspect as shown
    from effecthost import _timeline
    from effecthost.hosts import MissingExtra

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="effecthost-ui", daemon=True)
    thread.start()
    inspector: Any = None
    try:
        try:
            inspector = asyncio.run_coroutine_threadsafe(_inspector(args), loop).result()
            # read once before serving, so a tier that cannot be read is refused up front
            _timeline.run_in(loop, inspector)(lambda i: i.groups())
        except shown.TierUnreachable as exc:
            raise Refused(ExitCode.UNREACHABLE, str(exc)) from None
        except MissingExtra as exc:
            raise Refused(ExitCode.ENGINE_MISSING, str(exc)) from None
        try:
            server = _timeline.make_server(
                _timeline.run_in(loop, inspector), args.bind, args.port, refresh=args.refresh
            )
        except OSError as exc:
            raise Refused(
                ExitCode.USAGE, f"cannot listen on {args.bind}:{args.port} ({exc.strerror})"
            ) from None
        host, port = str(server.server_address[0]), int(server.server_address[1])
        shown_host = f"[{host}]" if ":" in host else host
        print(f"effecthost ui: serving http://{shown_host}:{port}/", flush=True)

        def stop(*_: Any) -> None:
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    finally:
        # bounded: a stop is due within a second, whatever a client or a read is doing
        if inspector is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(inspector.aclose(), loop).result(0.3)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(0.2)
        if not thread.is_alive():
            loop.close()
    return ExitCode.OK


def _payload_policy(args: argparse.Namespace) -> Any:
    """The payload settings a drain records outcomes with (``--keys``, ``--payload-dir``,
    ``--inline-threshold``), or ``None`` for inline plaintext."""
    if args.keys is None and args.payload_dir is None:
        return None
    from effecthost.payloads import (
        DEFAULT_INLINE_THRESHOLD,
        AesGcmSealer,
        FileKeyStore,
        FilesystemPayloadStore,
        PayloadPolicy,
    )

    for option, folder in (("--keys", args.keys), ("--payload-dir", args.payload_dir)):
        if folder is not None and not os.path.isdir(folder):
            # a typo must not start a fresh key or payload directory
            raise Refused(ExitCode.USAGE, f"{option} {folder}: no such directory")
    return PayloadPolicy(
        store=FilesystemPayloadStore(args.payload_dir) if args.payload_dir else None,
        inline_threshold=(
            DEFAULT_INLINE_THRESHOLD if args.inline_threshold is None else args.inline_threshold
        ),
        sealer=AesGcmSealer(FileKeyStore(args.keys)) if args.keys else None,
    )


async def _sql_drain_host(args: argparse.Namespace, resolver: GroupExecutors | None) -> Any:
    from effecthost.hosts.sql import SqlEffectHost

    policy = _payload_policy(args)
    with _refusals(_where(args)):
        if policy is None or policy.sealer is None:
            # read-only: a refused drain leaves the file as it was (opening it for writing
            # would switch a rollback-journal database to WAL)
            reader = _store(args, read_only=True)
            try:
                await _start(reader, args)
                if await reader.deployment_sealed():
                    raise _sealed_refusal(_where(args))
            finally:
                await reader.aclose()
        store = _store(args, read_only=False)
        try:
            await _start(store, args)
        finally:
            await store.aclose()
        # a fresh store: the one above only checked the database
        host = SqlEffectHost(_store(args, read_only=False), resolver, payloads=policy)
        await host.start()
    return host


def _sealed_refusal(where: str) -> Refused:
    return Refused(
        ExitCode.SEALED,
        f"{where}: a sealed deployment; give the drain its payload settings (--keys DIR, "
        "and --payload-dir DIR if the hosts store payloads in files)",
    )


class _DrainLog:
    """What a drain shows: the same lines on a terminal and in a pipe (one per pass, one
    per child it touched, a ``done`` summary; JSON objects with ``--json``), plus, on a
    terminal only, a status line of what runs and what is left."""

    def __init__(self, as_json: bool) -> None:
        self._json = as_json
        self._progress = _Progress(sys.stdout)
        self.passes = 0
        self.totals = {"resumed": 0, "cancelled": 0, "no_executor": 0}

    def so_far(self) -> str:
        t = self.totals
        return f"resumed {t['resumed']}, cancelled {t['cancelled']}, no executor {t['no_executor']}"

    def status(self, text: str) -> None:
        self._progress.status(text)

    def _emit(self, text: str, doc: dict[str, Any]) -> None:
        self._progress.line(json.dumps(doc) if self._json else text)

    def report(self, report: Any, left: tuple[int | None, int] | None) -> None:
        self.passes += 1
        touched = {
            "resumed": [tuple(child) for child in report.resumed],
            "cancelled": [tuple(child) for child in report.cancelled],
            "no_executor": [(m.group_key, m.replay_key) for m in report.no_executor],
        }
        counts = {kind: len(children) for kind, children in touched.items()}
        for kind, count in counts.items():
            self.totals[kind] += count
        self._emit(
            f"pass {self.passes}: resumed {counts['resumed']}, cancelled "
            f"{counts['cancelled']}, no executor {counts['no_executor']}; {_left(left)}",
            {"event": "pass", "pass": self.passes, **counts, **_left_doc(left)},
        )
        for kind, children in touched.items():
            for group_key, replay_key in children:
                self._emit(
                    f"  {kind.replace('_', ' ')}: {safe_text(group_key)} {safe_text(replay_key)}",
                    {
                        "event": kind,
                        "pass": self.passes,
                        "group_key": group_key,
                        "replay_key": replay_key,
                    },
                )

    def done(self, left: tuple[int | None, int] | None) -> None:
        self._emit(
            f"done: {self.passes} pass(es), {self.so_far()}; {_left(left)}",
            {"event": "done", "passes": self.passes, **self.totals, **_left_doc(left)},
        )


def _left(left: tuple[int | None, int] | None) -> str:
    if left is None:
        return "left: unknown (the host lists no open groups)"
    if left[0] is None:
        return f"left: {left[1]} open group(s)"
    return f"left: {left[0]} unsettled in {left[1]} open group(s)"


def _left_doc(left: tuple[int | None, int] | None) -> dict[str, int | None]:
    return {"unsettled": left[0] if left else None, "open_groups": left[1] if left else None}


async def _what_is_left(controller: EffectController) -> tuple[int | None, int] | None:
    """Unsettled children of open groups and how many groups are open: from the SQL
    hosts' ``open_groups()``, else from ``open_group_keys()`` (G-30), counting the
    unsettled children when the host is a kit host; ``None`` when the host lists
    nothing."""
    listing = getattr(controller, "open_groups", None)
    if listing is not None:
        groups = await listing()
        return sum(g.child_count - g.settled for g in groups), len(groups)
    try:
        keys = await controller.open_group_keys()
    except NotImplementedError:
        return None
    from effecthost.contract.kit import GroupRecord, KitController

    if not isinstance(controller, KitController):
        return None, len(keys)
    unsettled = 0
    for key in keys:
        record = await controller.find_group(key)
        if isinstance(record, GroupRecord):
            unsettled += record.child_count - len(await controller.settled_positions(key))
    return unsettled, len(keys)


async def _finish(
    controller: EffectController,
    log: _DrainLog,
    timeout: float,
    left: tuple[int | None, int] | None,
) -> int:
    """Keep the host open until the children this run resumed settled: the host's
    ``idle()`` (documented in ``docs/writing-a-host.md``) returns once the children its
    process runs settled. Without ``idle()``, or past ``timeout``, say how many it
    leaves running: they stop with this process."""
    resumed = log.totals["resumed"]
    idle = getattr(controller, "idle", None)
    if idle is None and not resumed:
        return ExitCode.OK
    if idle is not None:
        log.status(f"finishing {resumed} resumed child(ren); {_left(left)}")
        try:
            await asyncio.wait_for(idle(), timeout)
            return ExitCode.OK
        except TimeoutError:
            pass
    running = getattr(controller, "running", None)
    still = len(running) if isinstance(running, dict) else resumed
    why = "the host has no idle()" if idle is None else f"after {timeout:g}s"
    print(
        f"effecthost: drain leaves {still} resumed child(ren) running ({why}); "
        "they stop with this process and a later drain resumes them",
        file=sys.stderr,
    )
    return ExitCode.LEFT_RUNNING


def _drain(args: argparse.Namespace) -> int:
    async def main() -> int:
        resolver = _load_resolver(args.resolver) if args.resolver else None
        if args.sqlite or args.postgres:
            controller = await _sql_drain_host(args, resolver)
        else:
            controller = await _load_host(args)
            if resolver is not None:
                register = getattr(controller, "register_executors", None)
                if register is None:
                    raise Refused(ExitCode.USAGE, "the host takes no --resolver")
                register(resolver)
        drain = controller.drain()
        log = _DrainLog(args.json)
        try:
            with _refusals(_where(args) if args.sqlite or args.postgres else "host"):
                while True:
                    log.status(f"pass {log.passes + 1}: draining (so far: {log.so_far()})")
                    report = await drain.run_pass()
                    left = await _what_is_left(controller)
                    log.report(report, left)
                    if args.once or (args.passes and log.passes >= args.passes):
                        code = await _finish(controller, log, args.finish_timeout, left)
                        log.done(await _what_is_left(controller))
                        return code
                    log.status(
                        f"pass {log.passes} done, next in {args.interval:g}s "
                        f"(so far: {log.so_far()}; {_left(left)})"
                    )
                    await asyncio.sleep(args.interval)  # the drain's cadence, not an ordering
        finally:
            await _close(controller)

    try:
        with _no_side_files(args):
            return asyncio.run(main())
    except KeyboardInterrupt:
        return 130


def _load_resolver(spec: str) -> GroupExecutors:
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise SystemExit(
            f"effecthost: resolver must be given as MODULE:ATTR, got {_shown(repr(spec))}"
        )
    target = _named(module_name, attribute, spec)
    made = target if isinstance(target, GroupExecutors) else target()
    if not isinstance(made, GroupExecutors):
        raise SystemExit(f"effecthost: {_shown(spec)} did not give a GroupExecutors resolver")
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
        "conformance",
        help="run the conformance suite against a host factory",
        epilog=exit_code_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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

    inspect_ = commands.add_parser(
        "inspect",
        help="list the open groups of a host, or one group's ranks",
        description="List the open groups of a host (key, age, wake, disposition, "
        "settled/total, owner), or with --group KEY that group's children in rank order. "
        "Nothing is written and no write lock is taken: a SQLite file is opened read-only, "
        "a PostgreSQL schema is read in read-only transactions, Restate is read through "
        "its admin SQL API and Temporal through visibility, queries and history reads.",
        epilog=exit_code_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _host_options(inspect_, engines=True)
    inspect_.add_argument("--group", metavar="KEY", help="show this group's rank table")
    inspect_.add_argument("--json", action="store_true", help="print JSON")
    inspect_.add_argument(
        "--html",
        metavar="FILE",
        help="with --group: write the group's timeline as a self-contained HTML page "
        "(atomically; an existing file is replaced only if it is such a page)",
    )
    inspect_.add_argument(
        "--force",
        action="store_true",
        help="with --html: replace an existing file that is not a page --html wrote",
    )
    inspect_.set_defaults(run=_inspect)

    ui = commands.add_parser(
        "ui",
        help="serve every open group's timeline on a loopback address",
        description="A small local viewer: an index of the open groups of a host, each "
        "linking to the page `inspect --group KEY --html` writes. It reads like inspect "
        "(never writes) and listens on a loopback address only; stop it with Ctrl-C or "
        "SIGTERM.",
        epilog=exit_code_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _host_options(ui, engines=True)
    ui.add_argument(
        "--bind", default="127.0.0.1", help="a loopback address or name (default 127.0.0.1)"
    )
    ui.add_argument(
        "--port",
        type=_bounded_int("port", 0, 65535),
        default=8765,
        help="port (default 8765; 0 picks one)",
    )
    ui.add_argument(
        "--refresh",
        type=_bounded_int("refresh", 0, 86400),
        default=5,
        metavar="SECONDS",
        help="page reload interval (0: none)",
    )
    ui.set_defaults(run=_ui)

    drain = commands.add_parser(
        "drain",
        help="finish children whose caller or process is gone (SQL tiers)",
        description="Finish children whose caller or process is gone. The database must "
        "exist and be an effecthost database of this schema version; it is checked before "
        "anything is written. A database holding sealed outcomes is drained only with its "
        "payload settings (--keys).",
        epilog=exit_code_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _host_options(drain)
    drain.add_argument(
        "--keys",
        metavar="DIR",
        help="the FileKeyStore directory the hosts seal outcomes with (AES-256-GCM)",
    )
    drain.add_argument(
        "--payload-dir",
        metavar="DIR",
        help="a FilesystemPayloadStore directory for outcomes stored by reference "
        "(default: the database's own payload table)",
    )
    drain.add_argument(
        "--inline-threshold",
        type=int,
        metavar="BYTES",
        help="largest outcome recorded inline with --keys/--payload-dir (default 4096)",
    )
    drain.add_argument(
        "--resolver",
        metavar="MODULE:ATTR",
        help="the GroupExecutors (or a callable returning one); without it every unfinished "
        "child is reported as NoExecutor",
    )
    drain.add_argument("--once", action="store_true", help="one pass, then exit")
    drain.add_argument("--passes", type=int, default=0, help="stop after N passes")
    drain.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    drain.add_argument(
        "--finish-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="after the last pass, how long the children it resumed may take to settle "
        "before the drain exits leaving them running (default 300)",
    )
    drain.add_argument(
        "--json", action="store_true", help="print JSON lines (pass, per child, done)"
    )
    drain.set_defaults(run=_drain)

    demo = commands.add_parser("demo", help="a race against a deadline and an all, traced")
    demo.add_argument("--slow", type=float, default=2.0, help="seconds the slow tool takes")
    demo.add_argument("--deadline", type=float, default=0.3, help="the race's deadline")
    demo.set_defaults(run=_demo)
    return parser


EXIT_CODES = {
    ExitCode.OK: "done",
    ExitCode.FAILED: "a conformance check failed",
    ExitCode.USAGE: "bad arguments (a missing host, a missing --keys directory…)",
    ExitCode.MISSING: "no such file (nothing is created)",
    ExitCode.NOT_A_FILE: "the path is a directory or a special file",
    ExitCode.EMPTY: "an empty file (0 bytes)",
    ExitCode.NOT_SQLITE: "not a SQLite database",
    ExitCode.CORRUPT: "a truncated or corrupt SQLite database",
    ExitCode.FOREIGN: "a database (or PostgreSQL schema) without effecthost tables",
    ExitCode.SCHEMA_VERSION: "effecthost tables of another schema version",
    ExitCode.READ_ONLY: "drain: the database or its directory is read-only",
    ExitCode.UNREADABLE: "the file cannot be read (permissions)",
    ExitCode.LOCKED: "locked by another writer for longer than --lock-timeout",
    ExitCode.BAD_DSN: "a malformed PostgreSQL DSN",
    ExitCode.UNREACHABLE: "PostgreSQL, Restate or Temporal unreachable or refusing",
    ExitCode.SEALED: "drain: a sealed deployment, but no --keys given",
    ExitCode.ENGINE_MISSING: "an engine binary or an extra is not installed",
    ExitCode.UNKNOWN_GROUP: "inspect --group: no open group of that key",
    ExitCode.NOT_LOOPBACK: "ui --bind: not a loopback address",
    ExitCode.CLOBBER: "inspect --html: the file is not a page --html wrote (see --force)",
    ExitCode.WRITE_FAILED: "inspect --html: the page cannot be written (directory, disk…)",
    ExitCode.FACTORY: "conformance: the factory cannot be loaded, fails or gives no host",
    ExitCode.FACTORY_TIMEOUT: "conformance: the factory gave no host within --factory-timeout",
    ExitCode.LEFT_RUNNING: "drain --host: resumed children still ran after --finish-timeout",
}


def exit_code_help() -> str:
    """The exit-code table printed under ``--help``."""
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES.items():
        lines.append(f"  {code.value:>2}  {code.name.lower().replace('_', '-'):<15} {meaning}")
    return "\n".join(lines)


def _bounded_int(what: str, low: int, high: int) -> Any:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 20 else None
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{what} must be an integer from {low} to {high}, not {_shown(repr(text), 40)}"
            )
        return value

    return parse


def _shown(value: Any, limit: int = 200) -> str:
    """An input echoed in a message: control characters escaped, at most ``limit``
    characters of it."""
    from effecthost._inspect import shorten

    return shorten(value, limit)


def _host_options(parser: argparse.ArgumentParser, *, engines: bool = False) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sqlite", metavar="FILE", help="a SQLite host's database file")
    where.add_argument("--postgres", metavar="DSN", help="a PostgreSQL host's DSN")
    if engines:
        where.add_argument(
            "--restate",
            metavar="ADMIN_URL",
            action="append",
            help="a Restate server's admin URL (read only; repeat it for a cluster's nodes)",
        )
        where.add_argument(
            "--temporal", metavar="ADDRESS", help="a Temporal frontend (host:port; read only)"
        )
        parser.add_argument("--namespace", default="default", help="Temporal namespace")
    where.add_argument(
        "--host", metavar="MODULE:ATTR", help="a controller, or a callable returning one"
    )
    parser.add_argument("--schema", default="effecthost", help="PostgreSQL schema")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for a SQLite lock held by another process (default 5)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for PostgreSQL to answer (default 10)",
    )


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


if __name__ == "__main__":
    raise SystemExit(main())
