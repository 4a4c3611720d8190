"""Restate tier benchmark: effecthost groups against a native Restate baseline.

    .venv/bin/python benchmarks/restate_groups.py [--groups 60] [--runs 3] [--out FILE]

Starts a local restate-server (see scripts/install-restate.sh) and an endpoint process
(this file with ``--serve``), then, for a 2-child race and a 50-child all, measures group
latency p50/p95 and groups/s, one group of each side in turn (``--runs`` runs; the ratio,
effecthost groups/s ÷ native groups/s, is the median of the per-run ratios, with their
range), of

- ``effecthost``: a handler running ``race``/``all_`` through ``HandlerController`` (each
  child an invocation, ranks by the group object);
- ``native``: a handler doing the same calls with ``restate.select`` / ``restate.gather``.

Prints a table and writes JSON (``--out``, default benchmarks/results/restate.json).
The server and endpoint are stopped on exit, even on error.
"""

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

WORK = "bench.work"
SCRIPT = str(Path(__file__).resolve())


def endpoint_services() -> list[Any]:
    import restate

    from effecthost.combinators import Scope, all_, race, tool
    from effecthost.contract import ToolRegistry
    from effecthost.hosts.restate import HandlerController, build_services

    tools = ToolRegistry()

    @tools.tool(WORK)
    async def work(arg: Any) -> Any:
        return arg

    worker = restate.Service("BenchWork")

    @worker.handler()
    async def run(ctx: restate.Context, arg: Any) -> Any:
        return await ctx.run("work", lambda: arg)

    bench = restate.Service("Bench")

    @bench.handler()
    async def effecthost(ctx: restate.Context, req: dict[str, Any]) -> Any:
        controller = HandlerController(ctx, tools, owner="bench")
        scope = Scope(scope_id=ctx.request().id)
        calls = [tool(WORK, i) for i in range(int(req["n"]))]
        if req["op"] == "race":
            return await race(controller, scope, calls)
        return await all_(controller, scope, calls)

    @bench.handler()
    async def native(ctx: restate.Context, req: dict[str, Any]) -> Any:
        futures = [ctx.service_call(run, i) for i in range(int(req["n"]))]
        if req["op"] == "race":
            done = await restate.select(**{f"c{i}": f for i, f in enumerate(futures)})
            return done[1]
        await restate.gather(*futures)
        return [await f for f in futures]

    return [*build_services(tools), worker, bench]


def serve(bind: str) -> None:
    import restate

    from effecthost.hosts.restate import serve as serve_app

    asyncio.run(serve_app(restate.app(endpoint_services()), bind))


async def call(client: Any, ingress: str, handler: str, op: str, n: int) -> float:
    """One group through ``handler``; its latency in seconds."""
    t0 = time.perf_counter()
    answer = await client.post(f"{ingress}/Bench/{handler}", json={"op": op, "n": n})
    answer.raise_for_status()
    return time.perf_counter() - t0


