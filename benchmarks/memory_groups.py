"""Memory host benchmark: group throughput side by side with a native asyncio baseline.

    .venv/bin/python benchmarks/memory_groups.py [--groups 2000] [--width 8] [--runs 3]
        [--out FILE]

Each row runs the same workload through effecthost and natively with ``asyncio``
(``gather`` for ``all``, ``wait(FIRST_COMPLETED)`` for ``race``), one group of each in
turn (the first to go alternates), in ``--runs`` runs of ``--groups``/``--runs`` groups per
side. The ratio is effecthost throughput ÷ native throughput, the median of the per-run
ratios with their range, so the drift of a shared machine cancels out of the comparison.
Prints a table and writes JSON (default ``benchmarks/results/memory.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _bench import RESULTS, machine, percentile, ruled, run

from effecthost.combinators import Scope, all_, race, tool
from effecthost.contract import EffectController, ToolRegistry
from effecthost.hosts.memory import MemoryEffectHost


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool("echo")
    async def echo(value: Any) -> Any:
        await asyncio.sleep(0)
        return value

    return registry


async def _native_echo(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


_SCOPES = iter(range(1_000_000))


def _scope(name: str) -> Scope:
    """A fresh scope per workload: keys of closed groups are never reused."""
    return Scope(scope_id=f"bench-{name}-{next(_SCOPES)}")


Body = Callable[[int], Awaitable[None]]


async def _interleaved(groups: int, runs: int, grouped: Body, native: Body) -> dict[str, Any]:
    """``runs`` runs; in each, one group through each side in turn (who goes first
    alternates). Per run: groups/s of each side and their ratio."""
    per_run = max(1, groups // runs)
    eh_runs, nat_runs, samples = [], [], []
    i = 0
    for _ in range(runs):
        spent = {"eh": 0.0, "nat": 0.0}
        for _ in range(per_run):
            order = [("eh", grouped), ("nat", native)]
            for side, body in order if i % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                await body(i)
                elapsed = time.perf_counter() - started
                spent[side] += elapsed
                if side == "eh":
                    samples.append(elapsed)
            i += 1
        eh_runs.append(per_run / spent["eh"])
        nat_runs.append(per_run / spent["nat"])
    ratios = [a / b for a, b in zip(eh_runs, nat_runs, strict=True)]
    return {
        "groups": per_run * runs,
        "groups_per_s": statistics.median(eh_runs),
        "native_groups_per_s": statistics.median(nat_runs),
        "p50_ms": statistics.median(samples) * 1e3,
        "p99_ms": percentile(samples, 0.99) * 1e3,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "runs": [{"eh": a, "native": b} for a, b in zip(eh_runs, nat_runs, strict=True)],
    }


async def bench_all(ctl: EffectController, groups: int, width: int, runs: int) -> dict[str, Any]:
    scope = _scope("all")

    async def grouped(i: int) -> None:
        await all_(ctl, scope, [tool("echo", [i, j]) for j in range(width)])

    async def native(i: int) -> None:
        await asyncio.gather(*(_native_echo([i, j]) for j in range(width)))

    return _row(f"all() of {width}", width, await _interleaved(groups, runs, grouped, native))


async def bench_race(ctl: EffectController, groups: int, width: int, runs: int) -> dict[str, Any]:
    scope = _scope("race")

    async def grouped(i: int) -> None:
        await race(ctl, scope, [tool("echo", [i, j]) for j in range(width)])

    async def native(i: int) -> None:
        tasks = [asyncio.ensure_future(_native_echo([i, j])) for j in range(width)]
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*tasks)
        assert done

    return _row(f"race() of {width}", width, await _interleaved(groups, runs, grouped, native))


def _row(name: str, width: int, measured: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": name,
        "width": width,
        "children_per_s": measured["groups_per_s"] * width,
        "us_per_child": 1e6 / (measured["groups_per_s"] * width),
        **measured,
    }


def table(document: dict[str, Any]) -> str:
    header = (
        f"{'workload':<14}{'groups':>8}{'groups/s':>11}{'µs/child':>10}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'native/s':>11}{'ratio':>8}{'range':>14}"
    )
    lines = ruled(f"host=memory  python={document['python']}  cpus={document['cpus']}", header)
    for r in document["rows"]:
        span = f"{r['ratio_min']:.3f}–{r['ratio_max']:.3f}"
        lines.append(
            f"{r['workload']:<14}{r['groups']:>8}{r['groups_per_s']:>11.0f}"
            f"{r['us_per_child']:>10.1f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            f"{r['native_groups_per_s']:>11.0f}{r['ratio']:>8.3f}{span:>14}"
        )
    return "\n".join(lines)


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    ctl = MemoryEffectHost(_registry())
    await bench_all(ctl, min(100, args.groups), args.width, 1)  # warm-up
    return [
        await bench_all(ctl, args.groups, args.width, args.runs),
        await bench_race(ctl, args.groups, args.width, args.runs),
        await bench_race(ctl, args.groups, 2, args.runs),
    ]


async def document(args: argparse.Namespace) -> dict[str, Any]:
    return {"host": "memory", **machine(load=None), "rows": await measure(args)}


def main(args: argparse.Namespace) -> None:
    out = Path(args.out or RESULTS / "memory.json")
    run(lambda _tmp: document(args), out, table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000, help="groups per side")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="runs (ratio median and range)")
    parser.add_argument("--out")
    main(parser.parse_args())
