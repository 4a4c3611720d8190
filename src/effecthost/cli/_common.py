"""What the commands share: the exit codes, refusals and how they are worded, loading
a host, a resolver or a store named on the command line, and the host options."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import os
import shutil
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO

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


def _module(module_name: str, label: str, code: ExitCode) -> Any:
    """The module ``module_name``; one that cannot be imported is refused with ``code``."""
    try:
        return importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:
        raise Refused(
            code, f"{label}: cannot import its module ({_shown(_problem(exc))})"
        ) from None


def _named(module_name: str, attribute: str, spec: str) -> Any:
    """``module_name.attribute``; a module that cannot be imported or a missing attribute
    is a one-line usage refusal."""
    module = _module(module_name, _shown(spec), ExitCode.USAGE)
    if not hasattr(module, attribute):
        raise Refused(ExitCode.USAGE, f"{_shown(spec)}: no such attribute")
    return getattr(module, attribute)


def _problem(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


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


def _sealed_refusal(where: str) -> Refused:
    return Refused(
        ExitCode.SEALED,
        f"{where}: a sealed deployment; give the drain its payload settings (--keys DIR, "
        "and --payload-dir DIR if the hosts store payloads in files)",
    )


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


def command(commands: Any, name: str, **texts: str) -> argparse.ArgumentParser:
    """A subcommand of ``commands`` (``help``, ``description``) with the exit-code table
    under its ``--help``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        **texts,
        epilog=exit_code_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser
