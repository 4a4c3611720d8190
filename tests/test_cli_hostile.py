"""``effecthost inspect`` and ``drain`` on files they do not own or cannot use (SPEC §7: a
clear refusal that changes nothing): a one-line error naming the problem, a distinct exit
code per problem class, the file byte-identical afterwards."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import abandoned_groups, cli, stored_outcome
from group_support import group as effect_group

from effecthost.cli import ExitCode
from effecthost.contract import EffectEnvelope, ToolRegistry
from effecthost.hosts.sql import sqlite_host

TESTS = Path(__file__).parent


def snapshot(path: Path) -> Any:
    """What must not change: the bytes of a file, the listing of a directory, absence."""
    if path.is_dir():
        return ("dir", sorted(os.listdir(path)))
    if not path.exists():
        return ("missing",)
    return ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)


def effecthost_db(path: Path, groups: int = 1, *, journal: str = "WAL") -> Path:
    keys = [f"cli:hostile:{g}" for g in range(groups)]
    asyncio.run(abandoned_groups(path, keys, lambda _: "x" * 200))
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode={journal}")  # checkpoints: everything in the file
    conn.close()
    return path


def make_missing(tmp: Path) -> Path:
    return tmp / "nothing-here.sqlite3"


def make_empty(tmp: Path) -> Path:
    (tmp / "empty.sqlite3").write_bytes(b"")
    return tmp / "empty.sqlite3"


def make_directory(tmp: Path) -> Path:
    (tmp / "adir").mkdir()
    (tmp / "adir" / "inside").write_text("x")
    return tmp / "adir"


def make_random(tmp: Path) -> Path:
    path = tmp / "random.sqlite3"
    path.write_bytes(os.urandom(8192))
    return path


def make_foreign(tmp: Path) -> Path:
    """Another application's SQLite file, in the rollback-journal mode it chose."""
    path = tmp / "notes.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine')")
    conn.close()
    return path


def make_other_version(tmp: Path) -> Path:
    """An effecthost database of another schema version, in rollback-journal mode (so a
    ``journal_mode=WAL`` before the version check would change it)."""
    path = effecthost_db(tmp / "v99.sqlite3", journal="DELETE")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE eh_schema SET version = 99")
    conn.close()
    return path


def make_truncated(tmp: Path) -> Path:
    path = effecthost_db(tmp / "truncated.sqlite3", groups=40, journal="DELETE")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def make_cut_mid_page(tmp: Path) -> Path:
    path = effecthost_db(tmp / "cut.sqlite3", groups=3, journal="DELETE")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    return path


def make_header_only(tmp: Path) -> Path:
    path = effecthost_db(tmp / "header.sqlite3", journal="DELETE")
    path.write_bytes(path.read_bytes()[:60])
    return path


def make_read_only(tmp: Path) -> Path:
    path = effecthost_db(tmp / "readonly.sqlite3", journal="DELETE")
    path.chmod(0o444)
    return path


# kind: (builder, inspect exit code, drain exit code, a word of the message)
CASES: dict[str, tuple[Callable[[Path], Path], int, int, str]] = {
    "missing": (make_missing, ExitCode.MISSING, ExitCode.MISSING, "no such file"),
    "empty": (make_empty, ExitCode.EMPTY, ExitCode.EMPTY, "empty"),
    "directory": (make_directory, ExitCode.NOT_A_FILE, ExitCode.NOT_A_FILE, "not a file"),
    "random": (make_random, ExitCode.NOT_SQLITE, ExitCode.NOT_SQLITE, "not a SQLite"),
    "foreign": (make_foreign, ExitCode.FOREIGN, ExitCode.FOREIGN, "no effecthost tables"),
    "other-version": (
        make_other_version,
        ExitCode.SCHEMA_VERSION,
        ExitCode.SCHEMA_VERSION,
        "schema version 99",
    ),
    "truncated": (make_truncated, ExitCode.CORRUPT, ExitCode.CORRUPT, "truncated"),
    "cut-mid-page": (make_cut_mid_page, ExitCode.CORRUPT, ExitCode.CORRUPT, "truncated"),
    "header-only": (make_header_only, ExitCode.CORRUPT, ExitCode.CORRUPT, "truncated"),
    "read-only": (make_read_only, ExitCode.OK, ExitCode.READ_ONLY, "read-only"),
}


def assert_one_line_refusal(run: subprocess.CompletedProcess[str], code: int, word: str) -> None:
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("effecthost: "), lines
    assert word.lower() in lines[0].lower(), lines
    assert run.stdout == "", run.stdout


