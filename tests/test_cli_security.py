"""The operator tools under hostile input (issue 21), each through the real command in a
subprocess: a sealed deployment never gets plaintext from ``drain``; ``ui`` cannot be
frozen by idle or half-sent connections and stops within a second of SIGTERM; ``--html``
replaces only its own pages; values from a store are printed with their control
characters escaped; hostile stored values are marked cells; ``conformance`` reports every
factory problem in one line with an exit code of its own; nothing is left beside a
database."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cli_support import stored_outcome as read_outcome
from group_support import group as effect_group
from test_cli_hostile import (
    assert_one_line_refusal,
    cli,
    effecthost_db,
    snapshot,
)

from effecthost.cli import ExitCode
from effecthost.contract import EffectEnvelope, ToolRegistry
from effecthost.hosts.sql import sqlite_host

TESTS = Path(__file__).parent
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def side_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "-"))


async def _dead_opener(
    path: Path, key: str, tool: str = "hold", *, sealed: Path | None = None, settle: bool = False
) -> None:
    """A host (sealing with the keys in ``sealed``) opens ``key`` with two children that
    never finish, then goes away (or, with ``settle``, a group whose one child settles)."""
    never = asyncio.Event()

    async def hold(value: Any) -> Any:
        await never.wait()

    async def echo(value: Any) -> Any:
        return value

    policy = None
    if sealed is not None:
        from effecthost.payloads import AesGcmSealer, FileKeyStore, PayloadPolicy

        policy = PayloadPolicy(sealer=AesGcmSealer(FileKeyStore(sealed)))
    host = await sqlite_host(
        path,
        ToolRegistry({tool: echo if settle else hold}),
        lease_ttl=0.6,
        renew_every=0.1,
        payloads=policy,
    )
    group = effect_group(
        key,
        [
            EffectEnvelope(replay_key=f"{key}:{i}", kind="tool_call", name=tool, input=SECRET)
            for i in range(1 if settle else 2)
        ],
    )
    handle = await host.open_effect_group(group)
    if settle:
        await asyncio.wait_for(host.await_next_settlement(handle), 10)
    await host.aclose()


SECRET = "plaintext-canary-21"


def stored_outcome(path: Path, replay_key: str) -> str | None:
    """A read that leaves no ``-wal``/``-shm`` (a read-only connection would)."""
    return read_outcome(path, replay_key, read_only=False)


def rollback_journal(path: Path) -> None:
    """Everything in the one file, no ``-wal``/``-shm`` beside it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()


