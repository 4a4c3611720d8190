"""Restate tier benchmark: effecthost groups against a native Restate baseline.

Starts a local restate-server (see scripts/install-restate.sh) and an endpoint process
(this file with ``--serve``), then, for a 2-child race and a 50-child all, measures group
latency p50/p95 and groups/s of

- ``effecthost``: a handler running ``race``/``all_`` through ``HandlerController`` (each
  child an invocation, ranks by the group object);
- ``native``: a handler doing the same calls with ``restate.select`` / ``restate.gather``.

Prints a table and writes JSON (``--out``, default benchmarks/results/restate.json).
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORK = "bench.work"


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


async def measure(ingress: str, handler: str, op: str, n: int, groups: int) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=120.0) as client:
        started = time.perf_counter()
        for _ in range(groups):
            t0 = time.perf_counter()
            answer = await client.post(f"{ingress}/Bench/{handler}", json={"op": op, "n": n})
            answer.raise_for_status()
            latencies.append((time.perf_counter() - t0) * 1000)
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "handler": handler,
        "workload": f"{op} of {n}",
        "groups": groups,
        "p50_ms": statistics.median(latencies),
        "p95_ms": latencies[max(0, int(len(latencies) * 0.95) - 1)],
        "groups_per_s": groups / elapsed,
    }


def _open_log(path: Path) -> Any:
    return path.open("ab")


async def main(groups: int) -> list[dict[str, Any]]:
    from effecthost.hosts.restate import register_deployment
    from effecthost.hosts.restate.testing import LocalRestate, _spawn, _stop, _wait_until

    with tempfile.TemporaryDirectory(prefix="effecthost-bench-") as tmp:
        local = LocalRestate(Path(tmp), "unused:unused")
        await local.start_server()
        log = _open_log(Path(tmp) / "bench-endpoint.log")
        bind = f"127.0.0.1:{local.endpoint_port}"
        endpoint = _spawn([sys.executable, __file__, "--serve", bind], log)
        try:

            async def up() -> bool:
                _, writer = await asyncio.open_connection("127.0.0.1", local.endpoint_port)
                writer.close()
                return True

            await _wait_until(up, "bench endpoint")
            await register_deployment(local.admin_url, local.endpoint_uri, force=True)
            rows = []
            for op, n in (("race", 2), ("all", 50)):
                count = groups if n == 2 else max(5, groups // 5)
                for handler in ("native", "effecthost"):
                    await measure(local.ingress_url, handler, op, n, 2)  # warm-up
                    rows.append(await measure(local.ingress_url, handler, op, n, count))
        finally:
            _stop(endpoint, 9)
            log.close()
            await local.stop()
    return rows


def report(rows: list[dict[str, Any]], out: Path) -> None:
    print(f"{'workload':<12}{'handler':<12}{'groups':>7}{'p50 ms':>9}{'p95 ms':>9}{'groups/s':>10}")
    for row in rows:
        print(
            f"{row['workload']:<12}{row['handler']:<12}{row['groups']:>7}"
            f"{row['p50_ms']:>9.1f}{row['p95_ms']:>9.1f}{row['groups_per_s']:>10.2f}"
        )
    for native, ours in zip(rows[::2], rows[1::2], strict=True):
        ratio = ours["groups_per_s"] / native["groups_per_s"]
        print(f"{ours['workload']}: effecthost/native throughput ratio {ratio:.2f}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", metavar="BIND")
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/restate.json"))
    options = parser.parse_args()
    if options.serve:
        serve(options.serve)
    else:
        report(asyncio.run(main(options.groups)), options.out)
