"""A short-lived caller process: connect, open a two-child group, read both ranks, exit.

``python -m tests.temporal._short_caller ADDRESS TASK_QUEUE LAB_PATH KEY``; its exit code
is what the crash-at-exit test checks."""

from __future__ import annotations

import asyncio
import os
import sys

from effecthost.conformance import conformance_resolver
from effecthost.contract import EffectGroup, LoserPolicy, WakePolicy
from effecthost.hosts.temporal import TemporalEffectHost, release_temporal_runtime
from effecthost.hosts.temporal.testing import connect

from ._support import step


async def main(address: str, task_queue: str, lab_path: str, key: str) -> None:
    client = await connect(address)
    host = TemporalEffectHost(client, task_queue, conformance_resolver(lab_path))
    group = EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[step(f"{key}:{i}", gate=False, result=i) for i in range(2)],
    )
    handle = await host.open_effect_group(group)
    for _ in range(2):
        await host.await_next_settlement(handle)
    await host.close_effect_group(handle)
    await host.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
    if not os.environ.get("EFFECTHOST_EXIT_WITHOUT_RELEASE"):
        release_temporal_runtime()