async def measure(ingress: str, op: str, n: int, groups: int, runs: int) -> dict[str, Any]:
    """``runs`` runs of ``groups`` ÷ ``runs`` groups per side, one group of each side in
    turn (the first to go alternates), so both see the same load; per run, groups/s of
    each side (groups ÷ the time spent in that side) and their ratio."""
    import httpx

    sides = ("effecthost", "native")
    per_run = max(1, groups // runs)
    latencies: dict[str, list[float]] = {side: [] for side in sides}
    rates: dict[str, list[float]] = {side: [] for side in sides}
    async with httpx.AsyncClient(timeout=600.0) as client:
        for side in sides:
            await call(client, ingress, side, op, n)  # warm-up
        i = 0
        for _ in range(runs):
            spent = dict.fromkeys(sides, 0.0)
            for _ in range(per_run):
                for side in sides[i % 2 :] + sides[: i % 2]:
                    latency = await call(client, ingress, side, op, n)
                    spent[side] += latency
                    latencies[side].append(latency)
                i += 1
            for side in sides:
                rates[side].append(per_run / spent[side])
    ratios = [a / b for a, b in zip(rates["effecthost"], rates["native"], strict=True)]
    return {
        "workload": f"{n}-child {op}",
        **{side: _summary(latencies[side], rates[side]) for side in sides},
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
    }


def _summary(latencies: list[float], rates: list[float]) -> dict[str, Any]:
    ordered = sorted(x * 1000 for x in latencies)
    return {
        "groups": len(ordered),
        "p50_ms": statistics.median(ordered),
        "p95_ms": ordered[max(0, math.ceil(len(ordered) * 0.95) - 1)],
        "groups_per_s": statistics.median(rates),
        "runs": rates,
    }


@contextlib.asynccontextmanager
async def bench_restate(work_dir: Path) -> AsyncIterator[Any]:
    """A restate-server and this file's endpoint (``--serve``), registered; yields the
    tier's ``LocalRestate`` (``ingress_url``, ``admin_url``). Both are stopped on exit."""
    from effecthost.hosts.restate import register_deployment
    from effecthost.hosts.restate.testing import LocalRestate, _spawn, _stop, _wait_until

    local = LocalRestate(work_dir, "unused:unused")
    await local.start_server()
    log = (work_dir / "bench-endpoint.log").open("ab")
    endpoint = None
    try:
        bind = f"127.0.0.1:{local.endpoint_port}"
        endpoint = _spawn([sys.executable, SCRIPT, "--serve", bind], log)

        async def up() -> bool:
            _, writer = await asyncio.open_connection("127.0.0.1", local.endpoint_port)
            writer.close()
            return True

        await _wait_until(up, "bench endpoint")
        await register_deployment(local.admin_url, local.endpoint_uri, force=True)
        yield local
    finally:
        _stop(endpoint, 9)
        log.close()
        await local.stop()


async def main(groups: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="effecthost-bench-") as tmp:
        async with bench_restate(Path(tmp)) as local:
            rows = []
            for op, n in (("race", 2), ("all", 50)):
                count = groups if n == 2 else max(runs, groups // 5)
                rows.append(await measure(local.ingress_url, op, n, count, runs))
    return {
        "restate": server_version(),
        "python": platform.python_version(),
        "cpus": os.cpu_count() or 0,
        "loadavg": os.getloadavg(),
        "rows": rows,
    }


def server_version() -> str:
    from effecthost.hosts.restate.testing import find_server_binary

    answer = subprocess.run(
        [find_server_binary(), "--version"], capture_output=True, text=True, check=False
    )
    return answer.stdout.strip() or "unknown"


def table(document: dict[str, Any]) -> str:
    header = (
        f"{'workload':<15}{'groups':>7}{'eh p50 ms':>11}{'eh p95 ms':>11}{'eh groups/s':>13}"
        f"{'nat p50 ms':>12}{'nat p95 ms':>12}{'nat groups/s':>14}{'ratio':>7}{'(range)':>13}"
    )
    lines = [
        f"restate={document['restate']}  python={document['python']}  cpus={document['cpus']}"
        "  (eh = effecthost, nat = native handler)",
        header,
        "-" * len(header),
    ]
    for row in document["rows"]:
        ours, theirs = row["effecthost"], row["native"]
        span = f"({row['ratio_min']:.2f}–{row['ratio_max']:.2f})"
        lines.append(
            f"{row['workload']:<15}{ours['groups']:>7}{ours['p50_ms']:>11.1f}"
            f"{ours['p95_ms']:>11.1f}{ours['groups_per_s']:>13.2f}{theirs['p50_ms']:>12.1f}"
            f"{theirs['p95_ms']:>12.1f}{theirs['groups_per_s']:>14.2f}{row['ratio']:>7.2f}"
            f"{span:>13}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", metavar="BIND")
    parser.add_argument(
        "--groups", type=int, default=60, help="2-child races per side (the all runs a fifth)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per workload (ratio range)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "restate.json"
    )
    options = parser.parse_args()
    if options.serve:
        serve(options.serve)
    else:
        started = time.perf_counter()
        document = asyncio.run(main(options.groups, options.runs))
        document["wall_s"] = round(time.perf_counter() - started, 1)
        print(table(document))
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {options.out} in {document['wall_s']} s")
