"""Issue 23 on the Restate tier: the endpoint process runs each child under the trace
context the caller's open carried, so its child spans and their tools' spans hang under
the caller's group span in one trace."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import otel_support
import pytest
from group_support import race as race_group
from otel_support import (
    SPANS_FILE,
    assert_child_ranks,
    child_spans,
    collected,
    expected_shape,
    read_records,
    run_program,
    shape,
)

from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    group_key,
)
from effecthost.hosts.restate.testing import LocalRestate

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
TESTS = Path(__file__).parents[1]


@pytest.mark.parametrize("width", [3, 40], ids=["sent", "collected"])
async def test_issue23_one_trace_from_caller_through_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """Issue 23: on Restate the program gives the same span tree as on memory and SQL,
    the child spans recorded by the endpoint process; also for a wide group whose children
    the endpoint's collectors start. Each child span carries its rank: a traced child
    settles by a call and reads its rank from the reply."""
    spans_file = tmp_path / "endpoint-spans.jsonl"
    monkeypatch.setenv(SPANS_FILE, str(spans_file))
    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    local = LocalRestate(tmp_path / "restate", "otel_support:registry")
    try:
        await local.start()
        with collected() as seen:
            ctl = local.controller(otel_support.registry, owner="tests")
            key = group_key("otel", "restate", width)
            try:
                assert await run_program(ctl, key, width) == list(range(width))
            finally:
                await ctl.aclose()
            spans = seen.finished(spans_file)
            assert shape(spans, key) == expected_shape(width)
            assert_child_ranks(spans, key, width)
    finally:
        await local.stop()


async def test_issue23_a_cancelled_losers_span_carries_its_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23, G-27, R-11: a traced race closed with ``CANCEL``: the winner's span holds
    rank 1; the loser, cancelled while its tool runs, still settles (by a call, its wait
    cut by nothing) and its span, marked a cancelled loser, holds rank 2."""
    spans_file = tmp_path / "endpoint-spans.jsonl"
    monkeypatch.setenv(SPANS_FILE, str(spans_file))
    paths = [str(TESTS), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    local = LocalRestate(tmp_path / "restate", "otel_support:registry")
    key = group_key("otel", "race", 0)
    group = race_group(
        key,
        [
            EffectEnvelope(
                replay_key=f"{key}:{tool}", kind=EffectKind.TOOL_CALL, name=tool, input=i
            )
            for i, tool in enumerate(["block", "work"])
        ],
    )
    try:
        await local.start()
        with collected():
            ctl = local.controller(otel_support.registry, owner="tests")
            try:
                handle = await ctl.open_effect_group(group)
                first = await ctl.await_next_settlement(handle)
                assert (first.position, first.rank) == (1, 1)
                await ctl.close_effect_group(handle)
            finally:
                await ctl.aclose()
            # the endpoint exports the loser's span once its settle is answered: a
            # bounded poll of the other process's file
            deadline = time.monotonic() + 30
            while len(child_spans(read_records(spans_file), key)) < 2:
                assert time.monotonic() < deadline, read_records(spans_file)
                await asyncio.sleep(0.1)
            loser, winner = child_spans(read_records(spans_file), key)
            assert winner.attributes["effecthost.rank"] == 1
            assert winner.attributes["effecthost.status"] == "success"
            assert loser.attributes["effecthost.child.cancelled_loser"] is True
            assert loser.attributes["effecthost.status"] == "cancelled"
            assert loser.attributes["effecthost.rank"] == 2
    finally:
        await local.stop()
