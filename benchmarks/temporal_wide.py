"""Temporal wide groups: µs per child of one ``all_`` group, by width and shard size.

    .venv/bin/python benchmarks/temporal_wide.py [--widths 100,1000] [--rounds 3]
        [--shard-sizes default,100] [--signal-intervals default,0] [--native]

Starts a dev server and the tier's worker (as ``temporal_groups.py`` does) and runs one
group at a time: ``all_`` over ``n`` trivial tool calls, through a controller per shard
size (``default``: a group up to ``SHARD_CHILDREN`` runs in one workflow, a wider one
in shards of ``WIDE_SHARD_CHILDREN``; a number ``s``: a group wider than ``s`` in shards
of ``s``; with ``--signal-intervals``, one controller per shard size and
``shard_signal_interval``), alternating which goes first each round. A group over one workflow input (about 4,000 of
these children) opens in chunks. Each row also gives the group's history event count (a
run may hold 51,200), its open time, and the CPU the dev server and the worker spent per
child (Linux ``/proc``; less noisy than wall time on a shared machine, and the server's
is most of the cost), the history events and workflow tasks per child over every run
the group made (its own and its shards'; the native side's parent and child runs), the
longest workflow task of those runs and their tasks timed out (start-to-close or, from a
busy worker's sticky queue, schedule-to-start) or failed, the worker's stall warnings
(a task past 5 s, the deadlock detector, a failed eviction), and how much the worker wrote to its log meanwhile (its stderr,
and its stdout, which the tier's ``WorkerProcess`` copies there after the ``ready`` line:
the SDK core's warnings go to stdout, and an unread pipe blocked the worker once they
passed about 64 KiB). Prints a table and writes JSON (``--out``, default
benchmarks/results/temporal_wide.json); the groups run so far are written after each
group (``partial``), so a run stopped midway (a stalled group) keeps them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import write_json
from temporal_groups import NATIVE_SHARD, WORK, NativeWide, bench_tools, bench_worker


def _cpu_seconds(pid: int | None) -> float:
    """User and system CPU of process ``pid`` (0 where ``/proc`` is not available)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


