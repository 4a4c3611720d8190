"""The Restate tier on a real 3-node restate-server cluster (replication 2): the short
version of ``scripts/restate_cluster.py``, one SIGKILL of a node the caller does not talk
to and one of the node it does, each mid-group and restarted later."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import restate_cluster

pytestmark = pytest.mark.anyio


@pytest.mark.timeout(300)
async def test_R12_groups_complete_when_a_node_dies_mid_group(tmp_path: Path) -> None:
    """R-12: a controller given every node's URLs fails over when a node dies mid-group,
    also the node it was talking to: an await in flight resumes on another node with
    the same handle, both groups (a 20-child ``all_`` and a ``race`` declaring
    ``CANCEL``) complete and are closed by their combinators with their disposition (the
    race's loser is cancelled before its effect, and no attempt of it starts its tool
    after the close returned: the endpoint's per-attempt guard, which reads through
    every node's admin API, issue 25), the ranks are dense and a fresh process re-reads
    them byte-identical, every child's effect happened, and nothing of the trial is
    left running or open in the engine."""
    result = await restate_cluster.run(tmp_path, trials=2, seed=7, victims=[1, 0])
    trials = result["trials"]
    assert result["endpoint_admin_urls"] == result["admin_urls"], result
    assert [t["caller_node"] for t in trials] == [False, True], trials
    for t in trials:
        assert t["errors"] == [], t
        assert t["all_ok"] and t["race_ok"], t
        assert t["ranks_dense"] and t["reread_identical"], t
        assert t["effects_missing"] == 0, t
        assert t["left_running"] == 0 and t["left_open"] == 0, t
        assert t["loser_starts_after_close"] == 0, t
        if t["race_closed_s"] < restate_cluster.SLOW_SECONDS:  # closed while the tool ran
            assert t["loser_effect"] == 0, t  # so the close's CANCEL stopped it
