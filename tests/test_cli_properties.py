"""Property tests of ``effecthost inspect`` and ``drain --once`` on generated files
(SPEC §7): random bytes, SQLite databases of random tables, an ``eh_schema`` of random
versions, a real effecthost database truncated or with bits flipped. Unless the file is an
effecthost database of this schema version, the command exits non-zero with exactly one
line on stderr (no traceback); ``inspect`` leaves the file byte-identical always, ``drain``
whenever it refuses, and neither leaves a file beside it."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_cli_hostile import effecthost_db

from effecthost.cli import main
from effecthost.hosts.sql import SCHEMA_VERSION

FILES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
COMMANDS = {
    "inspect": ["--lock-timeout", "0.2"],
    "drain": ["--once", "--lock-timeout", "0.2"],
}


@functools.cache
def real_database() -> bytes:
    """The bytes of a real effecthost database (rollback journal: all in one file)."""
    with tempfile.TemporaryDirectory() as tmp:
        return effecthost_db(Path(tmp) / "real.sqlite3", groups=3, journal="DELETE").read_bytes()


# -- generated files --------------------------------------------------------------------

MAGIC = b"SQLite format 3\x00"
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
cell = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
)


def write_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


raw_files = st.one_of(
    st.binary(max_size=2048),
    st.binary(max_size=4096).map(lambda tail: MAGIC + tail),
).map(write_bytes)


@st.composite
def random_tables(draw: st.DrawFn) -> Callable[[Path], None]:
    """A SQLite database of random tables, eh_ names among them."""
    names = draw(
        st.lists(
            st.one_of(identifiers, st.sampled_from(["eh_groups", "eh_children", "eh_schema"])),
            max_size=4,
            unique=True,
        )
    )
    rows = {name: draw(st.lists(st.tuples(cell, cell), max_size=3)) for name in names}
    journal = draw(st.sampled_from(["DELETE", "WAL"]))

    def make(path: Path) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"PRAGMA journal_mode={journal}")
        for name, content in rows.items():
            conn.execute(f'CREATE TABLE "{name}" (version, other)')
            conn.executemany(f'INSERT INTO "{name}" VALUES (?, ?)', content)
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()

    return make


versions = st.lists(
    st.one_of(
        st.just(SCHEMA_VERSION),
        st.integers(-5, 10),
        st.sampled_from([2**63 - 1, -(2**63), 3.0, "3", b"3", None]),
    ),
    max_size=3,
)


def with_versions(values: list[Any]) -> Callable[[Path], None]:
    """The real database whose ``eh_schema`` holds ``values`` instead."""

    def make(path: Path) -> None:
        path.write_bytes(real_database())
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("DELETE FROM eh_schema")
        for value in values:
            try:
                conn.execute("INSERT INTO eh_schema (version) VALUES (?)", (value,))
            except sqlite3.IntegrityError:  # NOT NULL
                pass
        conn.close()

    return make


def truncated(fraction: float) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        data = real_database()
        path.write_bytes(data[: int(len(data) * fraction)])

    return make


def flipped(flips: list[tuple[float, int]]) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        data = bytearray(real_database())
        for where, bit in flips:
            data[min(int(len(data) * where), len(data) - 1)] ^= 1 << bit
        path.write_bytes(bytes(data))

    return make


files = st.one_of(
    raw_files,
    random_tables(),
    versions.map(with_versions),
    st.floats(0.0, 1.0, exclude_max=True).map(truncated),
    st.lists(
        st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=3
    ).map(flipped),
    st.just(write_bytes(b"")),
)


# -- oracle and runs --------------------------------------------------------------------


def is_current_database(path: Path) -> bool:
    """Whether ``path`` reads as an effecthost database of this schema version."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            version = conn.execute("SELECT max(version) FROM eh_schema").fetchone()[0]
            for table in ("eh_groups", "eh_children", "eh_retired", "eh_payloads"):
                conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return type(version) is int and version == SCHEMA_VERSION


def snapshot(folder: Path, path: Path) -> Any:
    """The folder's listing and the file's bytes: what a refusal must leave as it was."""
    return sorted(os.listdir(folder)), hashlib.sha256(path.read_bytes()).hexdigest()


def run_in_process(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    return code, err.getvalue()


def run_subprocess(args: list[str]) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "effecthost.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return run.returncode, run.stderr


def check(make: Callable[[Path], None], run: Callable[[list[str]], tuple[int, str]]) -> None:
    for command, options in COMMANDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            path = folder / "db.sqlite3"
            make(path)
            valid = is_current_database(path)
            before = snapshot(folder, path)
            code, stderr = run([command, "--sqlite", str(path), *options])
            refused = code != 0
            if refused or not valid:
                assert refused, (command, code, stderr)
                assert "Traceback" not in stderr, stderr
                lines = stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("effecthost: "), stderr
            if command == "inspect" or refused:
                assert snapshot(folder, path) == before, (command, code, stderr)


@FILES
@given(make=files)
# found by this property: a drain switched a corrupt database to WAL before a read hit
# the corruption, so its refusal left the file changed
@example(make=flipped([(0.2, 0)]))
def test_inspect_and_drain_on_generated_files(make: Callable[[Path], None]) -> None:
    """SPEC §7: on any generated file, ``inspect`` and ``drain --once`` either work on an
    effecthost database of this schema version or refuse in one line with a non-zero exit
    code; ``inspect`` never changes the file, a refusing ``drain`` neither."""
    check(make, run_in_process)


@settings(FILES, max_examples=4)
@given(make=files)
def test_the_command_refuses_generated_files_in_one_line(make: Callable[[Path], None]) -> None:
    """SPEC §7: the same through the installed command (a real process: no traceback on
    stderr, nothing left beside the file)."""
    check(make, run_subprocess)
