"""Restate tier: cost per child against group width, and what one group costs the engine.

    python benchmarks/restate_wide.py [--widths 100,1000,10000] [--rounds 1] [--out FILE]
    python benchmarks/restate_wide.py --count       # invocations and journal entries

Starts a local restate-server and an endpoint process (this file with ``--serve``). Width
mode runs one ``all`` group of N trivial tool children per round inside a handler
(``HandlerController``) and reports milliseconds per group, microseconds per child, and
the CPU the server and the endpoint spent per child (steadier on a shared machine).
Count mode runs one 2-child race and one 50-child ``all`` through effecthost and natively
(``restate.select`` / each call awaited in turn) and counts, from the admin SQL views, the
invocations each started and the journal entries they wrote.

Writes JSON (``--out``, default benchmarks/results/restate_wide.json).
"""

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import write_json
from restate_groups import bench_restate, serve


async def _query(client: Any, admin: str, sql: str) -> list[dict[str, Any]]:
    answer = await client.post(
        f"{admin}/query", json={"query": sql}, headers={"Accept": "application/json"}
    )
    answer.raise_for_status()
    rows: list[dict[str, Any]] = answer.json().get("rows", [])
    return rows


async def _settled(client: Any, admin: str) -> tuple[int, int]:
    """Invocations and journal entries so far, once nothing is left running."""
    for _ in range(600):
        rows = await _query(
            client,
            admin,
            "SELECT count(*) AS n FROM sys_invocation WHERE status != 'completed' "
            "AND target_service_name != 'EffecthostOwner'",  # a live owner's lapse waits
        )
        if rows[0]["n"] == 0:
            break
        await asyncio.sleep(0.05)  # a bounded poll for the engine to go idle, not ordering
    invocations = (await _query(client, admin, "SELECT count(*) AS n FROM sys_invocation"))[0]
    journal = (await _query(client, admin, "SELECT count(*) AS n FROM sys_journal"))[0]
    return int(invocations["n"]), int(journal["n"])


async def count(ingress: str, admin: str) -> list[dict[str, Any]]:
    """Invocations and journal entries of one group, per handler and workload. Journals
    of completed invocations are kept for the retention period, so the difference of
    the views before and after is the group's own cost."""
    import httpx

    rows = []
    async with httpx.AsyncClient(timeout=300.0) as client:
        for op, n in (("race", 2), ("all", 50)):
            for handler in ("native", "effecthost"):
                before = await _settled(client, admin)
                answer = await client.post(f"{ingress}/Wide/{handler}", json={"op": op, "n": n})
                answer.raise_for_status()
                after = await _settled(client, admin)
                rows.append(
                    {
                        "workload": f"{op} of {n}",
                        "handler": handler,
                        "invocations": after[0] - before[0],
                        "journal_entries": after[1] - before[1],
                    }
                )
    return rows


