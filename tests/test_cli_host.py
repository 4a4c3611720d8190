"""``effecthost drain --host`` and ``inspect --host`` against hosts the CLI knows nothing
about: the guide's example host and a third-party host defined in a module outside the
package (a directory on ``PYTHONPATH``), each run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

THIRD_PARTY = '''
"""A host a third party ships: the example host plus its own inspection columns."""
import asyncio
import os
import time

from effecthost.contract import EffectEnvelope, EffectGroup, ToolRegistry
from examples.file_host.host import FileHost

ROOT = os.environ["THIRD_HOST_ROOT"]


class ThirdHost(FileHost):
    """Every column of ``effecthost inspect`` through the documented interface."""

    def _group_row(self, record):
        ranks = record["ranks"]
        return {
            "key": record["key"], "age_seconds": 1.0, "wake": record["wake"],
            "disposition": record["effective"], "settled": len(ranks),
            "total": len(record["children"]), "owner": record["owner"][:8],
        }

    async def inspect_groups(self):
        return [self._group_row(r) for r in self.store.records() if not r["closed"]]

    async def inspect_group(self, key):
        record = self.store.read(key)
        if record is None or record["closed"]:
            return None
        ranks = record["ranks"]
        children = [
            {
                "rank": ranks.index(p) + 1 if p in ranks else None, "position": p,
                "replay_key": c["replay_key"], "tool": c["envelope"]["name"],
                "status": (c["outcome"] or {}).get("status", "running"), "sealed": False,
            }
            for p, c in enumerate(record["children"])
        ]
        return self._group_row(record), children


def host():
    return ThirdHost(ROOT, None)


async def echo(value):
    return value


async def forever(value):
    await asyncio.Event().wait()


def resolver():
    return ToolRegistry({"echo": echo})


def stuck():
    return ToolRegistry({"echo": forever})


def group(key):
    return EffectGroup(
        key=key, wake="all", disposition="run_to_completion",
        children=[
            EffectEnvelope(replay_key=f"{key}/{n}", kind="tool_call", name="echo", input=n)
            for n in range(3)
        ],
    )


async def crash_after_open(key):
    """Open a group whose children never finish, then die: its owner is gone."""
    caller = ThirdHost(ROOT, stuck())
    await caller.open_effect_group(group(key))
    os._exit(0)
'''


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    third = tmp_path / "third"
    third.mkdir()
    (third / "thirdhost.py").write_text(textwrap.dedent(THIRD_PARTY))
    store = tmp_path / "store"
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(third), str(ROOT), str(ROOT / "src")]),
        "THIRD_HOST_ROOT": str(store),
        "EFFECTHOST_FILE_ROOT": str(store),
    }


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effecthost.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def crash_after_open(env: dict[str, str], key: str) -> None:
    code = f"import asyncio, thirdhost; asyncio.run(thirdhost.crash_after_open({key!r}))"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_drain_host_runs_resumed_children_with_the_given_resolver(env: dict[str, str]) -> None:
    """G-11, G-30: ``drain --host M:A --resolver R`` resumes a dead owner's children with
    R, keeps the host open until they settled, and counts what is left from the host's
    ``open_group_keys()``; ``inspect --host`` then shows the settled group."""
    crash_after_open(env, "g1")
    unwired = run(env, "drain", "--host", "thirdhost:host", "--once")
    assert unwired.returncode == 0, unwired.stderr
    assert "no executor 3" in unwired.stdout and "left: 3 unsettled in 1" in unwired.stdout

    drained = run(
        env, "drain", "--host", "thirdhost:host", "--resolver", "thirdhost:resolver", "--once"
    )
    assert drained.returncode == 0, drained.stderr
    assert "resumed 3" in drained.stdout, drained.stdout
    assert "done: 1 pass(es), resumed 3" in drained.stdout
    assert "left: 0 unsettled in 1 open group(s)" in drained.stdout.splitlines()[-1]
    assert "RuntimeWarning" not in drained.stderr

    shown = run(env, "inspect", "--host", "examples.file_host.testing:from_env", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)["groups"]
    assert row | {"key": "g1", "settled": 3, "total": 3, "wake": "all"} == row
    one = run(env, "inspect", "--host", "examples.file_host.testing:from_env", "--group", "g1")
    assert one.returncode == 0, one.stderr
    assert all(f"g1/{n}" in one.stdout for n in range(3)) and "success" in one.stdout


def test_drain_host_says_what_it_leaves_running(env: dict[str, str]) -> None:
    """G-28: a drain whose resumed children do not settle within ``--finish-timeout``
    says how many it leaves running and exits non-zero (23), never "done" with 0."""
    crash_after_open(env, "g2")
    left = run(
        env,
        "drain",
        "--host",
        "examples.file_host.testing:from_env",
        "--resolver",
        "thirdhost:stuck",
        "--once",
        "--finish-timeout",
        "0.5",
    )
    assert left.returncode == 23, (left.stdout, left.stderr)
    assert "leaves 3 resumed child(ren) running" in left.stderr


def test_inspect_host_shows_every_column_the_host_supplies(env: dict[str, str]) -> None:
    """``inspect --host`` reads a host's ``inspect_groups()``/``inspect_group()`` (the
    documented interface): owner, age and tool columns show, and ``--group`` works."""
    crash_after_open(env, "g3")
    table = run(env, "inspect", "--host", "thirdhost:host")
    assert table.returncode == 0, table.stderr
    (line,) = [x for x in table.stdout.splitlines() if x.startswith("g3")]
    assert line.split()[1:5] == ["1s", "all", "run_to_completion", "0/3"], line
    assert len(line.split()) == 6 and line.split()[5] != "-"
    one = run(env, "inspect", "--host", "thirdhost:host", "--group", "g3", "--json")
    assert one.returncode == 0, one.stderr
    children = json.loads(one.stdout)["children"]
    assert [(c["position"], c["tool"], c["status"]) for c in children] == [
        (n, "echo", "running") for n in range(3)
    ]
    missing = run(env, "inspect", "--host", "thirdhost:host", "--group", "nope")
    assert missing.returncode == 17, missing.stderr
