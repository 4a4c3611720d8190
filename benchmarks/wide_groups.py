"""Wide groups: µs per child and the caller's peak RSS at 100 / 1,000 / 10,000 children.

    .venv/bin/python benchmarks/wide_groups.py [--tiers memory,sqlite,postgres,restate,temporal]
        [--widths 100,1000,10000] [--rounds 3] [--timeout 900] [--quick] [--out FILE]

For each tier, one ``all_`` group of a trivial tool per child, opened, consumed and closed
by one caller. Every group runs in a fresh caller process (this file with ``--one``), so
its peak RSS is that group's alone: the caller resets its high-water mark
(``/proc/self/clear_refs``) after a 2-child warm-up group, runs the wide group, and
reports its wall time, its CPU time (``process_time``) and ``VmHWM``; each row records the
load average after it. µs per child = wall time ÷ children; CPU µs per child = the caller
process's CPU time ÷ children (on SQLite it includes the database's own work, which runs
in the caller; on the engine tiers it is the caller's share only); caller bytes per
child = (peak RSS − RSS before the group) ÷ children. The children of the engine tiers
run elsewhere (the Restate endpoint, the Temporal worker), so their caller RSS is the
caller's share only.

The tiers' processes are started once per tier, as the tier benchmarks start them: a
throwaway PostgreSQL with fsync on (``sql_groups.py``; or ``EFFECTHOST_POSTGRES_DSN``), a
SQLite file per group, a restate-server and the endpoint of ``restate_groups.py``, a
Temporal dev server and the effecthost worker of ``temporal_groups.py``. Local tiers run
``--rounds`` groups per width; the engines run ``--rounds`` up to 1,000 children and one
group above. A group the tier refuses (a typed ``EffectHostError``) is reported as
``refused`` with the error; one that fails otherwise as ``error``; one past ``--timeout``
as ``timeout`` (the caller process is killed, and wider groups of that tier are skipped).
``--quick``: widths 100 and 1,000, one round. Prints a table and writes JSON (``--out``,
default benchmarks/results/wide.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from _bench import RESULTS, WORK, echo_tools, machine, postgres, run

TIERS = ("memory", "sqlite", "postgres", "restate", "temporal")
ENGINES = ("restate", "temporal")
SCRIPT = str(Path(__file__).resolve())
RESULT = "WIDE-RESULT "


# -- the caller process (``--one``) ----------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextlib.asynccontextmanager
async def _controller(tier: str, conf: dict[str, Any]) -> AsyncIterator[Any]:
    tools = echo_tools()
    if tier == "memory":
        from effecthost.hosts.memory import MemoryEffectHost

        yield MemoryEffectHost(tools)
    elif tier in ("sqlite", "postgres"):
        from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore

        schema = f"ehwide_{secrets.token_hex(4)}"
        store: Any = (
            SqliteStore(Path(conf["dir"]) / f"{schema}.sqlite3")
            if tier == "sqlite"
            else PostgresStore(conf["dsn"], schema=schema)
        )
        host = SqlEffectHost(store, tools)
        await host.start()
        try:
            yield host
        finally:
            await host.aclose()
            if tier == "postgres":
                import asyncpg  # type: ignore[import-untyped]

                conn = await asyncpg.connect(conf["dsn"])
                try:
                    await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                finally:
                    await conn.close()
    elif tier == "restate":
        from effecthost.hosts.restate import RestateController

        ctl = RestateController(conf["ingress"], conf["admin"], tools, owner="wide-bench")
        try:
            yield ctl
        finally:
            await ctl.aclose()
    elif tier == "temporal":
        from effecthost.hosts.temporal import TemporalEffectHost
        from effecthost.hosts.temporal.testing import connect

        client = await connect(conf["address"], conf["namespace"])
        temporal = TemporalEffectHost(client, conf["queue"], tools)
        try:
            yield temporal
        finally:
            await temporal.aclose()
    else:
        raise SystemExit(f"unknown tier {tier!r}")


async def one(tier: str, width: int, conf: dict[str, Any]) -> dict[str, Any]:
    """One group of ``width`` children in this process: wall time and peak RSS."""
    from effecthost.combinators import Scope, all_, tool
    from effecthost.contract import EffectHostError

    async with _controller(tier, conf) as ctl:
        scope = Scope(scope_id=f"wide-{secrets.token_hex(6)}")
        await all_(ctl, scope, [tool(WORK, i) for i in range(2)])  # warm-up
        calls = [tool(WORK, i) for i in range(width)]
        gc.collect()
        reset = _reset_peak()
        before = _status_kb("VmRSS")
        started, cpu = time.perf_counter(), time.process_time()
        try:
            results = await all_(ctl, scope, calls)
        except EffectHostError as error:
            return {"status": "refused", "error": f"{type(error).__name__}: {error}"[:400]}
        except Exception as error:
            return {"status": "error", "error": f"{type(error).__name__}: {error}"[:400]}
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert len(results) == width
        return {
            "status": "ok",
            "elapsed_s": elapsed,
            "cpu_s": cpu,
            "rss_before_kb": before,
            "rss_peak_kb": _status_kb("VmHWM"),
            "peak_reset": reset,
        }


def run_one(tier: str, width: int, conf: dict[str, Any]) -> None:
    try:
        answer = asyncio.run(one(tier, width, conf))
    finally:
        if tier == "temporal":
            from effecthost.hosts.temporal import release_temporal_runtime

            release_temporal_runtime()
    print(RESULT + json.dumps(answer), flush=True)


# -- the tiers' processes --------------------------------------------------------------


@contextlib.asynccontextmanager
async def tier_env(tier: str, work_dir: Path) -> AsyncIterator[dict[str, Any]]:
    """What a caller process of ``tier`` needs to reach it, its processes started."""
    if tier == "memory":
        yield {}
    elif tier == "sqlite":
        yield {"dir": str(work_dir)}
    elif tier == "postgres":
        with postgres() as dsn:
            yield {"dsn": dsn}
    elif tier == "restate":
        from restate_groups import bench_restate

        async with bench_restate(work_dir) as local:
            yield {"ingress": local.ingress_url, "admin": local.admin_url}
    elif tier == "temporal":
        from temporal_groups import bench_worker

        from effecthost.hosts.temporal.testing import DevServer

        server = DevServer(work_dir / "temporal")
        worker = None
        try:
            await server.start()
            queue = f"wide-{secrets.token_hex(4)}"
            worker = bench_worker(
                "effecthost", server.address, "default", queue, work_dir / "w.log"
            )
            await worker.start()
            yield {"address": server.address, "namespace": "default", "queue": queue}
        finally:
            if worker is not None:
                with contextlib.suppress(Exception):
                    await worker.terminate()
            await server.stop()
    else:
        raise SystemExit(f"unknown tier {tier!r}")


async def caller(tier: str, width: int, conf: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One group in a fresh caller process; ``timeout`` kills it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--one",
        tier,
        "--width",
        str(width),
        "--conf",
        json.dumps(conf),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return {"status": "timeout", "error": f"no answer within {timeout:.0f} s"}
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(RESULT):
            return dict(json.loads(line[len(RESULT) :]))
    return {"status": "error", "error": f"caller process exited {process.returncode}"}


def rounds_for(tier: str, width: int, rounds: int) -> int:
    return 1 if tier in ENGINES and width > 1000 else rounds


def summarize(tier: str, width: int, answers: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"tier": tier, "width": width, "answers": answers}
    ok = [a for a in answers if a["status"] == "ok"]
    failed = [a for a in answers if a["status"] != "ok"]
    row["status"] = failed[0]["status"] if failed else "ok"
    if failed:
        row["error"] = failed[0].get("error", "")
    if ok:
        us = [a["elapsed_s"] * 1e6 / width for a in ok]
        grown = [(a["rss_peak_kb"] - a["rss_before_kb"]) * 1024 / width for a in ok]
        cpu = [a["cpu_s"] * 1e6 / width for a in ok]
        row.update(
            rounds=len(ok),
            us_per_child=statistics.median(us),
            us_min=min(us),
            us_max=max(us),
            cpu_us_per_child=statistics.median(cpu),
            rss_peak_kb=statistics.median(a["rss_peak_kb"] for a in ok),
            bytes_per_child=statistics.median(grown),
        )
    return row


async def main(options: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    document: dict[str, Any] = {
        **machine(),
        "widths": options.widths,
        "rows": rows,
    }
    for tier in options.tiers:
        print(f"  {tier}: starting", file=sys.stderr, flush=True)
        (work_dir / tier).mkdir()
        try:
            async with tier_env(tier, work_dir / tier) as conf:
                gave_up = None
                for width in options.widths:
                    if gave_up is not None:
                        rows.append(
                            {"tier": tier, "width": width, "status": "skipped", "error": gave_up}
                        )
                        continue
                    answers: list[dict[str, Any]] = []
                    for _ in range(rounds_for(tier, width, options.rounds)):
                        answers.append(await caller(tier, width, conf, options.timeout))
                        if answers[-1]["status"] != "ok":
                            break
                    row = summarize(tier, width, answers)
                    row["loadavg"] = os.getloadavg()
                    rows.append(row)
                    if row["status"] == "timeout":
                        gave_up = f"{width} children timed out"
                    print(f"  {tier} x{width}: {_cell(row)}", file=sys.stderr, flush=True)
        except Exception as error:  # a tier whose processes do not start
            rows.append({"tier": tier, "width": None, "status": "error", "error": repr(error)})
    return document


def _cell(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error', '')}"
    return f"{row['us_per_child']:.0f} µs/child ({row['us_min']:.0f}–{row['us_max']:.0f})"


def table(document: dict[str, Any]) -> str:
    header = (
        f"{'tier':<10}{'children':>9}{'rounds':>7}{'µs/child':>10}{'(range)':>16}"
        f"{'CPU µs/child':>14}{'peak RSS MB':>13}{'B/child':>9}"
    )
    lines = [
        f"python={document['python']}  cpus={document['cpus']}  load="
        + " ".join(f"{x:.1f}" for x in document["loadavg"]),
        header,
        "-" * len(header),
    ]
    for row in document["rows"]:
        width = "-" if row["width"] is None else f"{row['width']:,}"
        if row["status"] != "ok" and "us_per_child" not in row:
            lines.append(
                f"{row['tier']:<10}{width:>9}  {row['status']}: {row.get('error', '')}"[:160]
            )
            continue
        span = f"({row['us_min']:.0f}–{row['us_max']:.0f})"
        lines.append(
            f"{row['tier']:<10}{width:>9}{row['rounds']:>7}{row['us_per_child']:>10.0f}"
            f"{span:>16}{row['cpu_us_per_child']:>14.0f}"
            f"{row['rss_peak_kb'] / 1024:>13.1f}{row['bytes_per_child']:>9.0f}"
            + ("" if row["status"] == "ok" else f"  then {row['status']}")
        )
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--widths", default="100,1000,10000")
    parser.add_argument("--rounds", type=int, default=3, help="groups per width (median, range)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per group")
    parser.add_argument("--quick", action="store_true", help="widths 100 and 1,000, one round")
    parser.add_argument("--out", type=Path, default=RESULTS / "wide.json")
    parser.add_argument("--one", choices=TIERS, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--conf", default="{}", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        run_one(options.one, options.width, json.loads(options.conf))
        return
    if options.quick:
        options.widths, options.rounds = "100,1000", 1
    options.tiers = options.tiers.split(",")
    unknown = set(options.tiers) - set(TIERS)
    if unknown:
        parser.error(f"unknown tier(s): {', '.join(sorted(unknown))}")
    options.widths = [int(w) for w in options.widths.split(",")]
    try:
        run(lambda tmp: main(options, tmp), options.out, table, prefix="effecthost-wide-")
    finally:
        if "temporal" in options.tiers:
            from effecthost.hosts.temporal import release_temporal_runtime

            release_temporal_runtime()


if __name__ == "__main__":
    cli()
