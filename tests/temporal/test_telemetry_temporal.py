"""Issue 23 on the Temporal tier: the caller's group span, the child spans the worker
records and the tools' own spans form one trace, linked through Temporal's headers by
``temporalio.contrib.opentelemetry``'s interceptor: given on the client (the worker
inherits it), or added by the host and the worker themselves when telemetry is on."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from otel_support import (
    SPANS_FILE,
    assert_child_ranks,
    child_spans,
    collected,
    expected_shape,
    registry,
    run_program,
    shape,
    work,
)
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from effecthost.contract import ToolRegistry
from effecthost.hosts.temporal import TemporalEffectHost, create_worker
from effecthost.hosts.temporal.testing import DevServer, WorkerProcess

from ._support import require_cli


@pytest.mark.timeout(120)
def test_issue23_one_trace_from_caller_through_worker(tmp_path: Path) -> None:
    """Issue 23: on Temporal the program gives the same span tree as on memory and SQL:
    the worker's child spans and their tools' spans hang under the caller's group span."""
    require_cli()
    asyncio.run(_program(tmp_path))


async def _program(root: Path) -> None:
    server = DevServer(root / "temporal")
    await server.start()
    try:
        with collected() as seen:
            tracer = seen.provider.get_tracer("temporalio")
            client = await Client.connect(server.address, interceptors=[TracingInterceptor(tracer)])
            queue = f"otel-{uuid.uuid4().hex[:8]}"
            registry = ToolRegistry({"work": work})
            worker = create_worker(client, queue, registry)
            async with worker:
                host = TemporalEffectHost(client, queue, registry)
                key = f"otel:temporal:{uuid.uuid4().hex[:8]}"
                try:
                    assert await run_program(host, key) == [0, 1, 2]
                finally:
                    await host.aclose()
            spans = seen.finished()
            assert shape(spans, key) == expected_shape()
            assert_child_ranks(spans, key)
            children = child_spans(spans, key)
            assert all(c.attributes.get("effecthost.attempt") == 1 for c in children)
    finally:
        await server.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("width", "shard_size"), [(3, None), (5, 2)], ids=["run", "shards"])
def test_issue23_one_trace_across_a_worker_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int, shard_size: int | None
) -> None:
    """Issue 23: the worker runs in its own process, its client connected without any
    interceptor: with telemetry on, the host and the worker add Temporal's tracing
    interceptor themselves, and the worker process's child spans (and their tools' spans)
    hang under the caller's group span, each child span with the rank the worker's group
    workflow assigned it; also when shard workflows run the children."""
    require_cli()
    spans_file = tmp_path / "worker-spans.jsonl"
    monkeypatch.setenv(SPANS_FILE, str(spans_file))
    tests = str(Path(__file__).parents[1])
    paths = [tests, os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    asyncio.run(_across(tmp_path, spans_file, width, shard_size))


async def _across(root: Path, spans_file: Path, width: int, shard_size: int | None) -> None:
    server = DevServer(root / "temporal")
    client = await server.start()
    queue = f"otel-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(server.address, "default", queue, root, root / "worker.log")
    at = worker.argv.index("--resolver")
    worker.argv[at + 1 : at + 4] = ["otel_support:registry"]
    key = f"otel:temporal:{uuid.uuid4().hex[:8]}"
    try:
        with collected() as seen:
            await worker.start()
            host = TemporalEffectHost(client, queue, registry, shard_size=shard_size)
            try:
                assert await run_program(host, key, width) == list(range(width))
            finally:
                await host.aclose()
                # stopped before its spans are read: an activity's own span ends after
                # the settlement it recorded reached the caller
                await worker.terminate()
            spans = seen.finished(spans_file)
            assert shape(spans, key) == expected_shape(width)
            assert len(child_spans(seen.finished(), key)) == 0  # all of them from the worker
            assert_child_ranks(spans, key, width)
    finally:
        await server.stop()
