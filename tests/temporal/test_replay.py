"""Replay the checked-in history and re-derive the ranks (G-43).

The ``Replayer`` compares commands, not derived state: a changed rank rule replays
"successfully". So the test captures what the workflow derives on replay (its result:
replay keys in rank order) and compares it with the ranks the caller observed when the
history was recorded (``record_history.py``), and shows that a changed rule is caught.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import (
    Replayer,
    UnsandboxedWorkflowRunner,
)

from effecthost.hosts.temporal import (
    EffectGroupWorkflow,
    EffectShardWorkflow,
    _workflow,
    workflow_runner,
)

from ._support import _Capture

RECORDED = Path(__file__).parent / "histories" / "group_ranks.json"


def _load() -> tuple[WorkflowHistory, list[str]]:
    doc = json.loads(RECORDED.read_text())
    return WorkflowHistory.from_json(doc["workflow_id"], doc["history"]), list(doc["ranks"])


async def _rederive() -> list[str]:
    history, _ = _load()
    capture = _Capture()
    replayer = Replayer(
        workflows=[EffectGroupWorkflow],
        workflow_runner=UnsandboxedWorkflowRunner(),
        interceptors=[capture],
    )
    await replayer.replay_workflow(history)
    assert len(capture.results) == 1
    return list(capture.results[0]["ranks"])


def test_history_replays_in_the_sandbox() -> None:
    history, _ = _load()
    replayer = Replayer(workflows=[EffectGroupWorkflow], workflow_runner=workflow_runner())
    result = asyncio.run(replayer.replay_workflow(history, raise_on_replay_failure=False))
    assert result.replay_failure is None, result.replay_failure


def test_replay_rederives_the_recorded_ranks() -> None:
    _, recorded = _load()
    assert len(recorded) == 7
    assert asyncio.run(_rederive()) == recorded


def test_a_changed_rank_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranking by position instead of by observation replays without a Replayer error,
    and the re-derived ranks expose it."""

    def by_position(settled: list[dict[str, Any]], settlement: dict[str, Any]) -> None:
        settled.append(settlement)
        settled.sort(key=lambda s: s["position"])
        for rank, entry in enumerate(settled, start=1):
            entry["rank"] = rank

    monkeypatch.setattr(_workflow, "assign_rank", by_position)
    _, recorded = _load()
    assert asyncio.run(_rederive()) != recorded


SHARDED = Path(__file__).parent / "histories" / "shard_reports.json"


def test_sharded_histories_of_this_release_replay() -> None:
    """G-43, G-15: a sharded group recorded before shards spaced their reports
    (``shard_signal_interval``) replays: each shard's history in the sandbox with the
    current shard workflow (its reports per workflow task, as recorded), and the group's
    re-derives the ranks the caller read (``record_history.py --shards``)."""
    doc = json.loads(SHARDED.read_text())
    replayer = Replayer(
        workflows=[EffectGroupWorkflow, EffectShardWorkflow], workflow_runner=workflow_runner()
    )
    for shard in doc["shards"]:
        history = WorkflowHistory.from_json(shard["workflow_id"], shard["history"])
        result = asyncio.run(replayer.replay_workflow(history, raise_on_replay_failure=False))
        assert result.replay_failure is None, (shard["workflow_id"], result.replay_failure)
    capture = _Capture()
    group = WorkflowHistory.from_json(doc["workflow_id"], doc["history"])
    asyncio.run(
        Replayer(
            workflows=[EffectGroupWorkflow],
            workflow_runner=UnsandboxedWorkflowRunner(),
            interceptors=[capture],
        ).replay_workflow(group)
    )
    assert capture.results[0]["ranks"] == doc["ranks"]
