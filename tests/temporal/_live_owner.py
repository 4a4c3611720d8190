"""A caller process that opens a ``CANCEL`` group and stays alive until it is killed.

``python -m tests.temporal._live_owner ADDRESS TASK_QUEUE LAB_PATH KEY`` (with the tests
directory on ``PYTHONPATH`` too): it prints ``opened`` once the group is recorded, then
holds its owner lease (a short one, so a test sees it lapse soon after a SIGKILL)."""

from __future__ import annotations

import asyncio
import sys

from owner_liveness import OWNER_TTL, owned_group

from effecthost.conformance import conformance_resolver
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import connect


async def main(address: str, task_queue: str, lab_path: str, key: str) -> None:
    client = await connect(address)
    host = TemporalEffectHost(
        client, task_queue, conformance_resolver(lab_path), owner_ttl=OWNER_TTL
    )
    await host.open_effect_group(owned_group(key))
    print("opened", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
