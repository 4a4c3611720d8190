"""Register the effect-group worker on a task queue (one call: ``create_worker``).

python examples/temporal_worker/worker.py --address 127.0.0.1:7233 --task-queue demo
"""

from __future__ import annotations

import argparse
import asyncio

from temporalio.client import Client
from tools import registry

from effecthost.hosts.temporal import create_worker, release_temporal_runtime


async def main(address: str, task_queue: str) -> None:
    client = await Client.connect(address)
    worker = create_worker(client, task_queue, registry)
    print(f"worker polling {task_queue!r} on {address}", flush=True)
    await worker.run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:7233")
    parser.add_argument("--task-queue", default="effecthost-demo")
    ns = parser.parse_args()
    try:
        asyncio.run(main(ns.address, ns.task_queue))
    finally:
        release_temporal_runtime()  # also on Ctrl-C: stop the SDK's threads before exit