async def race_profile(ingress: str, admin: str, pids: list[int], rounds: int) -> dict[str, Any]:
    """Where a 2-child race's time goes: ``rounds`` races of each handler in turn, with
    the wall time and the CPU the server and the endpoint (which also runs the calling
    handler) spent per race; then one race of each alone, with its invocations and the
    timestamps the engine recorded for each (milliseconds from the first's creation)."""
    import httpx

    per: dict[str, dict[str, list[float]]] = {
        h: {"wall_ms": [], "server_cpu_ms": [], "endpoint_cpu_ms": []}
        for h in ("native", "effecthost")
    }
    paths: dict[str, list[dict[str, Any]]] = {}
    async with httpx.AsyncClient(timeout=300.0) as client:
        for i in range(rounds + 2):  # two warm-up rounds
            for handler in ("native", "effecthost")[i % 2 :] + ("native", "effecthost")[: i % 2]:
                t0, split0 = time.perf_counter(), [cpu_seconds([pid]) for pid in pids]
                answer = await client.post(f"{ingress}/Wide/{handler}", json={"op": "race", "n": 2})
                answer.raise_for_status()
                if i < 2:
                    continue
                per[handler]["wall_ms"].append((time.perf_counter() - t0) * 1e3)
                server, endpoint = (
                    cpu_seconds([pid]) - c for pid, c in zip(pids, split0, strict=True)
                )
                per[handler]["server_cpu_ms"].append(server * 1e3)
                per[handler]["endpoint_cpu_ms"].append(endpoint * 1e3)
        for handler in ("native", "effecthost"):
            before = await _settled(client, admin)
            (
                await client.post(f"{ingress}/Wide/{handler}", json={"op": "race", "n": 2})
            ).raise_for_status()
            after = await _settled(client, admin)
            rows = await _query(
                client,
                admin,
                "SELECT * FROM sys_invocation ORDER BY created_at DESC "
                f"LIMIT {after[0] - before[0]}",
            )
            stamps = [
                {
                    "target": row.get("target"),
                    **{k: v for k, v in row.items() if k.endswith("_at") and v},
                }
                for row in rows
            ]
            paths[handler] = stamps
    summary = {h: {k: sum(v) / len(v) for k, v in figures.items()} for h, figures in per.items()}
    for h, figures in summary.items():
        print(
            f"race of 2  {h:<11} wall {figures['wall_ms']:.1f} ms  CPU per race: server "
            f"{figures['server_cpu_ms']:.1f} ms endpoint {figures['endpoint_cpu_ms']:.1f} ms"
            f"  load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return {"rounds": rounds, "mean": summary, "samples": per, "invocations": paths}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes so far (Linux ``/proc``): on a shared machine
    the CPU a group costs is steadier than its wall time."""
    import os

    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def troubles(client: Any, admin: str, server_log: Path) -> tuple[int, int]:
    """Invocations so far that were retried (a back-off: a failed attempt, a broken
    connection), and the warning or error lines the server logged so far."""
    rows = await _query(
        client, admin, "SELECT count(*) AS n FROM sys_invocation WHERE retry_count > 0"
    )
    return int(rows[0]["n"]), warnings_logged(server_log)


def warnings_logged(server_log: Path) -> int:
    text = server_log.read_text(errors="replace") if server_log.exists() else ""
    return sum(1 for line in text.splitlines() if " WARN " in line or " ERROR " in line)


async def widths(
    ingress: str,
    admin: str,
    server_log: Path,
    sizes: list[int],
    rounds: int,
    pids: list[int],
) -> list[dict[str, Any]]:
    """Per round and width, the same fan-out natively and through effecthost, in turn;
    with the back-offs and the server's warnings each run caused (the issue asks for
    none in a 10,000-child run)."""
    import httpx

    rows = []
    async with httpx.AsyncClient(timeout=3600.0) as client:
        for handler in ("native", "effecthost"):
            (
                await client.post(f"{ingress}/Wide/{handler}", json={"op": "all", "n": 4})
            ).raise_for_status()
        for _ in range(rounds):  # rounds alternate over the widths and the two sides
            for n in sizes:
                pair: dict[str, float] = {}
                for handler in ("native", "effecthost"):
                    t0, cpu0 = time.perf_counter(), cpu_seconds(pids)
                    split0 = [cpu_seconds([pid]) for pid in pids]
                    trouble0 = await troubles(client, admin, server_log)
                    answer = await client.post(
                        f"{ingress}/Wide/{handler}", json={"op": "all", "n": n}
                    )
                    answer.raise_for_status()
                    assert answer.json() == n, answer.text
                    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
                    server, endpoint = (
                        cpu_seconds([pid]) - before
                        for pid, before in zip(pids, split0, strict=True)
                    )
                    pair[handler] = elapsed
                    trouble = await troubles(client, admin, server_log)
                    retried, warned = (t - t0 for t, t0 in zip(trouble, trouble0, strict=True))
                    rows.append(
                        {
                            "handler": handler,
                            "children": n,
                            "ms": elapsed * 1e3,
                            "us_per_child": elapsed * 1e6 / n,
                            "cpu_us_per_child": cpu * 1e6 / n,
                            "server_cpu_us_per_child": server * 1e6 / n,
                            "endpoint_cpu_us_per_child": endpoint * 1e6 / n,
                            "load": os.getloadavg()[0],
                            "retried_invocations": retried,
                            "server_warnings": warned,
                        }
                    )
                    print(
                        f"{handler:<11}{n:>7} children {elapsed * 1e3:>10.0f} ms"
                        f" {elapsed * 1e6 / n:>9.0f} µs/child {cpu * 1e6 / n:>9.0f} µs CPU/child"
                        f" (server {server * 1e6 / n:.0f} + endpoint {endpoint * 1e6 / n:.0f})"
                        f" load {os.getloadavg()[0]:.1f} retried {retried} warnings {warned}",
                        flush=True,
                    )
                print(
                    f"{'ratio':<11}{n:>7} children  effecthost ÷ native speed"
                    f" {pair['native'] / pair['effecthost']:.2f}",
                    flush=True,
                )
    return rows


async def main(options: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="effecthost-wide-") as tmp:
        async with bench_restate(Path(tmp), __file__) as local:
            if options.race_profile:
                assert local.server is not None and local.endpoint is not None
                return await race_profile(
                    local.ingress_url,
                    local.admin_url,
                    [local.server.pid, local.endpoint.pid],
                    options.race_profile,
                )
            if options.count:
                rows = await count(local.ingress_url, local.admin_url)
                for row in rows:
                    print(
                        f"{row['workload']:<12}{row['handler']:<12}"
                        f"{row['invocations']:>6} invocations {row['journal_entries']:>7} journal"
                    )
                return {"counts": rows}
            sizes = [int(w) for w in options.widths.split(",")]
            pids = [local.server.pid, local.endpoint.pid]
            server_log = Path(tmp) / "restate-server.log"
            rows = await widths(
                local.ingress_url, local.admin_url, server_log, sizes, options.rounds, pids
            )
            return {"widths": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", metavar="BIND")
    parser.add_argument("--widths", default="100,300,1000")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--count", action="store_true")
    parser.add_argument(
        "--race-profile",
        type=int,
        metavar="ROUNDS",
        help="CPU and wall per 2-child race, and one race's invocations with their times",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/restate_wide.json"))
    options = parser.parse_args()
    if options.serve:
        serve(options.serve, "Wide", counts=True)
    else:
        write_json(options.out, asyncio.run(main(options)))
