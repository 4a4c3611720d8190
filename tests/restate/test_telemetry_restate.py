"""Issue 23 on the Restate tier: the endpoint process runs each child under the trace
context the caller's open carried, so its child spans and their tools' spans hang under
the caller's group span in one trace."""

from __future__ import annotations

import os
from pathlib import Path

import otel_support
import pytest
from otel_support import (
    SPANS_FILE,
    assert_child_ranks,
    collected,
    expected_shape,
    run_program,
    shape,
)

from effecthost.contract import group_key
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
