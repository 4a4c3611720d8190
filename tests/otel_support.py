"""The real OpenTelemetry SDK with its in-memory exporters, and the one program every tier's
telemetry test runs: a group of three tool calls whose tool opens a span of its own."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from effecthost import telemetry
from effecthost.contract import (
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)

WIDTH = 3
TOOL_SPAN = "tool.work"
SPANS_FILE = "EFFECTHOST_TEST_SPANS"
"""Names the file another process (an endpoint, a worker, a killed caller) appends its
finished spans to, one JSON line each, when it imports this module's ``registry``."""

_provider: TracerProvider | None = None


async def work(value: Any) -> Any:
    """The program's tool: its own span must land inside its child's span."""
    tracer = trace.get_tracer("tests.tool", tracer_provider=_provider)
    with tracer.start_as_current_span(TOOL_SPAN, attributes={"input": value}):
        return value


async def block(value: Any) -> Any:
    """A loser's tool: runs until its run is cancelled."""
    await asyncio.Event().wait()
    return value


class Record(NamedTuple):
    """A finished span, from this process's exporter or another process's file."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    attributes: dict[str, Any]
    links: tuple[int, ...] = ()
    """The span ids the span links to."""


def _record(span: ReadableSpan) -> Record:
    assert span.context is not None
    return Record(
        span.name,
        span.context.trace_id,
        span.context.span_id,
        span.parent.span_id if span.parent is not None else None,
        dict(span.attributes or {}),
        tuple(link.context.span_id for link in span.links),
    )


class FileExporter(SpanExporter):
    """Appends each finished span as a JSON line, flushed at once (the process may be
    SIGKILLed next). The file is opened once: a Temporal workflow's spans are exported
    from inside its sandbox, where ``open`` is refused."""

    def __init__(self, path: str) -> None:
        self.out = open(path, "a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.out.write(json.dumps(list(_record(span))) + "\n")
        self.out.flush()
        return SpanExportResult.SUCCESS


def read_records(path: Path) -> list[Record]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    found = [json.loads(line) for line in lines if line.strip()]
    return [Record(*fields[:5], tuple(fields[5]) if len(fields) > 5 else ()) for fields in found]


def instrument_to_file(path: str) -> None:
    """What a process other than the test's does: its spans go to ``path``."""
    global _provider
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    _provider = provider
    telemetry.instrument(tracer_provider=provider, meter_provider=MeterProvider())


@dataclass
class Collected:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    provider: TracerProvider

    def finished(self, *others: Path) -> list[Record]:
        """This process's spans, and those other processes wrote to ``others``."""
        found = [_record(s) for s in self.spans.get_finished_spans()]
        for path in others:
            found.extend(read_records(path))
        return found

    def metric_points(self) -> dict[str, list[Any]]:
        data = self.metrics.get_metrics_data()
        found: dict[str, list[Any]] = {}
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@contextmanager
def collected() -> Iterator[Collected]:
    """Instrumentation on, into in-memory exporters, for the body; off again after."""
    global _provider
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    _provider = provider
    telemetry.instrument(tracer_provider=provider, meter_provider=meters)
    try:
        yield Collected(exporter, reader, provider)
    finally:
        telemetry.uninstrument()
        _provider = None


def program_group(key: str, width: int = WIDTH) -> EffectGroup:
    return EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[
            EffectEnvelope(replay_key=f"{key}:{i}", kind=EffectKind.TOOL_CALL, name="work", input=i)
            for i in range(width)
        ],
    )


async def run_program(controller: EffectController, key: str, width: int = WIDTH) -> list[Any]:
    """Open, await every rank, close: what a caller's ``all_`` does; the values in
    position order."""
    handle = await controller.open_effect_group(program_group(key, width))
    values: dict[int, Any] = {}
    for _ in range(width):
        settlement = await controller.await_next_settlement(handle)
        values[settlement.position] = settlement.outcome.value
    await controller.close_effect_group(handle)
    return [values[p] for p in sorted(values)]


