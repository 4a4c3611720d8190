"""What tracing costs a Restate group: groups of ``--width`` trivial tool calls, traced.

    .venv/bin/python benchmarks/restate_traced.py [--groups 40] [--width 3] [--out FILE]
        [--untraced]

Starts a local restate-server and an endpoint process, both instrumented with the
OpenTelemetry SDK (spans to an exporter that drops them), and measures each group's open →
every rank awaited → close in the caller (p50, p95) and the groups per second, one group
after another. A traced child calls ``settle`` and waits for its rank (issue 23); with
``--untraced`` neither process is instrumented (the children send their settlements).

Needs the ``otel`` extra and ``opentelemetry-sdk``. Prints one JSON line, and writes it to
``--out`` when given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import echo_tools, instrument_dropping, work_group

from effecthost.contract import group_key

TRACED = "EFFECTHOST_BENCH_TRACED"
HERE = str(Path(__file__).resolve().parent)

registry = echo_tools("work")
"""The endpoint's resolver (``restate_traced:registry``)."""

if os.environ.get(TRACED):
    instrument_dropping()


async def main(groups: int, width: int, traced: bool) -> dict[str, Any]:
    from effecthost.hosts.restate.testing import LocalRestate

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    if traced:
        os.environ[TRACED] = "1"
        instrument_dropping()
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalRestate(Path(tmp), "restate_traced:registry")
        try:
            await local.start()
            ctl = local.controller(registry, owner="bench")
            took: list[float] = []
            try:
                for n in range(groups + 3):
                    started = time.perf_counter()
                    handle = await ctl.open_effect_group(
                        work_group(group_key("bench", "traced", n), width)
                    )
                    for _ in range(width):
                        await ctl.await_next_settlement(handle)
                    await ctl.close_effect_group(handle)
                    if n >= 3:  # the first groups warm the endpoint up
                        took.append(time.perf_counter() - started)
            finally:
                await ctl.aclose()
        finally:
            await local.stop()
    cuts = statistics.quantiles(took, n=20)
    return {
        "traced": traced,
        "width": width,
        "groups": groups,
        "p50_ms": round(statistics.median(took) * 1000, 1),
        "p95_ms": round(cuts[18] * 1000, 1),
        "groups_per_s": round(len(took) / sum(took), 2),
        "load": round(os.getloadavg()[0], 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--width", type=int, default=3)
    parser.add_argument("--untraced", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    result = asyncio.run(main(args.groups, args.width, not args.untraced))
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    sys.exit(0)
