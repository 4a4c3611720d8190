"""Benchmarks: group throughput on a host, side by side with a native asyncio baseline.

    python benchmarks/run.py [--host memory] [--groups 2000] [--width 8] [--out FILE]

Prints a table and writes JSON (default ``benchmarks/results/<host>.json``). Each row
runs the same workload twice in one process — through effecthost and natively with
``asyncio`` — and reports the ratio, so machine noise cancels out of the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

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


def _controller(host: str) -> EffectController:
    if host == "memory":
        return MemoryEffectHost(_registry())
    raise SystemExit(f"unknown host {host!r}: this release benchmarks 'memory'")


_SCOPES = iter(range(1_000_000))


def _scope(name: str) -> Scope:
    """A fresh scope per workload: keys of closed groups are never reused."""
    return Scope(scope_id=f"bench-{name}-{next(_SCOPES)}")


async def _timed(rounds: int, body: Callable[[int], Awaitable[None]]) -> list[float]:
    samples = []
    for i in range(rounds):
        started = time.perf_counter()
        await body(i)
        samples.append(time.perf_counter() - started)
    return samples


async def bench_all(ctl: EffectController, groups: int, width: int) -> dict[str, Any]:
    scope = _scope("all")

    async def grouped(i: int) -> None:
        await all_(ctl, scope, [tool("echo", [i, j]) for j in range(width)])

    async def native(i: int) -> None:
        await asyncio.gather(*(_native_echo([i, j]) for j in range(width)))

    return _row(
        f"all() of {width}", await _timed(groups, grouped), await _timed(groups, native), width
    )


async def bench_race(ctl: EffectController, groups: int, width: int) -> dict[str, Any]:
    scope = _scope("race")

    async def grouped(i: int) -> None:
        await race(ctl, scope, [tool("echo", [i, j]) for j in range(width)])

    async def native(i: int) -> None:
        tasks = [asyncio.ensure_future(_native_echo([i, j])) for j in range(width)]
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*tasks)
        assert done

    return _row(
        f"race() of {width}", await _timed(groups, grouped), await _timed(groups, native), width
    )


def _row(name: str, grouped: list[float], native: list[float], width: int) -> dict[str, Any]:
    g_total, n_total = sum(grouped), sum(native)
    return {
        "workload": name,
        "groups": len(grouped),
        "children_per_s": len(grouped) * width / g_total,
        "groups_per_s": len(grouped) / g_total,
        "p50_ms": statistics.median(grouped) * 1e3,
        "p99_ms": _p99(grouped) * 1e3,
        "native_groups_per_s": len(native) / n_total,
        "native_p50_ms": statistics.median(native) * 1e3,
        "ratio_vs_native": (len(grouped) / g_total) / (len(native) / n_total),
    }


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'workload':<14}{'groups':>8}{'groups/s':>11}{'children/s':>12}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'native/s':>11}{'ratio':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['workload']:<14}{r['groups']:>8}{r['groups_per_s']:>11.0f}"
            f"{r['children_per_s']:>12.0f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            f"{r['native_groups_per_s']:>11.0f}{r['ratio_vs_native']:>8.3f}"
        )
    return "\n".join(lines)


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    ctl = _controller(args.host)
    await bench_all(ctl, min(100, args.groups), args.width)  # warm-up
    return [
        await bench_all(ctl, args.groups, args.width),
        await bench_race(ctl, args.groups, args.width),
        await bench_race(ctl, args.groups, 2),
    ]


def main(args: argparse.Namespace) -> None:
    rows = asyncio.run(measure(args))
    print(f"host={args.host}  python={platform.python_version()}  cpus={_cpus()}")
    print(_table(rows))
    out = Path(args.out or Path(__file__).parent / "results" / f"{args.host}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"host": args.host, "python": platform.python_version(), "rows": rows}
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="memory")
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--out")
    main(parser.parse_args())