def wait_for_expired_leases(path: Path) -> None:
    """Bounded poll: the dead opener's leases expire on the database clock (an external
    state this test only waits for)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        conn = sqlite3.connect(path)  # read-write: its close removes any -wal/-shm
        try:
            live = conn.execute(
                "SELECT count(*) FROM eh_children WHERE lease_expires >= "
                "(julianday('now') - 2440587.5) * 86400.0"
            ).fetchone()[0]
        finally:
            conn.close()
        if not live:
            return
        time.sleep(0.05)
    raise AssertionError("leases did not expire")


# -- 1. a sealed deployment never gets plaintext -------------------------------------------


@pytest.mark.parametrize("journal", ["DELETE", "WAL"])
def test_drain_refuses_a_sealed_deployment_in_which_nothing_has_settled(
    tmp_path: Path, journal: str
) -> None:
    """G-48, issue 21: a sealing host dies before any child settles; a drain without
    ``--keys`` is refused (exit ``sealed``, one line) and records nothing, the file as it
    was and nothing beside it; with the keys the child is recorded sealed."""
    db, keys = tmp_path / "sealed.sqlite3", tmp_path / "keys"
    keys.mkdir()
    asyncio.run(_dead_opener(db, "sec:sealed:0", sealed=keys))
    if journal == "DELETE":
        rollback_journal(db)
    assert side_files(db) == []
    wait_for_expired_leases(db)
    before = snapshot(db)
    run = cli("drain", "--sqlite", str(db), "--once", "--resolver", "cli_tools:registry")
    assert_one_line_refusal(run, ExitCode.SEALED, "sealed")
    assert stored_outcome(db, "sec:sealed:0:0") is None
    assert snapshot(db) == before
    assert side_files(db) == []
    keyed = cli(
        "drain", "--sqlite", str(db), "--once", "--resolver", "cli_tools:registry", "--keys", keys
    )
    assert keyed.returncode == 0, keyed.stderr
    stored = stored_outcome(db, "sec:sealed:0:0")
    assert stored is not None and SECRET not in stored and '"sealed":true' in stored


# -- 2. ui cannot be frozen --------------------------------------------------------------


class Ui:
    def __init__(self, db: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "effecthost.cli", "ui", "--sqlite", str(db), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, (line, self.proc.stderr.read() if self.proc.stderr else "")
        self.port = int(match.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        took = time.monotonic() - started
        self.proc.communicate()
        return took


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_ui_serves_every_page_while_idle_and_half_sent_connections_are_held_open(
    tmp_path: Path,
) -> None:
    """Issue 21: with 20 idle and 20 half-sent connections open, a real HTTP client gets
    the index and every group page at once; SIGTERM stops the server within a second
    while those connections are still open; nothing is left beside the database."""
    db = effecthost_db(tmp_path / "ui.sqlite3", groups=3)
    ui = Ui(db)
    held: list[socket.socket] = []
    try:
        for _ in range(20):
            held.append(_connect(ui.port))
        for _ in range(20):
            half = _connect(ui.port)
            half.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            held.append(half)
        started = time.monotonic()
        status, index = ui.get("/")
        assert status == 200 and "3 open group(s)" in index
        for g in range(3):
            status, page = ui.get(f"/group/cli%3Ahostile%3A{g}")
            assert status == 200 and f"cli:hostile:{g}" in page
        assert time.monotonic() - started < 4.0  # none waited for a held connection
        assert ui.stop() < 1.0
    finally:
        for sock in held:
            sock.close()
        if ui.proc.poll() is None:
            ui.proc.kill()
            ui.proc.communicate()
    assert ui.proc.returncode == 0
    assert side_files(db) == []


def test_ui_closes_idle_connections_and_bounds_request_heads(tmp_path: Path) -> None:
    """Issue 21: an idle connection is answered 408 and closed within a few seconds; a
    head over 16 KiB or with too many header lines is 431, a body or another method is
    refused; every reply says ``Connection: close`` (no keep-alive whose request cap could
    drop a reply); the server keeps serving."""
    db = effecthost_db(tmp_path / "ui.sqlite3")
    ui = Ui(db)
    try:
        idle = _connect(ui.port)
        started = time.monotonic()
        reply = idle.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert time.monotonic() - started < 8.0
        idle.close()

        def ask(head: bytes) -> bytes:
            sock = _connect(ui.port)
            try:
                sock.sendall(head)
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
                return data
            finally:
                sock.close()

        big = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
        assert ask(big).startswith(b"HTTP/1.1 431")
        many = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-A: b\r\n" * 100 + b"\r\n"
        assert ask(many).startswith(b"HTTP/1.1 431")
        post = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        assert ask(post).startswith(b"HTTP/1.1 405")
        ok = ask(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and b"\r\nConnection: close\r\n" in ok
        for _ in range(50):  # many requests in a row: every one answered
            assert ui.get("/")[0] == 200
    finally:
        assert ui.stop() < 1.0
    assert ui.proc.returncode == 0


@pytest.mark.parametrize("port", ["-1", "70000", str(10**30), "x"])
def test_ui_validates_the_port(tmp_path: Path, port: str) -> None:
    """Issue 21: a port outside 0…65535 is a usage error, not a traceback."""
    db = effecthost_db(tmp_path / "ui.sqlite3")
    run = cli("ui", "--sqlite", str(db), "--port", port, timeout=30)
    assert run.returncode == ExitCode.USAGE, run.stderr
    assert "Traceback" not in run.stderr and "port must be an integer" in run.stderr


# -- 3. --html replaces only its own pages ----------------------------------------------


def test_html_refuses_to_overwrite_a_file_it_did_not_write(tmp_path: Path) -> None:
    """Issue 21: ``--html`` pointed at the database itself is refused (exit ``clobber``),
    the database intact; a page it wrote is replaced; ``--force`` replaces another file;
    the write is atomic (no temporary file left)."""
    db = effecthost_db(tmp_path / "db.sqlite3")
    rollback_journal(db)
    before = snapshot(db)
    group = ["inspect", "--sqlite", str(db), "--group", "cli:hostile:0"]
    run = cli(*group, "--html", str(db))
    assert_one_line_refusal(run, ExitCode.CLOBBER, "--force")
    assert snapshot(db) == before
    assert cli("inspect", "--sqlite", str(db)).returncode == 0

    page = tmp_path / "page.html"
    for _ in range(2):  # a new file, then the page it wrote
        assert cli(*group, "--html", str(page)).returncode == 0
        assert page.read_text().startswith("<!doctype html>")
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    assert cli(*group, "--html", str(other)).returncode == ExitCode.CLOBBER
    assert other.read_text() == "mine"
    assert cli(*group, "--html", str(other), "--force").returncode == 0
    assert other.read_text().startswith("<!doctype html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.sqlite3", "notes.txt", "page.html"]


@pytest.mark.parametrize(
    ("target", "code", "word"),
    [
        ("{tmp}/no/such/dir/page.html", ExitCode.WRITE_FAILED, "no such directory"),
        ("{tmp}", ExitCode.NOT_A_FILE, "directory"),
        ("/dev/full", ExitCode.NOT_A_FILE, "special file"),
        ("", ExitCode.USAGE, "file name"),
    ],
)
def test_html_turns_every_filesystem_problem_into_one_line(
    tmp_path: Path, target: str, code: int, word: str
) -> None:
    """Issue 21: a missing directory, a directory, ``/dev/full`` and an empty name are
    each one line and an exit code, even with ``--force``."""
    db = effecthost_db(tmp_path / "db.sqlite3")
    name = target.format(tmp=tmp_path)
    for force in ([], ["--force"]):
        run = cli(
            "inspect", "--sqlite", str(db), "--group", "cli:hostile:0", "--html", name, *force
        )
        assert_one_line_refusal(run, code, word)


# -- 4. control characters -----------------------------------------------------------------

HOSTILE_KEY = "sec:\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://x\x1b\\\u202eevil\x9b31m\x7f"
HOSTILE_TOOL = "t\x1b[31mred\r"


def test_inspect_and_drain_escape_control_characters_from_the_store(tmp_path: Path) -> None:
    """Issue 21: keys and tool names holding ESC sequences, C1, DEL, CR and a bidi
    override are printed escaped by ``inspect`` (both tables) and ``drain``; ``--json``
    keeps them as they are (JSON-escaped)."""
    import json

    db = tmp_path / "ctl.sqlite3"
    asyncio.run(_dead_opener(db, HOSTILE_KEY, HOSTILE_TOOL))
    wait_for_expired_leases(db)
    for args in ([], ["--group", HOSTILE_KEY]):
        run = cli("inspect", "--sqlite", str(db), *args)
        assert run.returncode == 0, run.stderr
        assert not RAW_CONTROL.search(run.stdout + run.stderr), repr(run.stdout)
        assert "\\x1b]0;pwned\\x07" in run.stdout and "\\u202eevil" in run.stdout
    assert "\\x1b[31mred\\x0d" in run.stdout
    as_json = cli("inspect", "--sqlite", str(db), "--group", HOSTILE_KEY, "--json")
    assert json.loads(as_json.stdout)["group"]["key"] == HOSTILE_KEY
    drain = cli("drain", "--sqlite", str(db), "--once")  # no resolver: reported, unchanged
    assert drain.returncode == 0, drain.stderr
    assert "no executor" in drain.stdout
    assert not RAW_CONTROL.search(drain.stdout + drain.stderr), repr(drain.stdout)
    unknown = cli("inspect", "--sqlite", str(db), "--group", HOSTILE_KEY + "x")
    assert unknown.returncode == ExitCode.UNKNOWN_GROUP
    assert not RAW_CONTROL.search(unknown.stderr), repr(unknown.stderr)


# -- 6. hostile stored values, no file left behind -----------------------------------------


@pytest.mark.parametrize(
    "tamper",
    [
        "UPDATE eh_children SET settled_at = 9e999, seq = 1, state = 'settled' WHERE position = 1",
        "UPDATE eh_children SET settled_at = 1e300, seq = 1, state = 'settled' WHERE position = 1",
        "UPDATE eh_children SET settled_at = -1e300, seq = 1, state = 'settled' WHERE position = 1",
        "UPDATE eh_children SET settled_at = 'soon', seq = 1, state = 'settled' WHERE position = 1",
        "UPDATE eh_groups SET created_at = 1e300",
        "UPDATE eh_groups SET created_at = 'yesterday'",
        "UPDATE eh_children SET position = 'first' WHERE position = 0",
    ],
)
def test_hostile_stored_values_are_unreadable_cells_not_tracebacks(
    tmp_path: Path, tamper: str
) -> None:
    """Issue 21: a value of the wrong type or out of range in the store is printed as an
    ``<unreadable>`` cell (the rest of the table shown), drawn as not recorded in the
    timeline, never a traceback."""
    db = effecthost_db(tmp_path / "db.sqlite3")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(tamper)
    conn.close()
    for args in ([], ["--group", "cli:hostile:0"]):
        run = cli("inspect", "--sqlite", str(db), *args)
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr
        assert "cli:hostile:0" in run.stdout
    assert "<unreadable>" in run.stdout or "created_at" in tamper
    page = tmp_path / "page.html"
    html = cli("inspect", "--sqlite", str(db), "--group", "cli:hostile:0", "--html", str(page))
    assert html.returncode == 0, html.stderr
    assert "cli:hostile:0" in page.read_text()


def test_inspect_leaves_no_side_files_beside_a_wal_database(tmp_path: Path) -> None:
    """Issue 21: ``inspect`` of a WAL-mode database (no ``-wal``/``-shm`` beside it)
    leaves none; the database keeps its bytes."""
    db = effecthost_db(tmp_path / "wal.sqlite3")
    assert side_files(db) == []
    before = snapshot(db)
    for args in ([], ["--group", "cli:hostile:0"], ["--json"]):
        assert cli("inspect", "--sqlite", str(db), *args).returncode == 0
        assert side_files(db) == []
    assert snapshot(db) == before


# -- 5. conformance factory problems -------------------------------------------------------

FACTORIES = [
    ("bad_factories:raises", ExitCode.FACTORY, "RuntimeError: the factory broke"),
    ("bad_factories:raises_async", ExitCode.FACTORY, "KeyError"),
    ("bad_factories:returns_none", ExitCode.FACTORY, "returned NoneType"),
    ("bad_factories:returns_int", ExitCode.FACTORY, "returned int"),
    ("bad_factories:returns_str", ExitCode.FACTORY, "returned str"),
    ("bad_factories:returns_dict", ExitCode.FACTORY, "returned dict"),
    ("bad_factories:returns_none_async", ExitCode.FACTORY, "returned NoneType"),
    ("bad_factories:exits", ExitCode.FACTORY, "sys.exit(7)"),
    ("bad_factories:not_callable", ExitCode.FACTORY, "not callable"),
    ("bad_factories:no_such_attribute", ExitCode.FACTORY, "no such attribute"),
    ("no_such_module_21:factory", ExitCode.FACTORY, "cannot import"),
    ("broken_module:factory", ExitCode.FACTORY, "cannot import"),
    ("bad_factories:hangs", ExitCode.FACTORY_TIMEOUT, "within 1 s"),
    ("bad_factories:blocks", ExitCode.FACTORY_TIMEOUT, "within 1 s"),
    ("nocolon", ExitCode.USAGE, "MODULE:FACTORY"),
]


@pytest.mark.parametrize(("factory", "code", "word"), FACTORIES)
def test_every_factory_problem_is_one_line_naming_the_factory(
    factory: str, code: int, word: str
) -> None:
    """SPEC §8, issue 21: a factory that cannot be imported, raises, exits, hangs (async
    or blocking its thread) past ``--factory-timeout`` or returns something that is not
    a host is one line naming it and the problem, with its own exit code."""
    started = time.monotonic()
    run = cli("conformance", factory, "-k", "G-01", "--factory-timeout", "1", timeout=120)
    assert time.monotonic() - started < 60
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effecthost: "), run.stderr
    assert factory in lines[0] and word in lines[0], lines


def test_conformance_help_lists_the_factory_exit_codes() -> None:
    """Issue 21: the factory exit codes are listed in ``conformance --help``."""
    help_text = cli("conformance", "--help").stdout
    for code in (ExitCode.FACTORY, ExitCode.FACTORY_TIMEOUT):
        assert f"{code.value:>2}  {code.name.lower().replace('_', '-')}" in help_text
    assert "--factory-timeout" in help_text


@pytest.mark.parametrize(
    "args",
    [
        ["--list", "-k", ")"],
        ["--list", "-k", "("],
        ["--list", "-k", "and"],
        ["--list", "-k", "not"],
        ["--list", "-k", "G-01 or"],
        ["--list", "-k", "() ()"],
        ["--list", "-k", "(" * 5000],
        ["--explain", "G-" + "9" * 5000],
        ["--explain", "X" * 100_000],
        ["--explain", "G-\x1b[2J"],
    ],
)
def test_selection_and_explain_problems_are_one_short_line(args: list[str]) -> None:
    """Issue 21: an unparsable ``-k`` and an odd ``--explain`` id are one line (exit 2)
    that echoes no more than a few hundred characters of the input."""
    run = cli("conformance", *args)
    assert run.returncode == ExitCode.USAGE, (run.returncode, run.stderr[:500])
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effecthost: "), run.stderr[:500]
    assert len(lines[0]) < 400
    assert not RAW_CONTROL.search(run.stderr)
