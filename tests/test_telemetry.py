"""Issue 23: traces and metrics through OpenTelemetry on the memory and SQLite tiers, with
the real SDK's in-memory exporters."""

from __future__ import annotations

from pathlib import Path

import pytest
from otel_support import (
    WIDTH,
    await_ranks,
    child_spans,
    collected,
    expected_shape,
    run_program,
    shape,
    work,
)

from effecthost.contract import ToolRegistry
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.sql import SqlEffectHost, SqliteStore

pytestmark = pytest.mark.anyio


async def test_memory_group_child_and_tool_spans_form_one_tree() -> None:
    """Issue 23: one group span, a child span per child under it with the tool's own span
    inside, an await span per rank; metrics count them with bounded attributes."""
    with collected() as seen:
        host = MemoryEffectHost(ToolRegistry({"work": work}))
        try:
            assert await run_program(host, "otel:mem:0") == [0, 1, 2]
        finally:
            await host.aclose()
        spans = seen.finished()
        assert shape(spans, "otel:mem:0") == expected_shape()
        children = child_spans(spans, "otel:mem:0")
        assert [c.attributes["effecthost.status"] for c in children] == ["success"] * WIDTH
        assert sorted(await_ranks(spans, "otel:mem:0").values()) == [1, 2, 3]
        (group,) = [s for s in spans if s.name == "effecthost.group"]
        assert group.attributes["effecthost.group.width"] == WIDTH
        assert group.attributes["effecthost.group.deciding_rank"] == WIDTH
        points = seen.metric_points()
        assert sum(p.value for p in points["effecthost.groups.opened"]) == 1
        assert sum(p.value for p in points["effecthost.children.settled"]) == WIDTH
        for name, found in points.items():
            for point in found:
                assert "effecthost.group.key" not in point.attributes, name


async def test_sqlite_group_child_and_tool_spans_form_one_tree(tmp_path: Path) -> None:
    """Issue 23: the same program on SQLite yields the same tree."""
    with collected() as seen:
        host = SqlEffectHost(SqliteStore(tmp_path / "otel.sqlite3"), ToolRegistry({"work": work}))
        await host.start()
        try:
            assert await run_program(host, "otel:sqlite:0") == [0, 1, 2]
        finally:
            await host.aclose()
        assert shape(seen.finished(), "otel:sqlite:0") == expected_shape()