@pytest.mark.parametrize("command", ["inspect", "drain"])
@pytest.mark.parametrize("kind", list(CASES))
def test_a_hostile_file_is_refused_in_one_line_and_left_as_it_was(
    tmp_path: Path, kind: str, command: str
) -> None:
    """SPEC §7: a file that is not a usable effecthost database gets a one-line error
    naming the problem and an exit code of its own, and is byte-identical afterwards
    (nothing created, no tables added, no journal-mode change)."""
    make, inspect_code, drain_code, word = CASES[kind]
    path = make(tmp_path)
    before = snapshot(path)
    args = ["--once", "--resolver", "cli_tools:registry"] if command == "drain" else []
    run = cli(command, "--sqlite", str(path), *args)
    code = inspect_code if command == "inspect" else drain_code
    if code == ExitCode.OK:
        assert run.returncode == 0, run.stderr
        assert "cli:hostile:0" in run.stdout
    else:
        assert_one_line_refusal(run, code, word)
    assert snapshot(path) == before


def test_exit_codes_are_distinct_and_documented() -> None:
    """SPEC §7: one exit code per problem class, each listed in the CLI help and in
    docs/operators.md."""
    codes = [c.value for c in ExitCode]
    assert len(codes) == len(set(codes))
    help_text = cli("inspect", "--help").stdout
    docs = (TESTS.parent / "docs" / "operators.md").read_text()
    for code in ExitCode:
        if code in (ExitCode.OK,):
            continue
        assert f"{code.value:>2}  {code.name.lower().replace('_', '-')}" in help_text, code
        assert f"| {code.value} | `{code.name.lower().replace('_', '-')}`" in docs, code


def test_inspect_leaves_a_valid_database_byte_identical(tmp_path: Path) -> None:
    """SPEC §7: inspect opens read-only: a rollback-journal effecthost database keeps its
    bytes (no ``journal_mode=WAL``, no schema write)."""
    path = effecthost_db(tmp_path / "ok.sqlite3", journal="DELETE")
    before = snapshot(path)
    run = cli("inspect", "--sqlite", str(path))
    assert run.returncode == 0, run.stderr
    assert "cli:hostile:0  " in run.stdout and "  0/2  " in run.stdout
    assert snapshot(path) == before


class WriteLocked:
    """An effecthost database whose write lock another connection holds until
    ``release()``. Its bytes are read only while no lock is held: closing any descriptor
    of a file drops every POSIX lock this process holds on it."""

    def __init__(self, path: Path) -> None:
        self.path = effecthost_db(path)
        self.before = snapshot(self.path)
        self._holder = sqlite3.connect(self.path, isolation_level=None)
        self._holder.execute("BEGIN IMMEDIATE")

    def release(self) -> Any:
        """Release the lock; the file's snapshot afterwards."""
        if self._holder is not None:
            self._holder.execute("ROLLBACK")
            self._holder.close()
            self._holder = None
        return snapshot(self.path)


@pytest.fixture
def write_locked(tmp_path: Path) -> Iterator[WriteLocked]:
    locked = WriteLocked(tmp_path / "locked.sqlite3")
    try:
        yield locked
    finally:
        locked.release()


def test_inspect_never_needs_the_write_lock(write_locked: WriteLocked) -> None:
    """SPEC §7: inspect reads while another writer holds the write lock."""
    run = cli("inspect", "--sqlite", str(write_locked.path), "--lock-timeout", "0.2")
    assert run.returncode == 0, run.stderr
    assert "cli:hostile:0" in run.stdout
    assert write_locked.release() == write_locked.before


def test_drain_reports_a_locked_database_after_the_lock_timeout(
    write_locked: WriteLocked,
) -> None:
    """SPEC §7: a drain that cannot get the write lock within ``--lock-timeout`` says so
    in one line (its own exit code) instead of waiting 30 s and printing a traceback."""
    started = time.monotonic()
    run = cli("drain", "--sqlite", str(write_locked.path), "--once", "--lock-timeout", "0.3")
    assert time.monotonic() - started < 20
    assert_one_line_refusal(run, ExitCode.LOCKED, "locked")
    assert "0.3" in run.stderr
    assert write_locked.release() == write_locked.before


