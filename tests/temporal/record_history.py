"""Record the checked-in histories the replay tests use (run once, by hand):

    python -m tests.temporal.record_history [--shards]

It runs one group on a local dev server — five tool calls released in a chosen order,
a sleep and an event wait — reads the ranks through the caller API, closes the group,
and writes the run's history with the ranks observed into
``tests/temporal/histories/group_ranks.json``. ``--shards`` runs seven tool calls in
shards of three instead, released in a chosen order across the shards, and writes the
group's history and its shards' into ``tests/temporal/histories/shard_reports.json``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    WakePolicy,
    sleep_input,
)
from effecthost.hosts.temporal import TemporalEffectHost, release_temporal_runtime
from effecthost.hosts.temporal._shared import shard_id

from ._support import running_host, step

OUT = Path(__file__).parent / "histories" / "group_ranks.json"
SHARDS_OUT = Path(__file__).parent / "histories" / "shard_reports.json"


async def record() -> None:
    with tempfile.TemporaryDirectory(prefix="ehrec-") as tmp:
        async with running_host(Path(tmp)) as (host, lab):
            tags = [f"rec.t{i}" for i in range(5)]
            children = [step(tag, result=i) for i, tag in enumerate(tags)]
            children.append(
                EffectEnvelope(
                    replay_key="rec.nap",
                    kind=EffectKind.SLEEP,
                    name="sleep",
                    input=sleep_input(0.2),
                )
            )
            children.append(
                EffectEnvelope(
                    replay_key="rec.ev", kind=EffectKind.AWAIT_EVENT, name="go", input=None
                )
            )
            group = EffectGroup(
                key="replay:group:recorded:0",
                wake=WakePolicy.ALL,
                disposition=LoserPolicy.RUN_TO_COMPLETION,
                children=children,
            )
            ctl = await host.controller()
            handle = await ctl.open_effect_group(group)
            ranks: list[str] = []
            ranks.append((await ctl.await_next_settlement(handle)).replay_key)  # the sleep
            for tag in (tags[3], tags[0]):
                lab.open(tag)
                ranks.append((await ctl.await_next_settlement(handle)).replay_key)
            await ctl.deliver_event(group.key, "go", {"n": 1})
            ranks.append((await ctl.await_next_settlement(handle)).replay_key)
            for tag in (tags[4], tags[1], tags[2]):
                lab.open(tag)
                ranks.append((await ctl.await_next_settlement(handle)).replay_key)
            await ctl.close_effect_group(handle)
            assert host.client is not None
            wf = host.client.get_workflow_handle(group.key)
            await wf.result()
            history = await wf.fetch_history()
            OUT.parent.mkdir(parents=True, exist_ok=True)
            OUT.write_text(
                json.dumps(
                    {
                        "workflow_id": group.key,
                        "ranks": ranks,
                        "history": json.loads(history.to_json()),
                    },
                    indent=1,
                    sort_keys=True,
                )
                + "\n"
            )
            print(f"recorded {len(ranks)} ranks: {ranks}")


async def record_shards() -> None:
    with tempfile.TemporaryDirectory(prefix="ehrec-") as tmp:
        async with running_host(Path(tmp)) as (host, lab):
            assert host.client is not None
            tags = [f"rec.s{i}" for i in range(7)]
            group = EffectGroup(
                key="replay:group:sharded:0",
                wake=WakePolicy.ALL,
                disposition=LoserPolicy.RUN_TO_COMPLETION,
                children=[step(tag, result=i) for i, tag in enumerate(tags)],
            )
            ctl = TemporalEffectHost(host.client, host.task_queue, host.resolver(), shard_size=3)
            handle = await ctl.open_effect_group(group)
            ranks: list[str] = []
            for i in (6, 1, 4, 0, 3, 5, 2):
                lab.open(tags[i])
                ranks.append((await ctl.await_next_settlement(handle)).replay_key)
            await ctl.close_effect_group(handle)
            wf = host.client.get_workflow_handle(group.key)
            await wf.result()
            shards = []
            for index in range(3):
                shard = host.client.get_workflow_handle(shard_id(group.key, index))
                await shard.result()
                history = await shard.fetch_history()
                shards.append({"workflow_id": shard.id, "history": json.loads(history.to_json())})
            await ctl.aclose()
            history = await wf.fetch_history()
            SHARDS_OUT.write_text(
                json.dumps(
                    {
                        "workflow_id": group.key,
                        "ranks": ranks,
                        "history": json.loads(history.to_json()),
                        "shards": shards,
                    },
                    indent=1,
                    sort_keys=True,
                )
                + "\n"
            )
            print(f"recorded {len(ranks)} ranks and {len(shards)} shards: {ranks}")


if __name__ == "__main__":
    asyncio.run(record_shards() if "--shards" in sys.argv[1:] else record())
    release_temporal_runtime()
