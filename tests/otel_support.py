"""The real OpenTelemetry SDK with its in-memory exporters, and the one program every tier's
telemetry test runs: a group of three tool calls whose tool opens a span of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from effecthost import telemetry
from effecthost.contract import (
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    WakePolicy,
)

WIDTH = 3
TOOL_SPAN = "tool.work"

_provider: TracerProvider | None = None


async def work(value: Any) -> Any:
    """The program's tool: its own span must land inside its child's span."""
    tracer = trace.get_tracer("tests.tool", tracer_provider=_provider)
    with tracer.start_as_current_span(TOOL_SPAN, attributes={"input": value}):
        return value


@dataclass
class Collected:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    provider: TracerProvider

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

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
    """Open, await every rank, close: what a caller's ``all_`` does."""
    handle = await controller.open_effect_group(program_group(key, width))
    values = []
    for _ in range(width):
        values.append((await controller.await_next_settlement(handle)).outcome.value)
    await controller.close_effect_group(handle)
    return values


OURS = ("effecthost.group", "effecthost.child", "effecthost.await", TOOL_SPAN)


def shape(spans: list[ReadableSpan], key: str) -> list[tuple[str, str | None]]:
    """The tree of one group's spans as (span, nearest ancestor of ours), sorted: spans an
    engine adds in between (a Temporal activity's) are walked through, so every tier that
    keeps the links intact gives the same shape. Asserts one trace holds them all."""
    by_id = {s.context.span_id: s for s in spans}
    group = [
        s
        for s in spans
        if s.name == "effecthost.group" and s.attributes.get("effecthost.group.key") == key
    ]
    assert len(group) == 1, [s.name for s in spans]
    trace_id = group[0].context.trace_id
    mine = [s for s in spans if s.context.trace_id == trace_id and s.name in OURS]
    result = []
    for span in mine:
        parent = span.parent
        ancestor = None
        while parent is not None:
            above = by_id.get(parent.span_id)
            assert above is not None, f"{span.name}'s parent {parent.span_id:x} was not exported"
            if above.name in OURS:
                ancestor = above.name
                break
            parent = above.parent
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


def child_spans(spans: list[ReadableSpan], key: str) -> list[ReadableSpan]:
    return sorted(
        (
            s
            for s in spans
            if s.name == "effecthost.child" and s.attributes.get("effecthost.group.key") == key
        ),
        key=lambda s: s.attributes["effecthost.position"],
    )


def await_ranks(spans: list[ReadableSpan], key: str) -> dict[int, int]:
    """Position -> rank, as the caller's awaits served them."""
    return {
        s.attributes["effecthost.position"]: s.attributes["effecthost.rank"]
        for s in spans
        if s.name == "effecthost.await" and s.attributes.get("effecthost.group.key") == key
    }
