"""The contract below the combinators: open, consume by rank with a saved cursor, close.

Shows that the handle is the only cursor: a copy saved before consuming reads the same
ranks again, as a restored continuation would.
"""

import asyncio

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    GroupHandle,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
    group_key,
)
from effecthost.hosts.memory import MemoryEffectHost

tools = ToolRegistry()


@tools.tool("work")
async def work(spec):
    await asyncio.sleep(spec["seconds"])
    return spec["name"]


async def main():
    host = MemoryEffectHost(tools)
    key = group_key("turn-7", "batch-a", 0)
    group = EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[
            EffectEnvelope(replay_key=f"{key}:{i}", kind="tool_call", name="work", input=spec)
            for i, spec in enumerate(
                [{"name": "slow", "seconds": 0.2}, {"name": "fast", "seconds": 0.01}]
            )
        ],
    )
    handle = await host.open_effect_group(group)
    saved = handle.to_json()
    while not handle.exhausted:
        settlement = await host.await_next_settlement(handle)
        print(
            f"rank {settlement.rank}: position {settlement.position} -> {settlement.outcome.value}"
        )
    restored = GroupHandle.from_json(saved)
    again = await host.await_next_settlement(restored)
    print(f"restored cursor reads rank {again.rank} again: {again.outcome.value}")
    await host.close_effect_group(handle)


if __name__ == "__main__":
    asyncio.run(main())
