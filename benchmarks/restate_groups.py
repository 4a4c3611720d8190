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
import functools
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from _bench import RESULTS, WORK, alternate, echo_tools, machine, paired_table, run

SCRIPT = str(Path(__file__).resolve())


def endpoint_services(name: str = "Bench", *, counts: bool = False) -> list[Any]:
    """Handlers ``{name}/effecthost`` and ``{name}/native``: a race or an all of ``n``
    calls of ``{name}Work/run``, through ``HandlerController`` or the SDK's own
    ``select``/``gather``. With ``counts`` an all answers how many calls it made, not
    their results, and the native all awaits its calls one by one: ``restate.gather`` is
    quadratic in the SDK (10,000 futures spent ~190 s at full CPU after every child had
    finished), so for wide groups the fastest native fan-out awaits each call in turn."""
    import restate

    from effecthost.combinators import Scope, all_, race, tool
    from effecthost.hosts.restate import HandlerController, build_services

    tools = echo_tools()
    worker = restate.Service(f"{name}Work")

    @worker.handler()
    async def run(ctx: restate.Context, arg: Any) -> Any:
        return await ctx.run("work", lambda: arg)

    bench = restate.Service(name)

    @bench.handler()
    async def effecthost(ctx: restate.Context, req: dict[str, Any]) -> Any:
        controller = HandlerController(ctx, tools, owner="bench")
        scope = Scope(scope_id=ctx.request().id)
        calls = [tool(WORK, i) for i in range(int(req["n"]))]
        if req["op"] == "race":
            return await race(controller, scope, calls)
        results = await all_(controller, scope, calls)
        return len(results) if counts else results

    @bench.handler()
    async def native(ctx: restate.Context, req: dict[str, Any]) -> Any:
        futures = [ctx.service_call(run, i) for i in range(int(req["n"]))]
        if req["op"] == "race":
            done = await restate.select(**{f"c{i}": f for i, f in enumerate(futures)})
            return done[1]
        if counts:
            return len([await f for f in futures])
        await restate.gather(*futures)
        return [await f for f in futures]

    return [*build_services(tools), worker, bench]


def serve(bind: str, name: str = "Bench", *, counts: bool = False) -> None:
    import restate

    from effecthost.hosts.restate import serve as serve_app

    asyncio.run(serve_app(restate.app(endpoint_services(name, counts=counts)), bind))


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

    async with httpx.AsyncClient(timeout=600.0) as client:
        sides = ("effecthost", "native")
        for side in sides:
            await call(client, ingress, side, op, n)  # warm-up
        bodies = {side: functools.partial(call, client, ingress, side, op, n) for side in sides}
        measured = await alternate(bodies, max(1, groups // runs), runs)
    return {"workload": f"{n}-child {op}", **measured}


@contextlib.asynccontextmanager
async def bench_restate(work_dir: Path, script: str = SCRIPT) -> AsyncIterator[Any]:
    """A restate-server and the endpoint of ``script`` (this file's by default) run with
    ``--serve``, registered; yields the tier's ``LocalRestate`` (``ingress_url``,
    ``admin_url``, the processes as ``server`` and ``endpoint``). Both are stopped on exit."""
    from effecthost.hosts.restate.testing import LocalRestate

    local = LocalRestate(work_dir, "unused:unused")
    try:
        await local.start_app([sys.executable, script, "--serve"], "bench-endpoint")
        yield local
    finally:
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
        **machine(),
        "rows": rows,
    }


def server_version() -> str:
    from effecthost.hosts.restate.testing import find_server_binary

    answer = subprocess.run(
        [find_server_binary(), "--version"], capture_output=True, text=True, check=False
    )
    return answer.stdout.strip() or "unknown"


def table(document: dict[str, Any]) -> str:
    title = (
        f"restate={document['restate']}  python={document['python']}  cpus={document['cpus']}"
        "  (eh = effecthost, nat = native handler)"
    )
    return paired_table(title, document["rows"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", metavar="BIND")
    parser.add_argument(
        "--groups", type=int, default=60, help="2-child races per side (the all runs a fifth)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per workload (ratio range)")
    parser.add_argument("--out", type=Path, default=RESULTS / "restate.json")
    options = parser.parse_args()
    if options.serve:
        serve(options.serve)
    else:
        run(lambda _tmp: main(options.groups, options.runs), options.out, table)