async def program_spans(seen: Collected, host: Any, key: str) -> list[Record]:
    """Run the program on ``host`` (closed after it) and the spans collected, checked to
    form the expected tree."""
    try:
        assert await run_program(host, key) == list(range(WIDTH))
    finally:
        await host.aclose()
    spans = seen.finished()
    assert shape(spans, key) == expected_shape()
    return spans


OURS = ("effecthost.group", "effecthost.child", "effecthost.await", TOOL_SPAN)


def shape(spans: list[Record], key: str) -> list[tuple[str, str | None]]:
    """The tree under one group's span as (span, nearest ancestor of ours), sorted: spans
    an engine adds in between (a Temporal activity's) are walked through, so every tier that
    keeps the links intact gives the same shape. A span whose parent was not exported
    fails it (a broken link), as does a span of ours outside the trace (it is missing)."""
    by_id = {s.span_id: s for s in spans}
    group = [
        s
        for s in spans
        if s.name == "effecthost.group" and s.attributes.get("effecthost.group.key") == key
    ]
    assert len(group) == 1, [s.name for s in spans]
    root = group[0]
    mine = [s for s in spans if s.trace_id == root.trace_id and s.name in OURS]
    result = [(root.name, None)]
    for span in mine:
        parent = span.parent_id
        ancestor = None
        under = False
        while parent is not None and span is not root:
            above = by_id.get(parent)
            assert above is not None, f"{span.name}'s parent {parent:x} was not exported"
            if ancestor is None and above.name in OURS:
                ancestor = above.name
            if above is root:
                under = True
                break
            parent = above.parent_id
        if under:
            result.append((span.name, ancestor))
    return sorted(result, key=lambda item: (item[0], item[1] or ""))


def expected_shape(width: int = WIDTH) -> list[tuple[str, str | None]]:
    return sorted(
        [("effecthost.group", None)]
        + [("effecthost.await", "effecthost.group")] * width
        + [("effecthost.child", "effecthost.group")] * width
        + [(TOOL_SPAN, "effecthost.child")] * width,
        key=lambda item: (item[0], item[1] or ""),
    )


def child_spans(spans: list[Record], key: str) -> list[Record]:
    return sorted(
        (
            s
            for s in spans
            if s.name == "effecthost.child" and s.attributes.get("effecthost.group.key") == key
        ),
        key=lambda s: s.attributes["effecthost.position"],
    )


def await_ranks(spans: list[Record], key: str) -> dict[int, int]:
    """Position -> rank, as the caller's awaits served them."""
    return {
        s.attributes["effecthost.position"]: s.attributes["effecthost.rank"]
        for s in spans
        if s.name == "effecthost.await" and s.attributes.get("effecthost.group.key") == key
    }


def assert_child_ranks(spans: list[Record], key: str, width: int = WIDTH) -> None:
    """Issue 23: every child span carries the rank its caller's await served it (ranks
    1..width, one per position)."""
    served = await_ranks(spans, key)
    assert sorted(served.values()) == list(range(1, width + 1))
    children = child_spans(spans, key)
    assert len(children) == width
    found = {
        c.attributes["effecthost.position"]: c.attributes.get("effecthost.rank") for c in children
    }
    assert found == served, (found, served)


registry = ToolRegistry({"work": work, "block": block})
"""The resolver another process loads (``otel_support:registry``); importing it there
instruments that process into the file :data:`SPANS_FILE` names."""

if os.environ.get(SPANS_FILE) and not telemetry.instrumented():
    instrument_to_file(os.environ[SPANS_FILE])


def traced_memory_factory(env: Any) -> Any:
    """The memory host's conformance factory with telemetry on (the SDK, spans kept in
    memory): the suite must pass with every method wrapped."""
    from effecthost.hosts.memory.testing import sealed_factory

    global _provider
    if not telemetry.instrumented():
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        _provider = provider
        reader = InMemoryMetricReader()
        telemetry.instrument(
            tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader])
        )
    return sealed_factory(env)
