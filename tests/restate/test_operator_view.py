"""What an operator sees with the ``restate`` CLI (the npm package of the server's version,
installed beside it by ``scripts/install-restate.sh``): a race of two tools whose loser a
``CANCEL`` close cancelled."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from group_support import group as effect_group
from operator_tools import resolver
from restate_stack import running_stack

from effecthost.conformance import step_input
from effecthost.contract import EffectEnvelope, EffectGroup, EffectKind, LoserPolicy, WakePolicy
from effecthost.hosts.restate import CHILD, GROUP, RestateController
from effecthost.hosts.restate.testing import LocalRestate

TESTS = str(Path(__file__).parents[1])
ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".engines/restate/node_modules/@restatedev/restate-linux-x64/bin/restate"
TIMEOUT = 20.0

pytestmark = pytest.mark.anyio


@dataclass
class Raced:
    local: LocalRestate
    controller: RestateController
    group: EffectGroup
    cli_home: Path

    def cli(self, *args: str) -> str:
        """Run the ``restate`` CLI against the test server's admin API; its stdout."""
        env = {
            **os.environ,
            "RESTATE_ADMIN_URL": self.local.admin_url,
            "RESTATE_CLI_CONFIG_HOME": str(self.cli_home),
        }
        done = subprocess.run(
            [str(CLI), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


def _child(tag: str, tool: str, **options: object) -> EffectEnvelope:
    return EffectEnvelope(
        replay_key=tag, kind=EffectKind.TOOL_CALL, name=tool, input=step_input(tag, **options)
    )


@pytest.fixture
async def raced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Raced]:
    """A ``race`` of ``lookup.fast`` (position 0, wins) and ``lookup.slow`` (position 1,
    cancelled by the close and then finished cancelled), closed."""
    assert CLI.is_file(), "run scripts/install-restate.sh (installs the restate CLI)"
    paths = [TESTS, os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    group = effect_group(
        "ops:race:7",
        [
            _child("ops.fast", "lookup.fast", gate=False),
            _child("ops.slow", "lookup.slow", hold_cancel=True),
        ],
        WakePolicy.FIRST,
        LoserPolicy.CANCEL,
    )
    async with running_stack(
        tmp_path, resolver="operator_tools:resolver", executors=resolver(str(tmp_path / "lab"))
    ) as stack:
        ctl, lab = stack.controller, stack.lab
        handle = await ctl.open_effect_group(group)
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        await lab.wait_for("started", "ops.slow", 1, TIMEOUT)
        await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)
        await lab.wait_for("cancelled", "ops.slow", 1, TIMEOUT)
        lab.open("ops.slow/release")
        yield Raced(stack.local, ctl, group, tmp_path / "cli")


async def _children(raced: Raced) -> dict[str, dict[str, str]]:
    """Completed child invocations by idempotency key (waits for the loser to finish)."""
    for _ in range(200):
        rows = json.loads(
            raced.cli(
                "sql",
                "--json",
                f"SELECT id, idempotency_key, status FROM sys_invocation "
                f"WHERE target_service_name = '{CHILD}'",
            )
        )
        if len(rows) == 2 and all(row["status"] == "completed" for row in rows):
            return {row["idempotency_key"]: row for row in rows}
        await asyncio.sleep(0.05)  # polling an engine fact, not ordering anything
    raise TimeoutError(f"child invocations did not complete: {rows}")


async def test_restate_cli_names_each_child_by_tool_position_and_group(raced: Raced) -> None:
    """G-37: ``restate invocations list`` shows each child's tool name and position (its
    idempotency key) and its group key (the group object's ``open`` invoked it); the
    idempotency key names the group key at most once; ``describe`` of the cancelled
    loser shows its tool name and the cancellation."""
    children = await _children(raced)
    listing = raced.cli("invocations", "list", "--all", "--service", CHILD)
    for position, (tool, tag) in enumerate(
        [("lookup.fast", "ops.fast"), ("lookup.slow", "ops.slow")]
    ):
        [key] = [k for k in children if k.startswith(f"{tool}:{position}:")]
        assert tag in key
        assert key in listing
        assert raced.group.key not in key
    assert f"{GROUP}/{raced.group.key}/open" in listing
    [loser] = [row for key, row in children.items() if key.startswith("lookup.slow:")]
    described = raced.cli("invocations", "describe", loser["id"])
    assert "lookup.slow:1:" in described
    assert "409" in described and "cancelled" in described