async def run(
    widths: list[int],
    rounds: int,
    work_dir: Path,
    shard_sizes: list[int | None],
    native: bool = False,
    intervals: list[float | None] | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    from effecthost.combinators import Scope, all_, tool
    from effecthost.hosts.temporal import (
        SHARD_CHILDREN,
        SHARD_SIGNAL_INTERVAL,
        WIDE_SHARD_CHILDREN,
        TemporalEffectHost,
    )
    from effecthost.hosts.temporal.testing import DevServer

    server = DevServer(work_dir / "temporal")
    queue = f"bench-wide-{uuid.uuid4().hex[:8]}"
    worker = native_worker = None
    rows = []
    groups: list[dict[str, Any]] = []  # one per group run, written as it ends
    try:
        client = await server.start()
        worker = bench_worker("effecthost", server.address, "default", queue, work_dir / "w.log")
        await worker.start()
        if native:
            native_worker = bench_worker(
                "native", server.address, "default", f"{queue}-native", work_dir / "n.log"
            )
            await native_worker.start()
        opened: list[tuple[str, float]] = []

        class Timed(TemporalEffectHost):
            async def open_effect_group(self, group: Any) -> Any:
                t0 = time.perf_counter()
                handle = await super().open_effect_group(group)
                opened.append((group.key, time.perf_counter() - t0))
                return handle

        gaps = intervals or [None]
        hosts = {
            (f"shards of {size}" if size else "default")
            + ("" if gap is None else f" ·{gap:g}s"): Timed(
                client,
                queue,
                bench_tools(),
                shard_size=size,
                shard_signal_interval=SHARD_SIGNAL_INTERVAL if gap is None else gap,
            )
            for size in shard_sizes
            for gap in gaps
        }
        server_pid = server.process.pid if server.process else None
        worker_pids: dict[str, int | None] = {
            name: worker.process.pid if worker.process else None for name in hosts
        }
        if native_worker is not None:
            worker_pids["native"] = native_worker.process.pid if native_worker.process else None
        scope = Scope(scope_id=f"wide-{uuid.uuid4().hex[:8]}")
        # Rounds outermost, so every width and controller sees the same load drift.
        cells = [(n, name) for n in widths for name in worker_pids]
        samples: dict[tuple[int, str], list[float]] = {cell: [] for cell in cells}
        opens: dict[tuple[int, str], list[float]] = {cell: [] for cell in cells}
        cpu: dict[tuple[int, str], list[tuple[float, float]]] = {cell: [] for cell in cells}
        events: dict[tuple[int, str], int] = {}
        runs: dict[tuple[int, str], list[tuple[int, int, int]]] = {cell: [] for cell in cells}
        loads: dict[tuple[int, str], list[float]] = {cell: [] for cell in cells}
        logged: dict[tuple[int, str], list[int]] = {cell: [] for cell in cells}
        warned: dict[tuple[int, str], list[dict[str, int]]] = {cell: [] for cell in cells}
        log = work_dir / "w.log"
        names = list(worker_pids)
        for i in range(rounds):
            for n in widths:
                calls = [tool(WORK, j) for j in range(n)]
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    pids = (server_pid, worker_pids[name])
                    c0 = [_cpu_seconds(pid) for pid in pids]
                    b0 = log.stat().st_size
                    t0 = time.perf_counter()
                    if name == "native":
                        key = f"bench-native-wide-{uuid.uuid4().hex}"
                        values = await client.execute_workflow(
                            NativeWide.run,
                            args=[n, NATIVE_SHARD],
                            id=key,
                            task_queue=f"{queue}-native",
                        )
                        open_time = 0.0
                    else:
                        values = await all_(hosts[name], scope, calls)
                        key, open_time = opened[-1]
                    samples[n, name].append(time.perf_counter() - t0)
                    c1 = [_cpu_seconds(pid) for pid in pids]
                    cpu[n, name].append((c1[0] - c0[0], c1[1] - c0[1]))
                    loads[n, name].append(os.getloadavg()[0])
                    logged[n, name].append(log.stat().st_size - b0)
                    warned[n, name].append(_log_counts(log, b0))
                    assert values == list(range(n))
                    opens[n, name].append(open_time)
                    history = await client.get_workflow_handle(key).fetch_history()
                    events[n, name] = len(history.events)
                    runs[n, name].append(await _history_counts(client, key, n, name))
                    print(
                        f"round {i + 1} {n:>7} children  {name:<18} "
                        f"{samples[n, name][-1] * 1e6 / n:>8.0f} µs/child  cpu/child server "
                        f"{cpu[n, name][-1][0] * 1e6 / n:.0f} µs worker "
                        f"{cpu[n, name][-1][1] * 1e6 / n:.0f} µs  history events/child "
                        f"{runs[n, name][-1][1] / n:.2f} workflow tasks/child "
                        f"{runs[n, name][-1][2] / n:.3f} ({runs[n, name][-1][0]} runs)  "
                        f"longest task {runs[n, name][-1][3]:.2f} s  tasks timed out/failed "
                        f"{runs[n, name][-1][4]}  worker {warned[n, name][-1]}  "
                        f"load {loads[n, name][-1]:.1f}",
                        flush=True,
                    )
                    groups.append(
                        {
                            "round": i + 1,
                            "children": n,
                            "controller": name,
                            "us_per_child": samples[n, name][-1] * 1e6 / n,
                            "server_cpu_us_per_child": cpu[n, name][-1][0] * 1e6 / n,
                            "worker_cpu_us_per_child": cpu[n, name][-1][1] * 1e6 / n,
                            "runs": runs[n, name][-1][0],
                            "history_events_per_child": runs[n, name][-1][1] / n,
                            "workflow_tasks_per_child": runs[n, name][-1][2] / n,
                            "longest_workflow_task_s": runs[n, name][-1][3],
                            "workflow_tasks_timed_out_or_failed": runs[n, name][-1][4],
                            "worker_warnings": warned[n, name][-1],
                            "load_average": loads[n, name][-1],
                        }
                    )
                    if out is not None:  # a run stopped later keeps the groups it ran
                        write_json(out, {"partial": True, "groups": groups})
        for n, name in cells:
            per_child = [t * 1e6 / n for t in samples[n, name]]
            server_cpu = statistics.median(c[0] for c in cpu[n, name]) * 1e6 / n
            worker_cpu = statistics.median(c[1] for c in cpu[n, name]) * 1e6 / n
            load = [min(loads[n, name]), max(loads[n, name])]
            rows.append(
                {
                    "children": n,
                    "controller": name,
                    "us_per_child_median": statistics.median(per_child),
                    "us_per_child_range": [min(per_child), max(per_child)],
                    "us_per_child": per_child,
                    "open_seconds_median": statistics.median(opens[n, name]),
                    "group_history_events": events[n, name],
                    "runs": [r[0] for r in runs[n, name]],
                    "history_events_per_child": [r[1] / n for r in runs[n, name]],
                    "workflow_tasks_per_child": [r[2] / n for r in runs[n, name]],
                    "server_cpu_us_per_child": [c[0] * 1e6 / n for c in cpu[n, name]],
                    "worker_cpu_us_per_child": [c[1] * 1e6 / n for c in cpu[n, name]],
                    "load_average": loads[n, name],
                    "server_cpu_us_per_child_median": server_cpu,
                    "worker_cpu_us_per_child_median": worker_cpu,
                    "load_average_range": load,
                    "worker_log_bytes": logged[n, name],
                    "longest_workflow_task_s": [r[3] for r in runs[n, name]],
                    "workflow_tasks_timed_out_or_failed": [r[4] for r in runs[n, name]],
                    "worker_warnings": warned[n, name],
                }
            )
            print(
                f"{n:>7} children  {name:<18} µs/child median "
                f"{statistics.median(per_child):>8.0f}  range "
                f"{min(per_child):.0f}–{max(per_child):.0f}  open "
                f"{statistics.median(opens[n, name]):.2f} s  history {events[n, name]} events  "
                f"cpu/child server {server_cpu:.0f} µs worker {worker_cpu:.0f} µs  "
                f"load {load[0]:.1f}–{load[1]:.1f}  worker log +{max(logged[n, name])} bytes",
                flush=True,
            )
        if native:
            rows.extend(_ratios(rows, rounds, samples, widths, list(hosts)))
        for host in hosts.values():
            await host.aclose()
    finally:
        if native_worker is not None:
            await native_worker.terminate()
        if worker is not None:
            await worker.terminate()
        await server.stop()
    return {
        "native_shard": NATIVE_SHARD if native else None,
        "rounds": rounds,
        "shard_children": SHARD_CHILDREN,
        "wide_shard_children": WIDE_SHARD_CHILDREN,
        "rows": rows,
        "groups": groups,
    }


def _log_counts(log: Path, since: int) -> dict[str, int]:
    """The worker's warnings that mark a stalling run, in what it logged since ``since``:
    a workflow task past 5 s, the deadlock detector, an eviction that left tasks."""
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return {
        "task_over_5s": text.count("TMPRL1104"),
        "deadlock": text.count("TMPRL1101"),
        "failed_eviction": text.count("Eviction processed, but"),
    }


async def _history_counts(client: Any, key: str, n: int, name: str) -> tuple[Any, ...]:
    """Runs, history events and completed workflow tasks over the group's run and its
    shards' (the native side: its parent run and its child runs of ``NATIVE_SHARD``);
    then the longest workflow task (started to completed, seconds) of any of them, and
    their tasks timed out (start-to-close, schedule-to-start) and failed."""
    from temporalio.api.enums.v1 import EventType, TimeoutType
    from temporalio.service import RPCError

    from effecthost.hosts.temporal._shared import shard_id

    if name == "native":
        ids = [key] + (
            [f"{key}-{lo}" for lo in range(0, n, NATIVE_SHARD)] if n > NATIVE_SHARD else []
        )
    else:
        ids = [key]
        while True:
            candidate = shard_id(key, len(ids) - 1)
            try:
                await client.get_workflow_handle(candidate).describe()
            except RPCError:
                break
            ids.append(candidate)
    events = tasks = 0
    longest = 0.0
    bad = {"start_to_close": 0, "schedule_to_start": 0, "failed": 0}
    for run_id in ids:
        history = await client.get_workflow_handle(run_id).fetch_history()
        events += len(history.events)
        started = None
        for e in history.events:
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                started = e.event_time.ToDatetime()
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                tasks += 1
                if started is not None:
                    took = (e.event_time.ToDatetime() - started).total_seconds()
                    longest = max(longest, took)
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                bad["failed"] += 1
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                kind = e.workflow_task_timed_out_event_attributes.timeout_type
                sticky = kind == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
                bad["schedule_to_start" if sticky else "start_to_close"] += 1
    return len(ids), events, tasks, longest, bad


def _ratios(
    rows: list[dict[str, Any]],
    rounds: int,
    samples: dict[tuple[int, str], list[float]],
    widths: list[int],
    controllers: list[str],
) -> list[dict[str, Any]]:
    """Per controller and width, effecthost ÷ native speed round by round (each round ran
    both sides in turn), and per round the cost per child at the widest width ÷ at the
    narrowest, effecthost's and native's."""
    out = []
    lo, hi = min(widths), max(widths)
    for name in controllers:
        for n in widths:
            ratios = [
                nat / eh for eh, nat in zip(samples[n, name], samples[n, "native"], strict=True)
            ]
            out.append(
                {
                    "children": n,
                    "controller": name,
                    "ratio_vs_native": ratios,
                    "ratio_vs_native_median": statistics.median(ratios),
                }
            )
            print(
                f"{n:>7} children  {name:<18} effecthost ÷ native speed median "
                f"{statistics.median(ratios):.2f}  per round "
                + " ".join(f"{r:.2f}" for r in ratios),
                flush=True,
            )
        if lo != hi:
            for side in (name, "native"):
                growth = [
                    (samples[hi, side][r] / hi) / (samples[lo, side][r] / lo) for r in range(rounds)
                ]
                out.append({"controller": side, "per_child_growth": growth, "widths": [lo, hi]})
                print(
                    f"{side:<18} µs/child at {hi} ÷ at {lo} per round "
                    + " ".join(f"{g:.2f}" for g in growth),
                    flush=True,
                )
    return out


def cli() -> None:
    from effecthost.hosts.temporal import release_temporal_runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--shard-sizes",
        default="default,100",
        help="controllers to compare, by shard size (default: the controller's default)",
    )
    parser.add_argument(
        "--signal-intervals",
        default=None,
        help="one controller per shard size and shard_signal_interval in seconds "
        "(default: the controller's default)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="alternate with a native fan-out: one workflow of N activities gathered, "
        f"in child workflows of {NATIVE_SHARD} when wider",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "temporal_wide.json"
    )
    options = parser.parse_args()
    widths = [int(w) for w in options.widths.split(",")]
    sizes = [None if s == "default" else int(s) for s in options.shard_sizes.split(",")]
    gaps = (
        [None if g == "default" else float(g) for g in options.signal_intervals.split(",")]
        if options.signal_intervals
        else None
    )
    try:
        with tempfile.TemporaryDirectory(prefix="effecthost-wide-") as tmp:
            document = asyncio.run(
                run(widths, options.rounds, Path(tmp), sizes, options.native, gaps, options.out)
            )
    finally:
        release_temporal_runtime()
    write_json(options.out, document)
    print(f"wrote {options.out}")


if __name__ == "__main__":
    cli()