def test_inspect_reports_an_exclusively_locked_database(tmp_path: Path) -> None:
    """SPEC §7: a database another process holds exclusively (no readers) is reported
    as locked after ``--lock-timeout``."""
    path = effecthost_db(tmp_path / "exclusive.sqlite3")
    before = snapshot(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("SELECT count(*) FROM eh_groups").fetchall()
    try:
        run = cli("inspect", "--sqlite", str(path), "--lock-timeout", "0.3")
    finally:
        holder.close()
    assert_one_line_refusal(run, ExitCode.LOCKED, "locked")
    assert snapshot(path) == before


async def _sealed_db(path: Path, keys: Path) -> str:
    """A sealed database (as the sealed SQL hosts write it) with one settled child and
    one whose opener went away before it finished."""
    from effecthost.payloads import AesGcmSealer, FileKeyStore, PayloadPolicy

    never = asyncio.Event()

    async def hold(value: Any) -> Any:
        await never.wait()

    async def echo(value: Any) -> Any:
        return value

    policy = PayloadPolicy(sealer=AesGcmSealer(FileKeyStore(keys)))
    host = await sqlite_host(
        path,
        ToolRegistry({"hold": hold, "echo": echo}),
        lease_ttl=0.6,
        renew_every=0.1,
        payloads=policy,
    )
    key = "cli:sealed:0"
    handle = await host.open_effect_group(
        effect_group(
            key,
            [
                EffectEnvelope(replay_key=f"{key}:0", kind="tool_call", name="echo", input="c0"),
                EffectEnvelope(replay_key=f"{key}:1", kind="tool_call", name="hold", input=SECRET),
            ],
        )
    )
    await asyncio.wait_for(host.await_next_settlement(handle), 10)
    await host.aclose()
    return key


SECRET = "plaintext-canary-7f3a"


def test_drain_of_a_sealed_database_needs_its_payload_settings(tmp_path: Path) -> None:
    """G-48, G-49: a drain never records plaintext beside sealed outcomes: without
    ``--keys`` it refuses (its own exit code, the file unchanged); with them the child it
    finishes is recorded sealed, readable with the hosts' keys."""
    import json

    db, keys = tmp_path / "sealed.sqlite3", tmp_path / "keys"
    key = asyncio.run(_sealed_db(db, keys))
    before = snapshot(db)
    args = ["--once", "--resolver", "cli_tools:registry"]
    refused = cli("drain", "--sqlite", str(db), *args)
    assert_one_line_refusal(refused, ExitCode.SEALED, "sealed")
    assert snapshot(db) == before

    typo = cli("drain", "--sqlite", str(db), *args, "--keys", str(tmp_path / "no-such-dir"))
    assert_one_line_refusal(typo, ExitCode.USAGE, "no such directory")
    assert not (tmp_path / "no-such-dir").exists()

    for _ in range(40):  # the dead opener's lease expires on the database clock
        run = cli("drain", "--sqlite", str(db), *args, "--keys", str(keys))
        assert run.returncode == 0, run.stderr
        if "resumed 1" in run.stdout:
            break
    else:
        raise AssertionError(run.stdout)
    stored = stored_outcome(db, f"{key}:1")
    assert stored is not None and SECRET not in stored
    assert json.loads(stored)["sealed"] is True


ENGINES = {
    # factory: (environment that hides the engine's binary, the install command it names)
    "effecthost.hosts.sql.testing:postgres_factory": (
        {"EFFECTHOST_PG_BIN": "{missing}", "EFFECTHOST_POSTGRES_DSN": ""},
        "apt-get install postgresql",
    ),
    "effecthost.hosts.restate.testing:factory": (
        {"EFFECTHOST_RESTATE_SERVER": "{missing}/restate-server"},
        "scripts/install-restate.sh",
    ),
    "effecthost.hosts.temporal.testing:factory": (
        {"EFFECTHOST_TEMPORAL_CLI": "{missing}/temporal", "EFFECTHOST_TEMPORAL_ADDRESS": ""},
        "pip install 'effecthost[temporal]'",
    ),
}


@pytest.mark.parametrize("factory", list(ENGINES))
def test_conformance_without_the_engine_binary_names_the_install_command(
    tmp_path: Path, factory: str
) -> None:
    """SPEC §8: a factory whose engine binary is missing fails in one line naming the
    install command (exit engine-missing), not with a traceback."""
    overrides, install = ENGINES[factory]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    for name, value in overrides.items():
        if value:
            env[name] = value.format(missing=tmp_path / "nowhere")
        else:
            env.pop(name, None)
    run = subprocess.run(
        [sys.executable, "-m", "effecthost.cli", "conformance", factory, "-k", "G-01"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert_one_line_refusal(run, ExitCode.ENGINE_MISSING, install)
