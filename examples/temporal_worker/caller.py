"""A separate caller process: a ``race`` and an ``all`` as durable effect groups.

python examples/temporal_worker/caller.py --address 127.0.0.1:7233 --task-queue demo
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

from temporalio.client import Client
from tools import registry

from effecthost.combinators import Scope, all_, race, tool
from effecthost.contract import validate_deployment
from effecthost.hosts.temporal import TemporalEffectHost, release_temporal_runtime


async def main(address: str, task_queue: str) -> None:
    client = await Client.connect(address)
    host = TemporalEffectHost(client, task_queue, registry)
    validate_deployment(host)  # fails at start-up if no resolver is registered
    scope = Scope(scope_id=f"demo-{uuid.uuid4().hex[:8]}")

    winner = await race(
        host,
        scope,
        [
            tool("fetch", {"url": "https://slow.example", "seconds": 2.0}),
            tool("fetch", {"url": "https://fast.example", "seconds": 0.1}),
        ],
    )
    print("race ->", winner)

    pages = await all_(
        host, scope, [tool("fetch", {"url": f"https://example.org/{i}"}) for i in range(5)]
    )
    print("all  ->", [page["url"] for page in pages])
    print("open groups:", await host.open_group_keys())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:7233")
    parser.add_argument("--task-queue", default="effecthost-demo")
    ns = parser.parse_args()
    asyncio.run(main(ns.address, ns.task_queue))
    release_temporal_runtime()  # a short-lived process: stop the SDK's threads before exit
