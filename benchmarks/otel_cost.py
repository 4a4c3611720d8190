"""Host CPU per child with telemetry off, on without an SDK, and on with the SDK.

    .venv/bin/python benchmarks/otel_cost.py [--groups 2000] [--width 8] [--rounds 5]
        [--out FILE]

The workload of ``host_cpu.py`` (consecutive ``all_`` groups of ``--width`` trivial tool
calls on the memory host, process CPU time per child), in three modes measured in
alternating rounds so the machine's drift hits each alike:

- ``off``: :func:`effecthost.telemetry.instrument` never called (the default);
- ``api``: instrumented, no tracer or meter provider set (each wrapper passes the call
  through);
- ``sdk``: instrumented with the SDK: every span, as it ends, handed to an
  exporter that drops it, every metric into a reader that is never collected.

Needs the ``otel`` extra and ``opentelemetry-sdk``. Prints a table, writes JSON (``--out``,
default benchmarks/results/otel_cost.json).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _bench import instrument_dropping

from effecthost import telemetry
from effecthost.combinators import Scope, all_, tool
from effecthost.contract import ToolRegistry
from effecthost.hosts.memory import MemoryEffectHost


async def _echo(value: Any) -> Any:
    return value


async def _groups(groups: int, width: int, scope: str) -> None:
    host = MemoryEffectHost(ToolRegistry({"echo": _echo}))
    s = Scope(scope_id=scope)
    for i in range(groups):
        await all_(host, s, [tool("echo", [i, j]) for j in range(width)])


def _us_per_child(groups: int, width: int, scope: str) -> float:
    gc.collect()
    started = time.process_time()
    asyncio.run(_groups(groups, width, scope))
    return (time.process_time() - started) / (groups * width) * 1e6


def _mode(name: str) -> Any:
    """Switch to ``name``; returns what to shut down after the round."""
    telemetry.uninstrument()
    if name == "api":
        telemetry.instrument()  # no provider is set in this process: the API's no-ops
    elif name == "sdk":
        return instrument_dropping()
    return None


def measure(groups: int, width: int, rounds: int) -> dict[str, Any]:
    modes = ("off", "api", "sdk")
    found: dict[str, list[float]] = {m: [] for m in modes}
    _us_per_child(min(200, groups), width, "warm")
    for r in range(rounds):
        for m in modes:
            providers = _mode(m)
            found[m].append(_us_per_child(groups, width, f"{m}-{r}"))
            if providers is not None:
                for provider in providers:
                    provider.shutdown()
    telemetry.uninstrument()
    rows = {
        m: {"median": statistics.median(v), "min": min(v), "max": max(v)} for m, v in found.items()
    }
    off = rows["off"]["median"]
    return {
        "workload": f"all() of {width} on the memory host",
        "groups": groups,
        "rounds": rounds,
        "us_per_child": rows,
        "added_us_per_child": {m: rows[m]["median"] - off for m in ("api", "sdk")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "otel_cost.json"))
    args = parser.parse_args()
    doc = measure(args.groups, args.width, args.rounds)
    for mode, row in doc["us_per_child"].items():
        print(f"{mode:4} {row['median']:7.1f} µs/child ({row['min']:.1f}–{row['max']:.1f})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
