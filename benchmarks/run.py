"""Run the benchmarks and gather their results in one JSON document.

    ./dev bench [--only NAME,...] [--skip NAME,...] [--quick] [--out FILE] [--list]

Each benchmark is a script of this directory, run in its own process (each also runs
alone; see its docstring) with ``--out`` pointing into the results directory; this file
collects what each wrote, with its exit status and wall time, into one document
(default ``benchmarks/results/bench.json``), which ``benchmarks/plot.py`` draws.
``--quick`` runs each with fewer rounds and smaller groups: a check that everything runs,
not figures to quote. Each entry records the machine's load average before and after its
benchmark (a shared machine moves the figures). A benchmark that fails is recorded as
failed and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _bench import machine, write_json

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    quick: list[str] = field(default_factory=list)
    default: bool = True
    args: list[str] = field(default_factory=list)  # always passed (a script's mode)

    @property
    def path(self) -> Path:
        return HERE / self.script


SUITE = [
    Bench("memory", "memory_groups.py", ["--groups", "300"]),
    Bench(
        "host-cpu",
        "host_cpu.py",
        ["--groups", "300", "--rounds", "1", "--wide", "1000"],
        args=["--sql", "sqlite,postgres"],
    ),
    Bench(
        "sql",
        "sql_groups.py",
        ["--seconds", "1.5", "--callers", "1,16", "--big", "300", "--fsync", "on"],
    ),
    Bench("sql-wake", "sql_wake.py", ["--samples", "10"]),
    Bench("wide", "wide_groups.py", ["--quick"]),
    Bench(
        "wide-local",
        "wide_groups.py",
        ["--quick"],
        default=False,
        args=["--tiers", "memory,sqlite,postgres"],
    ),
    Bench("restate", "restate_groups.py", ["--groups", "9", "--runs", "3"]),
    Bench("restate-wide", "restate_wide.py", ["--widths", "100,300"]),
    Bench("temporal", "temporal_groups.py", ["--rounds", "12", "--runs", "3"]),
    Bench("temporal-wide", "temporal_wide.py", ["--widths", "100", "--rounds", "1"]),
    Bench(
        "restate-wide-native",
        "restate_wide.py",
        ["--widths", "100,300"],
        default=False,
        args=["--widths", "1000,10000", "--rounds", "3"],
    ),
    Bench(
        "temporal-wide-native",
        "temporal_wide.py",
        ["--widths", "100,300", "--rounds", "1"],
        default=False,
        args=["--native", "--widths", "1000,10000", "--rounds", "3", "--shard-sizes", "default"],
    ),
    Bench("ceilings", "sql_ceilings.py", ["--seconds", "1.5", "--big", "300"], default=False),
    Bench("sealing", "sql_sealing.py", default=False),
    Bench("restate-count", "restate_wide.py", default=False, args=["--count"]),
    Bench(
        "restate-race-profile",
        "restate_wide.py",
        default=False,
        args=["--race-profile", "60"],
    ),
    Bench("temporal-claims", "temporal_replay_claims.py", ["--rounds", "5"], default=False),
    Bench("otel-cost", "otel_cost.py", ["--groups", "300", "--rounds", "3"], default=False),
]


def selected(only: list[str], skip: list[str]) -> list[Bench]:
    names = {b.name for b in SUITE}
    unknown = sorted(set(only + skip) - names)
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)} (see --list)")
    chosen = [b for b in SUITE if (b.name in only if only else b.default)]
    return [b for b in chosen if b.name not in skip]


def run_one(bench: Bench, quick: bool, results: Path, timeout: float | None) -> dict[str, Any]:
    if not bench.path.exists():
        return {"status": "missing", "script": bench.script}
    out = results / f"{bench.name}.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(bench.path), *bench.args, "--out", str(out)]
    if quick:
        argv += bench.quick
    print(f"=== {bench.name}: {' '.join(argv[1:])}", flush=True)
    started = time.perf_counter()
    entry: dict[str, Any] = {
        "script": bench.script,
        "argv": argv[2:],
        "loadavg_before": os.getloadavg(),
    }
    try:
        code = subprocess.run(argv, cwd=HERE.parent, timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        code = None
    entry["wall_s"] = round(time.perf_counter() - started, 1)
    entry["loadavg_after"] = os.getloadavg()
    entry["status"] = "ok" if code == 0 else ("timeout" if code is None else f"exit {code}")
    if out.exists():
        entry["result"] = json.loads(out.read_text())
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names (see --list)")
    parser.add_argument("--skip", default="", help="comma-separated names to leave out")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller groups")
    parser.add_argument("--timeout", type=float, help="seconds per benchmark (default: none)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bench.json")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    options = parser.parse_args()
    if options.list:
        for b in SUITE:
            note = "" if b.default else "not by default"
            print(f"{b.name:<16}{' '.join([b.script, *b.args]):<34}{note}")
        return
    split = [s for s in options.only.split(",") if s], [s for s in options.skip.split(",") if s]
    benches = selected(*split)
    results = options.out.parent
    results.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        **machine(load="loadavg_before"),
        "quick": options.quick,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "benchmarks": {},
    }
    for bench in benches:
        entry = run_one(bench, options.quick, results, options.timeout)
        document["benchmarks"][bench.name] = entry
        write_json(options.out, document)  # partial results too
    document["loadavg_after"] = os.getloadavg()
    write_json(options.out, document)
    print()
    for name, entry in document["benchmarks"].items():
        print(f"{name:<16}{entry['status']:<10}{entry.get('wall_s', '-')!s:>8} s")
    print(f"wrote {options.out}; draw it with: .venv/bin/python benchmarks/plot.py {options.out}")
    if any(e["status"] != "ok" for e in document["benchmarks"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
