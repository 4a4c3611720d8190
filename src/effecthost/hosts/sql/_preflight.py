"""Checks a SQLite file before a store that must not create or change it opens it.

A store opened with ``create=False`` (a drain of an existing database) or ``read_only=True``
(inspection) runs :func:`check_sqlite_file` first: everything here reads, and the only
lock taken is the probe of the write lock (``BEGIN IMMEDIATE`` then ``ROLLBACK``, nothing
written) when the caller means to write. A refusal is a :class:`DatabaseRefused` naming
the problem class, or :class:`SchemaVersionError`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import urllib.parse
from enum import StrEnum
from pathlib import Path

from effecthost.contract import StoreRefused

from ._store import SCHEMA_VERSION, SchemaVersionError

SQLITE_MAGIC = b"SQLite format 3\x00"
TABLES = ("eh_schema", "eh_groups", "eh_children", "eh_retired", "eh_payloads")


class DatabaseProblem(StrEnum):
    """Why a database was refused; one class per way it can be unusable."""

    MISSING = "missing"
    NOT_A_FILE = "not-a-file"
    EMPTY = "empty"
    NOT_SQLITE = "not-sqlite"
    CORRUPT = "corrupt"
    FOREIGN = "foreign"
    READ_ONLY = "read-only"
    UNREADABLE = "unreadable"
    LOCKED = "locked"
    BAD_DSN = "bad-dsn"
    UNREACHABLE = "unreachable"


class DatabaseRefused(StoreRefused):
    """A store refused to open a database it was told not to create or change, before
    writing anything.

    Attributes:
        problem: the :class:`DatabaseProblem`.
    """

    def __init__(self, problem: DatabaseProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def read_only_uri(path: Path) -> str:
    """A ``sqlite3.connect(..., uri=True)`` target opening ``path`` read-only (never
    created, never written)."""
    return f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"


def _header(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(100)
    except PermissionError:
        raise DatabaseRefused(
            DatabaseProblem.UNREADABLE, f"{path}: permission denied (cannot read the file)"
        ) from None


def _check_size(path: Path, header: bytes, size: int) -> None:
    """The header's page size and page count against the file's length: a file cut short
    (copied while being written, a full disk) is refused before SQLite reads garbage."""
    truncated = DatabaseRefused(
        DatabaseProblem.CORRUPT, f"{path}: truncated or corrupt SQLite database ({size} bytes)"
    )
    if len(header) < 100:
        raise truncated
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise truncated
    if size % page_size:
        raise truncated
    pages = int.from_bytes(header[28:32], "big")
    change_counter = header[24:28]
    version_valid_for = header[92:96]
    if change_counter == version_valid_for and pages * page_size > size:
        raise truncated


def _wal_in_use(path: Path) -> bool:
    """A non-empty ``-wal`` file: pages may live there and a checkpoint may be extending
    the main file, so its length says nothing yet."""
    try:
        return Path(f"{path}-wal").stat().st_size > 0
    except OSError:
        return False


def _classify(path: Path, exc: sqlite3.Error, lock_timeout: float) -> DatabaseRefused:
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED"):
        return DatabaseRefused(
            DatabaseProblem.LOCKED,
            f"{path}: locked by another writer (waited {lock_timeout:g} s; see --lock-timeout)",
        )
    if name.startswith("SQLITE_READONLY"):
        return DatabaseRefused(DatabaseProblem.READ_ONLY, f"{path}: read-only database")
    if name.startswith("SQLITE_NOTADB"):
        return DatabaseRefused(DatabaseProblem.NOT_SQLITE, f"{path}: not a SQLite database")
    if name.startswith("SQLITE_CANTOPEN") or name.startswith("SQLITE_PERM"):
        return DatabaseRefused(DatabaseProblem.UNREADABLE, f"{path}: cannot open the file")
    return DatabaseRefused(
        DatabaseProblem.CORRUPT, f"{path}: truncated or corrupt SQLite database ({name})"
    )


def _writable(path: Path, st: os.stat_result) -> bool:
    """Writable by us and not marked read-only: a file whose mode has no write bit is
    refused even where the process could write it anyway (root)."""
    if not st.st_mode & 0o222:
        return False
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def _file_stat(path: Path) -> os.stat_result | None:
    """The stat of ``path``, ``None`` when nothing is there; refused when it cannot be
    reached or is not a regular file."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise DatabaseRefused(
            DatabaseProblem.UNREADABLE, f"{path}: permission denied (cannot reach the file)"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a special file"
        raise DatabaseRefused(DatabaseProblem.NOT_A_FILE, f"{path}: not a file ({kind})")
    return st


