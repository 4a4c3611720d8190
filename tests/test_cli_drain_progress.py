"""What ``effecthost drain`` shows (G-34): on a terminal a status line of what ran and
what is left; piped, plain lines of a documented format (or JSON lines), no control
characters. Against a real SQLite database whose opener went away."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from cli_support import abandoned_groups, cli, cli_env
from cli_support import on_a_terminal as terminal_run

KEY = "cli:group:progress:0"


def _wide() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, env=_wide())


def on_a_terminal(*args: str) -> tuple[int, str]:
    """``effecthost ARGS`` with its stdout on a pseudo-terminal; (exit code, output)."""
    return terminal_run(*args, env=cli_env(_wide()))


def abandoned_group(db: Path) -> None:
    """A two-child group whose tools never return, its host stopped as a dying process
    stops; its short leases expire on the database clock."""
    asyncio.run(abandoned_groups(db, [KEY]))


def until(run: Any, expect: str) -> str:
    """Repeat a one-pass drain (bounded) until the dead opener's leases have expired."""
    for _ in range(40):
        output = run()
        if expect in output:
            return str(output)
    raise AssertionError(f"no drain reported {expect!r}: {output}")


def test_drain_piped_prints_one_line_per_event_and_a_summary(tmp_path: Path) -> None:
    """G-34: piped, each pass is one ``pass N:`` line with what is left, each child it
    touched one indented line, and the run ends with one ``done:`` line."""
    db = tmp_path / "effects.sqlite3"
    abandoned_group(db)

    def once(*args: str) -> str:
        run = piped("drain", "--sqlite", str(db), "--once", *args)
        assert run.returncode == 0, run.stderr
        return run.stdout

    report = until(once, "no executor 2")
    assert report.splitlines() == [
        "pass 1: resumed 0, cancelled 0, no executor 2; left: 2 unsettled in 1 open group(s)",
        f"  no executor: {KEY} {KEY}:0",
        f"  no executor: {KEY} {KEY}:1",
        "done: 1 pass(es), resumed 0, cancelled 0, no executor 2; "
        "left: 2 unsettled in 1 open group(s)",
    ]
    resumed = until(lambda: once("--resolver", "cli_tools:registry"), "resumed 2")
    assert resumed.splitlines() == [
        "pass 1: resumed 2, cancelled 0, no executor 0; left: 2 unsettled in 1 open group(s)",
        f"  resumed: {KEY} {KEY}:0",
        f"  resumed: {KEY} {KEY}:1",
        "done: 1 pass(es), resumed 2, cancelled 0, no executor 0; "
        "left: 0 unsettled in 1 open group(s)",
    ]
    assert "\x1b" not in report + resumed and "\r" not in report + resumed


def test_drain_json_lines(tmp_path: Path) -> None:
    """G-34: ``--json`` prints one JSON object per line: a ``pass``, one per child, a
    ``done``; keys with spaces stay parseable."""
    db = tmp_path / "effects.sqlite3"
    abandoned_group(db)

    def once() -> str:
        run = piped("drain", "--sqlite", str(db), "--once", "--json")
        assert run.returncode == 0, run.stderr
        return run.stdout

    events = [json.loads(line) for line in until(once, '"no_executor": 2').splitlines()]
    assert events == [
        {
            "event": "pass",
            "pass": 1,
            "resumed": 0,
            "cancelled": 0,
            "no_executor": 2,
            "unsettled": 2,
            "open_groups": 1,
        },
        {"event": "no_executor", "pass": 1, "group_key": KEY, "replay_key": f"{KEY}:0"},
        {"event": "no_executor", "pass": 1, "group_key": KEY, "replay_key": f"{KEY}:1"},
        {
            "event": "done",
            "passes": 1,
            "resumed": 0,
            "cancelled": 0,
            "no_executor": 2,
            "unsettled": 2,
            "open_groups": 1,
        },
    ]


def test_drain_on_a_terminal_shows_what_runs_and_what_is_left(tmp_path: Path) -> None:
    """G-34: on a terminal a status line says which pass runs, what ran so far and what
    is left, and that resumed children are being finished; each result line overwrites
    it."""
    db = tmp_path / "effects.sqlite3"
    abandoned_group(db)

    def once() -> str:
        code, shown = on_a_terminal(
            "drain", "--sqlite", str(db), "--once", "--resolver", "cli_tools:registry"
        )
        assert code == 0, shown
        return shown

    shown = until(once, "resumed 2")
    assert "\r\x1b[Kpass 1: draining (so far: resumed 0, cancelled 0, no executor 0)" in shown
    assert "\r\x1b[Kfinishing 2 resumed child(ren); left: 2 unsettled in 1 open group(s)" in shown
    assert (
        "\r\x1b[Kpass 1: resumed 2, cancelled 0, no executor 0; "
        "left: 2 unsettled in 1 open group(s)\r\n" in shown
    )
    assert shown.rstrip("\r\n").endswith(
        "done: 1 pass(es), resumed 2, cancelled 0, no executor 0; "
        "left: 0 unsettled in 1 open group(s)"
    )
