"""Issue 23: traces and metrics through OpenTelemetry on the memory and SQLite tiers, with
the real SDK's in-memory exporters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from otel_support import (
    WIDTH,
    await_ranks,
    child_spans,
    collected,
    expected_shape,
    program_spans,
    run_program,
    shape,
    work,
)

from effecthost import telemetry
from effecthost.contract import (
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectKind,
    ExecutionInput,
    GroupMembership,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.sql import SqlEffectHost, SqliteStore


@pytest.mark.anyio
async def test_memory_group_child_and_tool_spans_form_one_tree() -> None:
    """Issue 23: one group span, a child span per child under it with the tool's own span
    inside, an await span per rank; metrics count them with bounded attributes."""
    with collected() as seen:
        host = MemoryEffectHost(ToolRegistry({"work": work}))
        spans = await program_spans(seen, host, "otel:mem:0")
        children = child_spans(spans, "otel:mem:0")
        assert [c.attributes["effecthost.status"] for c in children] == ["success"] * WIDTH
        ranks = await_ranks(spans, "otel:mem:0")
        assert sorted(ranks.values()) == [1, 2, 3]
        assert [c.attributes["effecthost.rank"] for c in children] == [ranks[p] for p in range(3)]
        (group,) = [s for s in spans if s.name == "effecthost.group"]
        assert group.attributes["effecthost.group.width"] == WIDTH
        assert group.attributes["effecthost.group.deciding_rank"] == WIDTH
        points = seen.metric_points()
        assert sum(p.value for p in points["effecthost.groups.opened"]) == 1
        assert sum(p.value for p in points["effecthost.children.settled"]) == WIDTH
        for name, found in points.items():
            for point in found:
                assert "effecthost.group.key" not in point.attributes, name


@pytest.mark.anyio
async def test_sqlite_group_child_and_tool_spans_form_one_tree(tmp_path: Path) -> None:
    """Issue 23: the same program on SQLite yields the same tree."""
    with collected() as seen:
        host = SqlEffectHost(SqliteStore(tmp_path / "otel.sqlite3"), ToolRegistry({"work": work}))
        await host.start()
        spans = await program_spans(seen, host, "otel:sqlite:0")
        ranks = await_ranks(spans, "otel:sqlite:0")
        children = child_spans(spans, "otel:sqlite:0")
        assert [c.attributes["effecthost.rank"] for c in children] == [ranks[p] for p in range(3)]


@pytest.mark.anyio
async def test_a_cancelled_loser_and_the_deciding_rank_are_on_the_spans() -> None:
    """Issue 23: a FIRST group with CANCEL: the group span names rank 1 as deciding (with
    its position), the loser's child span says it was a cancelled loser."""
    never = asyncio.Event()

    async def fast(value: Any) -> Any:
        return value

    running: list[asyncio.Task[Any]] = []

    async def slow(_value: Any) -> Any:
        running.append(asyncio.current_task())  # type: ignore[arg-type]
        await never.wait()

    group = EffectGroup(
        key="otel:mem:race",
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[
            EffectEnvelope(replay_key="race:0", kind=EffectKind.TOOL_CALL, name="slow", input=0),
            EffectEnvelope(replay_key="race:1", kind=EffectKind.TOOL_CALL, name="fast", input=1),
        ],
    )
    with collected() as seen:
        host = MemoryEffectHost(ToolRegistry({"fast": fast, "slow": slow}))
        try:
            handle = await host.open_effect_group(group)
            assert (await host.await_next_settlement(handle)).position == 1
            await host.close_effect_group(handle)
            await asyncio.wait(running, timeout=5)  # the loser's task ending
        finally:
            await host.aclose()
        spans = seen.finished()
        loser, winner = child_spans(spans, group.key)
        assert loser.attributes["effecthost.status"] == "cancelled"
        assert loser.attributes["effecthost.child.cancelled_loser"] is True
        assert winner.attributes["effecthost.status"] == "success"
        (span,) = [s for s in spans if s.name == "effecthost.group"]
        assert span.attributes["effecthost.group.deciding_rank"] == 1
        assert span.attributes["effecthost.group.deciding_position"] == 1


def _member(key: str, position: int, name: str) -> EffectEnvelope:
    envelope = EffectEnvelope(
        replay_key=f"{key}:{position}", kind=EffectKind.TOOL_CALL, name=name, input=position
    )
    membership = GroupMembership(
        group_key=key,
        position=position,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
    )
    return envelope.with_membership(membership)


