"""What every benchmark of this directory shares: the machine facts a document starts
with, the PostgreSQL server to measure against, percentiles and spreads of samples,
table rules, and the run that prints the table and writes the JSON document.

Each benchmark script imports this module by name (its directory is the script's first
``sys.path`` entry)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
WORK = "bench.work"
"""The tool of restate_groups.py's endpoint, temporal_groups.py's worker and wide_groups.py."""


def machine(*, sqlite: bool = False, load: str | None = "loadavg") -> dict[str, Any]:
    """The head of a result document: the Python version, the CPU count, the load
    average (under the key ``load``) and, with ``sqlite``, the SQLite library version."""
    head: dict[str, Any] = {"python": platform.python_version()}
    if sqlite:
        head["sqlite"] = sqlite3.sqlite_version
    head["cpus"] = os.cpu_count() or 0
    if load:
        head[load] = os.getloadavg()
    return head


@contextlib.contextmanager
def postgres(*, fsync: bool = True) -> Iterator[str]:
    """The DSN of the server named by ``EFFECTHOST_POSTGRES_DSN``, or of a throwaway
    server (durable unless ``fsync`` is false) stopped on exit, even on error."""
    from effecthost.hosts.sql.testing import PostgresServer

    dsn = os.environ.get("EFFECTHOST_POSTGRES_DSN")
    if dsn:
        yield dsn
        return
    server = PostgresServer(fsync=fsync)
    try:
        yield server.start()
    finally:
        server.stop()


def echo_tools(name: str = WORK) -> Any:
    """A registry of one tool, ``name``, that returns its input."""
    from effecthost.contract import ToolRegistry

    async def echo(value: Any) -> Any:
        return value

    return ToolRegistry({name: echo})


def work_group(key: str, n: int, value: Callable[[int], Any] = lambda i: i) -> Any:
    """An ``all`` group (run to completion) of ``n`` calls of tool ``work``, replay keys
    ``{key}.c{i}``, input ``value(i)``."""
    from effecthost.contract import EffectEnvelope, EffectGroup, EffectKind, LoserPolicy, WakePolicy

    calls = [
        EffectEnvelope(
            replay_key=f"{key}.c{i}", kind=EffectKind.TOOL_CALL, name="work", input=value(i)
        )
        for i in range(n)
    ]
    return EffectGroup(
        key=key, wake=WakePolicy.ALL, disposition=LoserPolicy.RUN_TO_COMPLETION, children=calls
    )


def instrument_dropping() -> tuple[Any, Any]:
    """Instrument effecthost with the OpenTelemetry SDK: spans to an exporter that drops
    them, metrics to an in-memory reader. Returns the tracer and meter providers."""
    from collections.abc import Sequence

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from effecthost import telemetry

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(Dropped()))
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()])
    telemetry.instrument(tracer_provider=tracer, meter_provider=meter)
    return tracer, meter


def percentile(samples: list[float], q: float) -> float:
    """The sample at index ``q * n`` of the sorted samples (NaN when there are none)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def nearest_rank(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of sorted samples."""
    return ordered[max(0, math.ceil(len(ordered) * q) - 1)]


def spread(samples: list[float]) -> dict[str, Any]:
    """Median, minimum and maximum of a row's rounds."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def ruled(title: str, header: str) -> list[str]:
    """A table's first lines: its title, its header and a rule under the header."""
    return [title, header, "-" * len(header)]


def substrate_options(parser: argparse.ArgumentParser, substrates: str) -> None:
    """``--substrates`` (comma-separated, default ``substrates``) and ``--no-fsync``."""
    parser.add_argument("--substrates", default=substrates)
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="run the throwaway PostgreSQL with fsync=off (not durable; default: fsync=on)",
    )


def write_json(out: Path, document: Any) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")


def run(
    main: Callable[[Path], Coroutine[Any, Any, dict[str, Any]]],
    out: Path,
    table: Callable[[dict[str, Any]], str],
    *,
    prefix: str = "effecthost-bench-",
) -> dict[str, Any]:
    """Run ``main`` in a temporary directory, time it (``wall_s``), print ``table`` of
    its document and write the document to ``out``."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            document = asyncio.run(main(Path(tmp)))
        except KeyboardInterrupt:
            raise SystemExit("interrupted; the server was stopped") from None
    document["wall_s"] = round(time.perf_counter() - started, 1)
    print(table(document))
    write_json(out, document)
    print(f"wrote {out} in {document['wall_s']} s")
    return document


def latency_summary(latencies: list[float], rates: list[float]) -> dict[str, Any]:
    """One side of a paired row: group latency p50/p95 (ms, nearest rank) and groups/s
    (the median of the runs)."""
    ordered = sorted(x * 1000 for x in latencies)
    return {
        "groups": len(ordered),
        "p50_ms": statistics.median(ordered),
        "p95_ms": nearest_rank(ordered, 0.95),
        "groups_per_s": statistics.median(rates),
        "runs": rates,
    }


async def alternate(
    bodies: dict[str, Callable[[], Awaitable[float]]], per_run: int, runs: int
) -> dict[str, Any]:
    """Two bodies (each runs one group and returns its latency in seconds) one group of
    each in turn, the first to go alternating, so both see the same load on a shared
    machine; ``runs`` runs of ``per_run`` groups a side. Per run, groups/s of each side
    (its groups ÷ the time spent in it); the ratio is the first side's over the second's,
    the median of the per-run ratios with their range."""
    names = list(bodies)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    i = 0
    for _ in range(runs):
        spent = dict.fromkeys(names, 0.0)
        for _ in range(per_run):
            for name in names[i % 2 :] + names[: i % 2]:
                latency = await bodies[name]()
                spent[name] += latency
                latencies[name].append(latency)
            i += 1
        for name in names:
            rates[name].append(per_run / spent[name])
    ratios = [a / b for a, b in zip(rates[names[0]], rates[names[1]], strict=True)]
    return {
        **{name: latency_summary(latencies[name], rates[name]) for name in names},
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
    }


def paired_table(title: str, rows: list[dict[str, Any]]) -> str:
    """The table of rows made by ``alternate`` of an ``effecthost`` and a ``native`` side."""
    header = (
        f"{'workload':<15}{'groups':>7}{'eh p50 ms':>11}{'eh p95 ms':>11}{'eh groups/s':>13}"
        f"{'nat p50 ms':>12}{'nat p95 ms':>12}{'nat groups/s':>14}{'ratio':>7}{'(range)':>13}"
    )
    lines = ruled(title, header)
    for row in rows:
        ours, theirs = row["effecthost"], row["native"]
        span = f"({row['ratio_min']:.2f}–{row['ratio_max']:.2f})"
        lines.append(
            f"{row['workload']:<15}{ours['groups']:>7}{ours['p50_ms']:>11.1f}"
            f"{ours['p95_ms']:>11.1f}{ours['groups_per_s']:>13.2f}{theirs['p50_ms']:>12.1f}"
            f"{theirs['p95_ms']:>12.1f}{theirs['groups_per_s']:>14.2f}{row['ratio']:>7.2f}"
            f"{span:>13}"
        )
    return "\n".join(lines)
