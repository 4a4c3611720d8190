"""``effecthost demo``: a race against a deadline and an ``all`` decided in rank order,
on the in-memory reference host, printed as a trace."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from effecthost.combinators import (
    DeadlineExceeded,
    EffectFailed,
    Scope,
    all_,
    tool,
    with_deadline,
)
from effecthost.contract import (
    EffectController,
    EffectGroup,
    GroupHandle,
    LoserPolicy,
    Settlement,
    ToolError,
    ToolRegistry,
)
from effecthost.hosts.memory import MemoryEffectHost


class TracingController(EffectController):
    """Prints every group call of the controller it wraps."""

    def __init__(self, inner: EffectController) -> None:
        self.inner = inner
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"  [{time.monotonic() - self.started:6.3f}s] {text}", flush=True)

    def supports_effect_groups(self) -> bool:
        return self.inner.supports_effect_groups()

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        handle = await self.inner.open_effect_group(group)
        names = ", ".join(f"{c.kind}:{c.name}" for c in group.children)
        self.say(
            f"open   {_short(group.key)} wake={group.wake.value} "
            f"losers={group.disposition.value} [{names}]"
        )
        return handle

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        settlement = await self.inner.await_next_settlement(handle)
        outcome = settlement.outcome
        detail = (
            f"value={outcome.value!r}"
            if outcome.ok
            else f"error={outcome.error.type if outcome.error else 'cancelled'}"
        )
        self.say(f"rank {settlement.rank} position {settlement.position} {outcome.status} {detail}")
        return settlement

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        await self.inner.close_effect_group(handle, disposition)
        self.say(
            f"close  {_short(handle.group_key)} losers={(disposition or handle.disposition).value}"
        )


def _short(key: str) -> str:
    scope, _, rest = key.partition(":group:")
    batch, _, occurrence = rest.rpartition(":")
    return f"{scope}:group:{batch[:8]}…:{occurrence}"


def _tools(slow_seconds: float) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool("slow_search")
    async def slow_search(query: Any) -> Any:
        await asyncio.sleep(slow_seconds)
        return {"hits": 3, "query": query}

    @registry.tool("fetch")
    async def fetch(spec: Any) -> Any:
        await asyncio.sleep(float(spec.get("after", 0)))
        if spec.get("fail"):
            raise ToolError("FetchFailed", f"{spec['url']} answered {spec['fail']}")
        return f"body of {spec['url']}"

    return registry


async def run_demo(*, slow_seconds: float = 2.0, deadline_seconds: float = 0.3) -> int:
    host = MemoryEffectHost(_tools(slow_seconds))
    ctl = TracingController(host)
    scope = Scope(scope_id="demo")

    print(f"race: slow_search ({slow_seconds}s) against a {deadline_seconds}s deadline")
    try:
        await with_deadline(ctl, scope, tool("slow_search", "durable effects"), deadline_seconds)
    except DeadlineExceeded:
        ctl.say("deadline won; the slow tool was cancelled (declared CANCEL at open)")

    print("all: three fetches; two fail, the later-positioned one fails first")
    calls = [
        tool("fetch", {"url": "a.example", "after": 0.05}),
        tool("fetch", {"url": "b.example", "after": 0.20, "fail": 500}),
        tool("fetch", {"url": "c.example", "after": 0.10, "fail": 404}),
    ]
    try:
        await all_(ctl, scope, calls)
    except EffectFailed as failure:
        ctl.say(
            f"all() rejected with position {failure.position} ({failure.error.message}): "
            f"the first rejection in rank order, not position order"
        )
    await asyncio.sleep(0.25)
    print(f"open groups left: {await host.open_group_keys()}")
    await host.aclose()
    return 0
