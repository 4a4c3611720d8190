"""SQL tier benchmark: settlement throughput with and without sealing, side by side.

    .venv/bin/python benchmarks/sql_sealing.py [--seconds 2] [--callers 4] [--big 500]
        [--rounds 3] [--substrates sqlite,postgres] [--out FILE]

Per substrate, in one run, the same host configuration twice: ``plain`` (no payload
policy, outcomes recorded as plain JSON, the default) and ``sealed``
(``PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore()))``: every outcome sealed with
AES-256-GCM, those above the 4 KiB inline threshold in the database's ``eh_payloads``
table). Rounds alternate plain and sealed so both see the same machine; the median round
is reported. Workloads (a trivial tool per child returning a value of the given size):

- ``2-child groups``: ``--callers`` callers open a 2-child group, read both ranks and close
  it (the group retires, its payload rows with it), for ``--seconds``; outcome ~100 B.
- ``N-child group``: one caller opens one ``--big``-child group and reads every rank;
  outcome ~100 B.
- ``N-child group, 8 KiB``: the same with 8 KiB outcomes, by reference when sealed.

Children/s counts settled-and-read children; ratio = sealed ÷ plain. Starts a throwaway
PostgreSQL (the tier's ``PostgresServer``) unless ``EFFECTHOST_POSTGRES_DSN`` is set;
servers and hosts are stopped in ``finally``. Writes JSON (``--out``, default
benchmarks/results/sql_sealing.json).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench import machine, postgres, substrate_options, work_group, write_json

from effecthost.contract import EffectGroup, ToolRegistry
from effecthost.hosts.sql import PostgresStore, SqlEffectHost, SqliteStore, Store
from effecthost.payloads import AesGcmSealer, InMemoryKeyStore, PayloadPolicy

_RUN = iter(range(1_000_000))


def _registry() -> ToolRegistry:
    async def work(size: Any) -> Any:
        return {"n": size, "pad": "v" * int(size)}

    return ToolRegistry({"work": work})


async def _consume(host: SqlEffectHost, group: EffectGroup) -> None:
    handle = await host.open_effect_group(group)
    while not handle.exhausted:
        await host.await_next_settlement(handle)
    await host.close_effect_group(handle)


async def small(host: SqlEffectHost, callers: int, seconds: float) -> float:
    run = next(_RUN)
    done = [0]
    stop = time.perf_counter() + seconds

    async def caller(c: int) -> None:
        i = 0
        while time.perf_counter() < stop:
            await _consume(host, work_group(f"s{run}:group:{c}-{i}:0", 2, lambda _: 100))
            done[0] += 2
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return done[0] / (time.perf_counter() - started)


async def big(host: SqlEffectHost, n: int, size: int) -> float:
    started = time.perf_counter()
    await _consume(host, work_group(f"b{next(_RUN)}:group:g:0", n, lambda _: size))
    return n / (time.perf_counter() - started)


def _policy(mode: str) -> PayloadPolicy | None:
    return PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore())) if mode == "sealed" else None


async def bench(
    db: str, make_store: Callable[[], Store], options: argparse.Namespace
) -> list[dict[str, Any]]:
    hosts = {
        mode: SqlEffectHost(make_store(), _registry(), payloads=_policy(mode))
        for mode in ("plain", "sealed")
    }
    workloads: dict[str, Callable[[SqlEffectHost], Any]] = {
        f"2-child groups, {options.callers} callers": lambda h: small(
            h, options.callers, options.seconds
        ),
        f"{options.big}-child group": lambda h: big(h, options.big, 100),
        f"{options.big}-child group, 8 KiB": lambda h: big(h, options.big, 8 * 1024),
    }
    rows = []
    try:
        for host in hosts.values():
            await host.start()
            await big(host, 50, 100)  # warm up
        for name, work in workloads.items():
            rates: dict[str, list[float]] = {"plain": [], "sealed": []}
            for _ in range(options.rounds):
                for mode, host in hosts.items():
                    rates[mode].append(await work(host))
            plain = statistics.median(rates["plain"])
            sealed = statistics.median(rates["sealed"])
            row = {
                "workload": name,
                "db": db,
                "plain_children_per_s": plain,
                "sealed_children_per_s": sealed,
                "ratio": sealed / plain,
            }
            print(
                f"{name:<28}{db:<10}{plain:>10.0f}{sealed:>12.0f}{sealed / plain:>8.2f}",
                flush=True,
            )
            rows.append(row)
    finally:
        for host in hosts.values():
            await host.aclose()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--big", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    substrate_options(parser, "sqlite,postgres")
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "sql_sealing.json")
    )
    options = parser.parse_args()
    substrates = options.substrates.split(",")
    document: dict[str, Any] = {**machine(sqlite=True, load=None), "rows": []}
    header = f"{'workload':<28}{'db':<10}{'plain/s':>10}{'sealed/s':>12}{'ratio':>8}"
    print(header + "\n" + "-" * len(header), flush=True)
    if "sqlite" in substrates:
        with tempfile.TemporaryDirectory(prefix="effecthost-bench-") as folder:
            path = Path(folder) / "bench.sqlite3"
            document["rows"] += await bench("sqlite", lambda: SqliteStore(path), options)
    if "postgres" in substrates:
        with postgres(fsync=not options.no_fsync) as dsn:
            schema = f"ehseal_{secrets.token_hex(4)}"
            document["rows"] += await bench(
                "postgres", lambda: PostgresStore(dsn, schema=schema), options
            )
    write_json(Path(options.out), document)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