def check_sqlite_file(path: str | Path, *, write: bool, lock_timeout: float) -> None:
    """Refuse ``path`` unless it is an effecthost SQLite database of this schema version
    (and, with ``write``, one whose write lock this process gets within ``lock_timeout``
    seconds). Reads only; creates nothing.

    Raises:
        DatabaseRefused: the problem class and a one-line message naming the file.
        SchemaVersionError: the database records another schema version.
    """
    path = Path(path)
    st = _file_stat(path)
    if st is None:
        raise DatabaseRefused(DatabaseProblem.MISSING, f"{path}: no such file")
    if st.st_size == 0:
        raise DatabaseRefused(
            DatabaseProblem.EMPTY, f"{path}: empty file (0 bytes), not an effecthost database"
        )
    header = _header(path)
    if not header.startswith(SQLITE_MAGIC):
        raise DatabaseRefused(DatabaseProblem.NOT_SQLITE, f"{path}: not a SQLite database")
    if not _wal_in_use(path):
        _check_size(path, header, st.st_size)
    if write and not _writable(path, st):
        raise DatabaseRefused(
            DatabaseProblem.READ_ONLY, f"{path}: read-only file (a drain writes to it)"
        )
    try:
        conn = sqlite3.connect(
            read_only_uri(path), uri=True, timeout=lock_timeout, isolation_level=None
        )
    except sqlite3.Error as exc:
        raise _classify(path, exc, lock_timeout) from None
    try:
        _check_tables(path, conn, blank_ok=False)
        if write:
            _quick_check(path, conn)
    except sqlite3.Error as exc:
        raise _classify(path, exc, lock_timeout) from None
    finally:
        conn.close()
    if write:
        _probe_write_lock(path, lock_timeout)


def _quick_check(path: Path, conn: sqlite3.Connection) -> None:
    """Refuse a corrupt database before a writer opens it: opening it for writing
    switches it to WAL (a header write), so corruption found later by a read would leave
    a refused file changed."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise DatabaseRefused(
            DatabaseProblem.CORRUPT, f"{path}: corrupt SQLite database (quick_check failed)"
        )


def _check_tables(path: Path, conn: sqlite3.Connection, *, blank_ok: bool) -> None:
    """Refuse unless the tables are this release's (or, with ``blank_ok``, there are no
    tables at all: a database nothing has been recorded in)."""
    found = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if blank_ok and not found:
        return
    if "eh_schema" not in found:
        raise DatabaseRefused(
            DatabaseProblem.FOREIGN,
            f"{path}: a SQLite database with no effecthost tables (another application's?)",
        )
    version = conn.execute("SELECT max(version) FROM eh_schema").fetchone()[0]
    if version != SCHEMA_VERSION:
        if not isinstance(version, int):
            raise DatabaseRefused(
                DatabaseProblem.FOREIGN, f"{path}: eh_schema records no schema version"
            )
        raise SchemaVersionError(version, where=str(path))
    missing = [t for t in TABLES if t not in found]
    if missing:
        raise DatabaseRefused(
            DatabaseProblem.CORRUPT, f"{path}: effecthost tables missing: {', '.join(missing)}"
        )


def check_creatable_sqlite_file(path: str | Path, *, lock_timeout: float) -> None:
    """Refuse ``path`` before a store that may create it opens it for writing (the
    library's default), unless it is new (missing, an empty file, a SQLite database with
    no tables) or an effecthost database of this schema version. Reads only: opening a
    file read-write already runs ``journal_mode=WAL`` on it, so another application's
    file or one of another version must be refused before that.

    Raises:
        DatabaseRefused: not a file, not SQLite, another application's tables, or a
            database SQLite cannot read; the message names the file.
        SchemaVersionError: the database records another schema version.
    """
    path = Path(path)
    st = _file_stat(path)
    if st is None or st.st_size == 0:
        return
    if not os.access(path, os.R_OK):
        raise DatabaseRefused(
            DatabaseProblem.UNREADABLE, f"{path}: permission denied (cannot read the file)"
        )
    try:
        # Only SQLite opens the file here: this process may hold SQLite connections to it
        # (another store), and closing any other descriptor of the file would drop their
        # POSIX locks. A plain connection that only reads (``mode=ro`` cannot rebuild a
        # WAL index whose ``-shm`` another process's last close removed); a file that is
        # not SQLite fails its first read with SQLITE_NOTADB and is left as it was.
        conn = sqlite3.connect(str(path), timeout=lock_timeout, isolation_level=None)
    except sqlite3.Error as exc:
        raise _classify(path, exc, lock_timeout) from None
    try:
        _check_tables(path, conn, blank_ok=True)
    except sqlite3.Error as exc:
        raise _classify(path, exc, lock_timeout) from None
    finally:
        conn.close()


def _probe_write_lock(path: Path, lock_timeout: float) -> None:
    """Take and release the write lock (nothing written): a drain that cannot write says
    so now, after ``lock_timeout``, not in the middle of a pass."""
    try:
        conn = sqlite3.connect(str(path), timeout=lock_timeout, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise _classify(path, exc, lock_timeout) from None


SEALED_LIKE = '%"sealed":true%'
"""A ``LIKE`` pattern that every sealed stored outcome matches (its JSON as recorded)."""


def sealed_outcomes(candidates: list[str]) -> bool:
    """Whether any of ``candidates`` (recorded ``outcome`` columns matching
    :data:`SEALED_LIKE`) is a sealed stored outcome, not a value that merely says so."""
    for text in candidates:
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("sealed") is True:
            return True
    return False
