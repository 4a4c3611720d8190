"""The ``effecthost`` command run as a child process, as the CLI tests run it: with the
tests directory importable (``cli_tools``, ``broken_hosts``), piped or on a
pseudo-terminal; and the stored outcome of a child read straight from a SQLite file."""

from __future__ import annotations

import asyncio
import os
import pty
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from effecthost.contract import EffectEnvelope, EffectGroup, LoserPolicy, ToolRegistry, WakePolicy
from effecthost.hosts.sql import sqlite_host

TESTS = Path(__file__).parent
COMMAND = [sys.executable, "-m", "effecthost.cli"]


def cli_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the environment by default) with the tests directory on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return env


def cli(
    *args: str, timeout: float = 60.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``effecthost ARGS`` piped; ``env`` is the environment before
    :func:`cli_env`."""
    return subprocess.run(
        [*COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
        check=False,
    )


def on_a_terminal(*args: str, env: Mapping[str, str]) -> tuple[int, str]:
    """Run ``effecthost ARGS`` with its stdout on a pseudo-terminal; (exit code, output)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*COMMAND, *args], stdout=terminal, stderr=subprocess.STDOUT, env=dict(env)
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    code = process.wait(60)
    return code, b"".join(chunks).decode()


def stored_outcome(path: Path, replay_key: str, *, read_only: bool = True) -> str | None:
    """The outcome column of child ``replay_key`` in the SQLite file ``path``. A read-write
    connection leaves no ``-wal``/``-shm`` behind it (a read-only one would)."""
    target = f"file:{path}?mode=ro" if read_only else str(path)
    conn = sqlite3.connect(target, uri=read_only)
    try:
        row = conn.execute(
            "SELECT outcome FROM eh_children WHERE replay_key = ?", (replay_key,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


async def abandoned_groups(
    db: Path, keys: list[str], value: Callable[[int], Any] = lambda i: i
) -> None:
    """Open a group of two ``hold`` calls (inputs ``value(0)``, ``value(1)``) that never
    return for each of ``keys``, then stop the host as a dying process stops: the short
    leases expire on the database clock."""
    never = asyncio.Event()

    async def hold(value: Any) -> Any:
        await never.wait()

    host = await sqlite_host(db, ToolRegistry({"hold": hold}), lease_ttl=0.6, renew_every=0.1)
    for key in keys:
        await host.open_effect_group(
            EffectGroup(
                key=key,
                wake=WakePolicy.ALL,
                disposition=LoserPolicy.RUN_TO_COMPLETION,
                children=[
                    EffectEnvelope(
                        replay_key=f"{key}:{i}", kind="tool_call", name="hold", input=value(i)
                    )
                    for i in range(2)
                ],
            )
        )
    await host.aclose()
