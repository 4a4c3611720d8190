"""Run the effect-group worker on a task queue (one call: ``run_worker``).

python examples/temporal_worker/worker.py --address 127.0.0.1:7233 --task-queue demo

It runs until SIGTERM or SIGINT, then shuts down gracefully: running children get
``--grace`` seconds to finish; the rest are retried by Temporal on another worker.
"""

from __future__ import annotations

import argparse
import asyncio

from temporalio.client import Client
from tools import registry

from effecthost.hosts.temporal import release_temporal_runtime, run_worker


async def main(address: str, task_queue: str, grace: float) -> None:
    client = await Client.connect(address)
    await run_worker(
        client,
        task_queue,
        registry,
        grace=grace,
        on_ready=lambda: print(f"worker polling {task_queue!r} on {address}", flush=True),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:7233")
    parser.add_argument("--task-queue", default="effecthost-demo")
    parser.add_argument("--grace", type=float, default=5.0)
    ns = parser.parse_args()
    try:
        asyncio.run(main(ns.address, ns.task_queue, ns.grace))
    finally:
        release_temporal_runtime()  # also on Ctrl-C: stop the SDK's threads before exit
