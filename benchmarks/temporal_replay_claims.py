"""Cost of the cheapest strongly consistent replay-key claim on Temporal (R-6).

    .venv/bin/python benchmarks/temporal_replay_claims.py [--rounds 30] [--out FILE]

Workflow ids are the engine's only strongly consistent global index, so a claim of a
replay key is a workflow whose id is derived from the replay key, started with
``id_conflict_policy=FAIL`` before the group workflow (a conflict is the refusal; the
holder's group key is read back with ``describe``, which reads mutable state, not
visibility). The claim is started with a long ``start_delay`` so no workflow task is
ever scheduled (no worker runs it, no task queue backlog), and released by terminating it
when its group retires. This measures, against a dev server on free ports, one caller:

- ``claim``: starting the claims of a group's children concurrently (2 and 50 children);
- ``conflict``: a refused claim (the start fails, then one ``describe`` names the holder);
- ``release``: terminating them concurrently.

Prints a table and writes JSON (``--out``, default benchmarks/results/temporal_claims.json).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from _bench import write_json
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from effecthost.hosts.temporal.testing import DevServer

CLAIM_WORKFLOW = "effecthost.ReplayKeyClaim"
CLAIM_QUEUE = "effecthost.replay-key-claims"


async def claim(client: Client, replay_key: str, group_key: str) -> Any:
    return await client.start_workflow(
        CLAIM_WORKFLOW,
        group_key,
        id=f"effecthost.replay-key:{replay_key}",
        task_queue=CLAIM_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        start_delay=timedelta(days=3650),
        memo={"group_key": group_key},
    )


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered) * 1000,
        "p95": ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000,
    }


async def main(rounds: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as work:
        server = DevServer(Path(work))
        client = await server.start()
        try:
            results = []
            for width in (2, 50):
                claims, releases, conflicts = [], [], []
                for _ in range(rounds):
                    group = f"bench:group:{uuid.uuid4().hex}:0"
                    keys = [f"bench.{uuid.uuid4().hex}" for _ in range(width)]
                    t0 = time.perf_counter()
                    handles = await asyncio.gather(*(claim(client, k, group) for k in keys))
                    claims.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    try:
                        await claim(client, keys[0], "bench:group:other:0")
                        raise AssertionError("a second claim of one replay key was accepted")
                    except WorkflowAlreadyStartedError:
                        memo = await (
                            await client.get_workflow_handle(
                                f"effecthost.replay-key:{keys[0]}"
                            ).describe()
                        ).memo()
                        assert memo["group_key"] == group
                    conflicts.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    await asyncio.gather(*(h.terminate("released") for h in handles))
                    releases.append(time.perf_counter() - t0)
                for what, values in (("claim", claims), ("release", releases)):
                    results.append({"op": what, "children": width, "rounds": rounds, **ms(values)})
                results.append({"op": "conflict", "children": 1, "rounds": rounds, **ms(conflicts)})
            return results
        finally:
            await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/temporal_claims.json"))
    args = parser.parse_args()
    rows = asyncio.run(main(args.rounds))
    print(f"{'op':<10}{'children':>9}{'p50 ms':>9}{'p95 ms':>9}")
    for row in rows:
        print(f"{row['op']:<10}{row['children']:>9}{row['p50']:>9.1f}{row['p95']:>9.1f}")
    write_json(args.out, rows)
