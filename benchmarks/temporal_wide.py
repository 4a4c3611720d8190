"""Temporal wide groups: µs per child of one ``all_`` group, by width and shard size.

    .venv/bin/python benchmarks/temporal_wide.py [--widths 100,1000] [--rounds 3]

Starts a dev server and the tier's worker (as ``temporal_groups.py`` does) and runs one
group at a time: ``all_`` over ``n`` trivial tool calls, through a controller with the
default shard size (a group up to ``SHARD_CHILDREN`` runs in one workflow) and one with
shards of 100 children (the path of wider groups). A group over one workflow input
(about 4,000 of these children) opens in chunks. Each row also gives the group's history
event count (a run may hold 51,200) and its open time. Prints a table and writes JSON
(``--out``, default benchmarks/results/temporal_wide.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from temporal_groups import WORK, bench_tools, bench_worker


async def run(widths: list[int], rounds: int, work_dir: Path) -> dict[str, Any]:
    from effecthost.combinators import Scope, all_, tool
    from effecthost.hosts.temporal import SHARD_CHILDREN, TemporalEffectHost
    from effecthost.hosts.temporal.testing import DevServer

    server = DevServer(work_dir / "temporal")
    queue = f"bench-wide-{uuid.uuid4().hex[:8]}"
    worker = None
    rows = []
    try:
        client = await server.start()
        worker = bench_worker("effecthost", server.address, "default", queue, work_dir / "w.log")
        await worker.start()
        opened: list[tuple[str, float]] = []

        class Timed(TemporalEffectHost):
            async def open_effect_group(self, group: Any) -> Any:
                t0 = time.perf_counter()
                handle = await super().open_effect_group(group)
                opened.append((group.key, time.perf_counter() - t0))
                return handle

        hosts = {
            f"shards of {SHARD_CHILDREN}": Timed(client, queue, bench_tools()),
            "shards of 100": Timed(client, queue, bench_tools(), shard_size=100),
        }
        scope = Scope(scope_id=f"wide-{uuid.uuid4().hex[:8]}")
        for n in widths:
            calls = [tool(WORK, i) for i in range(n)]
            samples: dict[str, list[float]] = {name: [] for name in hosts}
            opens: dict[str, list[float]] = {name: [] for name in hosts}
            events: dict[str, int] = {}
            for i in range(rounds):
                names = list(hosts)
                for name in names[i % 2 :] + names[: i % 2]:
                    t0 = time.perf_counter()
                    values = await all_(hosts[name], scope, calls)
                    samples[name].append(time.perf_counter() - t0)
                    assert values == list(range(n))
                    key, open_time = opened[-1]
                    opens[name].append(open_time)
                    history = await client.get_workflow_handle(key).fetch_history()
                    events[name] = len(history.events)
            for name, times in samples.items():
                per_child = [t * 1e6 / n for t in times]
                rows.append(
                    {
                        "children": n,
                        "controller": name,
                        "us_per_child_median": statistics.median(per_child),
                        "us_per_child_range": [min(per_child), max(per_child)],
                        "open_seconds_median": statistics.median(opens[name]),
                        "group_history_events": events[name],
                    }
                )
                print(
                    f"{n:>7} children  {name:<18} µs/child median "
                    f"{statistics.median(per_child):>8.0f}  range "
                    f"{min(per_child):.0f}–{max(per_child):.0f}  open "
                    f"{statistics.median(opens[name]):.2f} s  history {events[name]} events",
                    flush=True,
                )
        for host in hosts.values():
            await host.aclose()
    finally:
        if worker is not None:
            await worker.terminate()
        await server.stop()
    return {"rounds": rounds, "rows": rows}


def cli() -> None:
    from effecthost.hosts.temporal import release_temporal_runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "temporal_wide.json"
    )
    options = parser.parse_args()
    widths = [int(w) for w in options.widths.split(",")]
    try:
        with tempfile.TemporaryDirectory(prefix="effecthost-wide-") as tmp:
            document = asyncio.run(run(widths, options.rounds, Path(tmp)))
    finally:
        release_temporal_runtime()
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    cli()
