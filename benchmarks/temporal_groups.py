"""Temporal tier benchmark: effecthost groups against a native Temporal workflow.

    .venv/bin/python benchmarks/temporal_groups.py [--rounds 60] [--runs 3] [--out FILE]
        [--against native|unclaimed]

Starts a dev server (the tier's ``DevServer``, on free ports) unless
``EFFECTHOST_TEMPORAL_ADDRESS`` is set (then that server and
``EFFECTHOST_TEMPORAL_NAMESPACE``, default ``default``), and two worker processes (this
file with ``--worker``):

- ``effecthost``: the tier's one-call worker (``create_worker``) with a trivial ``work``
  tool; the caller runs ``race`` (declaring ``CANCEL``) and ``all_`` through
  ``TemporalEffectHost``: one group workflow, an activity per child, each rank read by
  a query or a waiting update, then a close;
- ``native``: a plain workflow starting the same trivial activity per child and waiting
  with ``workflow.wait(FIRST_COMPLETED)`` (the loser cancelled with ``TRY_CANCEL``) or
  ``asyncio.gather``; the caller runs it with ``execute_workflow``.

For a 2-child race and a 50-child all it measures, one group at a time from one caller
(effecthost and native rounds interleaved, in ``--runs`` runs), group latency p50/p95
and groups/s of both, and the ratio (effecthost groups/s ÷ native groups/s: the median of
the per-run ratios, with their range). ``--against unclaimed`` compares effecthost with
itself without the replay-key claim of each open (R-6: the open path of the release
before it), rounds alternating in one run, instead of with the native workflow. Prints
a table and writes JSON (``--out``, default benchmarks/results/temporal.json, or
temporal_unclaimed.json against ``unclaimed``). Every process it starts is stopped, even on
error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from _bench import RESULTS, WORK, alternate, echo_tools, machine, paired_table, run

WORKLOADS = (("race", 2), ("all", 50))
START_TO_CLOSE = timedelta(hours=24)  # the group workflow's default for its children
WARM_UP = 2


# -- the native baseline (registered by the ``--worker native`` process) ---------------


@activity.defn(name="BenchWork")
async def native_work(arg: Any) -> Any:
    return arg


@workflow.defn(name="BenchNativeGroup")
class NativeGroup:
    """The same children as an effecthost group, without the group."""

    @workflow.run
    async def run(self, op: str, n: int) -> Any:
        tasks = [
            workflow.start_activity(
                native_work,
                i,
                start_to_close_timeout=START_TO_CLOSE,
                cancellation_type=ActivityCancellationType.TRY_CANCEL,
            )
            for i in range(n)
        ]
        if op == "race":
            done, _ = await workflow.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            # The winner in position order among those done (never the set's order), as
            # the group's watchers rank them; the losers are cancelled like a CANCEL close.
            winner = next(task for task in tasks if task in done)
            for task in tasks:
                if task is not winner and not task.done():
                    task.cancel()
            return winner.result()
        return await asyncio.gather(*tasks)


WIDE_START_TO_CLOSE = timedelta(seconds=60)
"""A wide native fan-out's activities: an activity task a starved worker loses (seen at
load 13) is retried after this long, as the tier's heartbeat timeout retries its children,
instead of holding the fan-out for ``START_TO_CLOSE``."""

NATIVE_SHARD = 1000
"""Activities per native workflow run: one run holds at most 2,000 pending activities,
so a wider native fan-out runs in child workflows of this many (what Temporal
recommends for fan-outs past one run's limits), as the tier's shards do."""


@workflow.defn(name="BenchNativeWide")
class NativeWide:
    """A native fan-out of ``n`` trivial activities gathered in one workflow, or, wider
    than ``shard``, in child workflows of ``shard`` activities each, gathered in turn."""

    @workflow.run
    async def run(self, n: int, shard: int = NATIVE_SHARD) -> list[Any]:
        if n <= shard:
            return await asyncio.gather(
                *(
                    workflow.start_activity(
                        native_work, i, start_to_close_timeout=WIDE_START_TO_CLOSE
                    )
                    for i in range(n)
                )
            )
        base = workflow.info().workflow_id
        parts = await asyncio.gather(
            *(
                workflow.execute_child_workflow(
                    NativeWideSlice.run, args=[lo, min(n, lo + shard)], id=f"{base}-{lo}"
                )
                for lo in range(0, n, shard)
            )
        )
        return [value for part in parts for value in part]


@workflow.defn(name="BenchNativeWideSlice")
class NativeWideSlice:
    """One child workflow of a wide native fan-out: activities ``lo``..``hi - 1``."""

    @workflow.run
    async def run(self, lo: int, hi: int) -> list[Any]:
        return await asyncio.gather(
            *(
                workflow.start_activity(native_work, i, start_to_close_timeout=WIDE_START_TO_CLOSE)
                for i in range(lo, hi)
            )
        )


# -- worker processes ------------------------------------------------------------------


def bench_tools() -> Any:
    return echo_tools()


async def serve_native(address: str, namespace: str, task_queue: str) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(address, namespace=namespace)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[NativeGroup, NativeWide, NativeWideSlice],
        activities=[native_work],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with worker:
        print("ready", flush=True)
        await stop.wait()


def run_worker(kind: str, address: str, namespace: str, task_queue: str) -> None:
    if kind == "effecthost":
        from effecthost.hosts.temporal.worker import serve

        asyncio.run(serve(address, namespace, task_queue, bench_tools()))
    else:
        asyncio.run(serve_native(address, namespace, task_queue))


def bench_worker(kind: str, address: str, namespace: str, task_queue: str, log: Path) -> Any:
    """The tier's ``WorkerProcess`` (start on ``ready``, SIGTERM/SIGKILL), running this
    file's ``--worker`` mode instead of the conformance resolver."""
    from effecthost.hosts.temporal.testing import WorkerProcess

    process = WorkerProcess(address, namespace, task_queue, log.parent, log)
    process.argv = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
    process.argv += process.connection
    return process


def _unclaimed() -> type:
    from effecthost.contract import EffectGroup
    from effecthost.hosts.temporal import TemporalEffectHost

    class Unclaimed(TemporalEffectHost):
        """The controller without the replay-key claim of each open (R-6)."""

        async def _claim(self, group: EffectGroup) -> list[tuple[str, str]]:
            return []

    return Unclaimed


# -- measuring -------------------------------------------------------------------------


async def measure(
    bodies: dict[str, Callable[[], Awaitable[Any]]], rounds: int, runs: int
) -> dict[str, Any]:
    """Each body ``rounds`` times, interleaved (the first to go alternates), so both see
    the same load on a shared machine, in ``runs`` runs; per run, groups/s of each body
    (its groups ÷ the time spent in it). The ratio is the first body's over the second's,
    the median of the per-run ratios with their range."""
    names = list(bodies)
    for _ in range(WARM_UP):
        for name in names:
            await bodies[name]()

    async def timed(body: Callable[[], Awaitable[Any]]) -> float:
        t0 = time.perf_counter()
        await body()
        return time.perf_counter() - t0

    timed_bodies = {name: functools.partial(timed, bodies[name]) for name in names}
    return await alternate(timed_bodies, max(1, rounds // runs), runs)


def rounds_for(n: int, rounds: int, runs: int) -> int:
    return rounds if n == 2 else max(runs, rounds // 4)


async def run_benchmark(
    rounds: int, runs: int, work_dir: Path, against: str = "native"
) -> dict[str, Any]:
    from effecthost.combinators import Scope, all_, race, tool
    from effecthost.contract import LoserPolicy
    from effecthost.hosts.temporal import TemporalEffectHost
    from effecthost.hosts.temporal.testing import (
        ADDRESS_ENV,
        NAMESPACE_ENV,
        DevServer,
        connect,
    )

    Unclaimed = _unclaimed()
    namespace = os.environ.get(NAMESPACE_ENV, "default")
    address = os.environ.get(ADDRESS_ENV, "")
    server = None if address else DevServer(work_dir / "temporal")
    suffix = uuid.uuid4().hex[:8]
    queues = {"effecthost": f"bench-effecthost-{suffix}", "native": f"bench-native-{suffix}"}
    workers: list[Any] = []
    host: TemporalEffectHost | None = None
    try:
        if server is not None:
            address = server.address
            client = await server.start()
        else:
            client = await connect(address, namespace)
        for kind, queue in queues.items():
            worker = bench_worker(kind, address, namespace, queue, work_dir / f"{kind}.log")
            workers.append(worker)
            await worker.start()
        host = TemporalEffectHost(client, queues["effecthost"], bench_tools())
        unclaimed = Unclaimed(client, queues["effecthost"], bench_tools())
        scope = Scope(scope_id=f"bench-{suffix}")

        rows = []
        for op, n in WORKLOADS:
            calls = [tool(WORK, i) for i in range(n)]

            async def grouped(op: str = op, calls: list[Any] = calls) -> Any:
                assert host is not None
                if op == "race":
                    return await race(host, scope, calls, disposition=LoserPolicy.CANCEL)
                return await all_(host, scope, calls)

            async def native(op: str = op, n: int = n) -> Any:
                return await client.execute_workflow(
                    NativeGroup.run,
                    args=[op, n],
                    id=f"bench-native-{uuid.uuid4().hex}",
                    task_queue=queues["native"],
                )

            async def without_claims(op: str = op, calls: list[Any] = calls) -> Any:
                if op == "race":
                    return await race(unclaimed, scope, calls, disposition=LoserPolicy.CANCEL)
                return await all_(unclaimed, scope, calls)

            other = native if against == "native" else without_claims
            measured = await measure(
                {"effecthost": grouped, "native": other}, rounds_for(n, rounds, runs), runs
            )
            rows.append({"workload": f"{n}-child {op}", **measured})
    except Exception:
        dump_logs(work_dir)
        raise
    finally:
        if host is not None:
            await host.aclose()
        for worker in reversed(workers):
            with contextlib.suppress(Exception):
                await worker.terminate()
        if server is not None:
            await server.stop()
    return {
        "against": against,
        "temporal": cli_version() if server is not None else f"external server {address}",
        **machine(),
        "rows": rows,
    }


def cli_version() -> str:
    from effecthost.hosts.temporal.testing import temporal_cli

    answer = subprocess.run(
        [temporal_cli(), "--version"], capture_output=True, text=True, check=False
    )
    return answer.stdout.strip().removeprefix("temporal version ")


def dump_logs(work_dir: Path) -> None:
    """On failure: the tail of each process's log, before the work directory goes."""
    for log in sorted(work_dir.rglob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-20:]
        if lines:
            print(f"--- {log.name} (last {len(lines)} lines)", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)


async def main(rounds: int, runs: int, work_dir: Path, against: str) -> dict[str, Any]:
    # A SIGTERM cancels the run like Ctrl-C does, so the cleanup above still runs.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run_benchmark(rounds, runs, work_dir, against)


# -- report ----------------------------------------------------------------------------


def table(document: dict[str, Any]) -> str:
    other = document.get("against", "native")
    what = "native workflow" if other == "native" else "effecthost without replay-key claims"
    title = (
        f"temporal={document['temporal']}  python={document['python']}  "
        f"cpus={document['cpus']}  (eh = effecthost, nat = {what})"
    )
    return paired_table(title, document["rows"])


def cli() -> None:
    from effecthost.hosts.temporal import release_temporal_runtime

    try:
        _cli()
    finally:
        release_temporal_runtime()  # caller and worker processes: SDK threads stop here


def _cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=60, help="groups per workload (the all runs a quarter)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per workload (ratio range)")
    parser.add_argument("--out", type=Path, help="the JSON file to write")
    parser.add_argument(
        "--against",
        choices=["native", "unclaimed"],
        default="native",
        help="compare with the native workflow, or with effecthost without R-6's claims",
    )
    parser.add_argument("--worker", choices=["effecthost", "native"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--task-queue", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        run_worker(options.worker, options.address, options.namespace, options.task_queue)
        return
    name = "temporal.json" if options.against == "native" else "temporal_unclaimed.json"
    try:
        run(
            lambda tmp: main(options.rounds, options.runs, tmp, options.against),
            options.out or RESULTS / name,
            table,
        )
    except asyncio.CancelledError:
        raise SystemExit("interrupted; the server and workers were stopped") from None


if __name__ == "__main__":
    cli()