@pytest.mark.anyio
async def test_a_rank_named_elsewhere_reaches_the_kept_child_span() -> None:
    """Issue 23: the hooks an engine host uses when a child's rank is learned after its
    run: a rank named from another thread (a Temporal workflow's) ends the kept span with
    it; a rank named while the child still runs (a Restate loser's settle answered before
    its cancelled tool ended) is put on its span when the run ends; a span whose rank is
    never named here is exported without one after ``within`` seconds."""
    started, release = asyncio.Event(), asyncio.Event()

    async def held(value: Any) -> Any:
        started.set()
        await release.wait()
        return value

    tools = ToolRegistry({"work": work, "held": held})
    key = "otel:hooks"

    async def run(envelope: EffectEnvelope, within: float | None = None) -> None:
        telemetry.rank_later(within)
        executor = tools.resolve(envelope)
        assert executor is not None
        await executor.execute(ExecutionInput(envelope))

    with collected() as seen:
        await run(_member(key, 0, "work"))
        assert child_spans(seen.finished(), key) == []  # kept for its rank
        await asyncio.to_thread(telemetry.ranked, key, 0, 3)
        (first,) = child_spans(seen.finished(), key)
        assert first.attributes["effecthost.rank"] == 3

        running = asyncio.create_task(run(_member(key, 1, "held")))
        await started.wait()
        telemetry.ranked(key, 1, 1)
        release.set()
        await running
        second = child_spans(seen.finished(), key)[1]
        assert second.attributes["effecthost.rank"] == 1

        await run(_member(key, 2, "work"), within=0.01)
        # the expiry is a timer of the loop: a bounded wait for it to fire
        for _ in range(500):
            if len(child_spans(seen.finished(), key)) == 3:
                break
            await asyncio.sleep(0.01)
        third = child_spans(seen.finished(), key)[2]
        assert "effecthost.rank" not in third.attributes
        telemetry.ranked(key, 2, 2)  # too late: nothing is kept
        assert len(child_spans(seen.finished(), key)) == 3


def test_off_until_instrumented_and_off_again_after() -> None:
    """Issue 23 (no cost when unused): before ``instrument`` and after ``uninstrument`` the
    executor and the controllers run their own methods, not wrappers."""
    original = EffectExecutor.__dict__["execute"]
    opens = MemoryEffectHost.__dict__["open_effect_group"]
    assert not telemetry.instrumented()
    with collected():
        assert EffectExecutor.__dict__["execute"] is not original
        assert MemoryEffectHost.__dict__["open_effect_group"] is not opens
    assert EffectExecutor.__dict__["execute"] is original
    assert MemoryEffectHost.__dict__["open_effect_group"] is opens


def test_without_the_extra_instrument_names_the_install() -> None:
    """Issue 23: with ``opentelemetry`` missing, ``instrument`` raises ``MissingExtra``
    naming ``effecthost[otel]``; importing ``effecthost.telemetry`` alone needs nothing."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from effecthost import telemetry\n"
        "from effecthost.hosts import MissingExtra\n"
        "try:\n"
        "    telemetry.instrument()\n"
        "except MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "effecthost[otel]" in result.stdout


@pytest.mark.anyio
async def test_a_group_a_tool_opens_hangs_under_that_tools_child_span() -> None:
    """Issue 23: a tool that opens a group of its own (an agent step fanning out) gets a
    group span under its child's span, with its children's spans under that."""
    host: MemoryEffectHost

    async def fan_out(_value: Any) -> Any:
        return await run_program(host, "otel:mem:inner")

    with collected() as seen:
        host = MemoryEffectHost(ToolRegistry({"work": work, "fan_out": fan_out}))
        outer = EffectGroup(
            key="otel:mem:outer",
            wake=WakePolicy.ALL,
            disposition=LoserPolicy.RUN_TO_COMPLETION,
            children=[
                EffectEnvelope(replay_key="outer:0", kind=EffectKind.TOOL_CALL, name="fan_out")
            ],
        )
        try:
            handle = await host.open_effect_group(outer)
            assert (await host.await_next_settlement(handle)).outcome.value == [0, 1, 2]
            await host.close_effect_group(handle)
        finally:
            await host.aclose()
        spans = seen.finished()
        assert shape(spans, "otel:mem:inner") == expected_shape()
        (inner,) = [
            s
            for s in spans
            if s.attributes.get("effecthost.group.key") == "otel:mem:inner"
            and s.name == "effecthost.group"
        ]
        (outer_child,) = child_spans(spans, "otel:mem:outer")
        assert inner.parent_id == outer_child.span_id
        assert inner.trace_id == outer_child.trace_id


def test_the_conformance_suite_passes_with_telemetry_on() -> None:
    """Issue 23: instrumentation changes no behaviour: the shipped conformance suite passes
    on the memory host with every controller, drain and executor method wrapped (G-19's
    cancelled awaits, G-27's closes, R-9's outer cancellation included)."""
    tests = str(Path(__file__).parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "effecthost.cli",
            "conformance",
            "otel_support:traced_memory_factory",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " 0 failed" in result.stdout
