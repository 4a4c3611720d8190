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
import re
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis_support import examples
from test_cli_hostile import effecthost_db

from effecthost import _inspect as shown
from effecthost._timeline import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    BadRequest,
    Request,
    parse_request_head,
)
from effecthost.cli import main
from effecthost.hosts.sql import SCHEMA_VERSION

FILES = examples(40)
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


# -- the ui request parser and the human-readable tables (issue 21) ------------------------

PARSER = settings(max_examples=300, deadline=None)
tokens = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}", fullmatch=True)
path_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)


@PARSER
@given(head=st.binary(max_size=MAX_HEAD_BYTES + 64))
def test_the_ui_parser_refuses_any_bytes_with_bad_request_only(head: bytes) -> None:
    """Issue 21: whatever bytes arrive, the parser returns a request or raises
    ``BadRequest`` with a 4xx/5xx status, nothing else."""
    try:
        request = parse_request_head(head)
    except BadRequest as exc:
        assert exc.status in (400, 405, 431, 505)
    else:
        assert isinstance(request, Request) and request.path.startswith("/")


@PARSER
@given(
    path=path_text,
    query=st.one_of(st.none(), path_text),
    headers=st.lists(st.tuples(tokens, st.text(alphabet="abc xyz:/-", max_size=20)), max_size=80),
)
def test_the_ui_parser_reads_a_well_formed_get(
    path: str, query: str | None, headers: list[tuple[str, str]]
) -> None:
    """Issue 21: a well-formed GET is read as sent: the path without its query,
    percent-decoded; headers by lower-cased name; more than ``MAX_HEADERS`` is 431."""
    from urllib.parse import quote, unquote

    target = "/" + quote(path, safe="/") + ("" if query is None else "?" + quote(query))
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers]
    names = [n.lower() for n, _ in headers]
    repeated = any(n in ("host", "content-length", "transfer-encoding") for n in names)
    try:
        request = parse_request_head("\r\n".join(lines).encode())
    except BadRequest as exc:
        assert (
            len(lines) - 1 > MAX_HEADERS
            or repeated
            or "content-length" in names
            or "transfer-encoding" in names
        ), exc
        return
    assert len(lines) - 1 <= MAX_HEADERS
    assert request.method == "GET"
    assert request.path == unquote(target.split("?", 1)[0])
    assert request.headers["host"] == "127.0.0.1"


RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
stored = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.integers(),
    st.floats(),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.tuples(st.text(max_size=12), stored, stored, stored, stored), max_size=5),
    children=st.lists(
        st.tuples(stored, stored, st.text(max_size=12), st.text(max_size=12), stored, stored),
        max_size=5,
    ),
)
def test_human_output_carries_no_control_character_and_never_fails(
    groups: list[tuple[Any, ...]], children: list[tuple[Any, ...]]
) -> None:
    """Issue 21: whatever a store holds (text with control characters, bidi overrides,
    numbers of any size, wrong types), the tables print one line per row, with no raw
    control character, and a value that is not its column's type as ``<unreadable>``."""
    group_rows = [
        shown.GroupRow(key, age, wake, None, settled, None, owner)
        for key, age, wake, settled, owner in groups
    ]
    child_rows = [
        shown.ChildRow(
            rank, position, replay, tool, status if isinstance(status, str) else "x", at, None
        )
        for rank, position, replay, tool, status, at in children
    ]
    table = shown.groups_table(group_rows)
    ranks = shown.ranks_table(shown.in_rank_order(child_rows))
    for text, rows in ((table, group_rows), (ranks, child_rows)):
        assert not RAW.search(text), repr(text)
        assert len(text.split("\n")) == len(rows) + 1
