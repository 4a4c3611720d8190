"""An endpoint whose ``Reader`` handler drives a group with ``HandlerController`` (the
caller is an invocation), for tests of the in-handler read path. Serve it with
``python restate_reader_app.py BIND``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import restate

from effecthost.combinators import Scope, race, tool
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    GroupHandle,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.restate import HandlerController, build_services, serve

ECHO = "reader.echo"
tools = ToolRegistry()


@tools.tool(ECHO)
async def echo(value: Any) -> Any:
    return value


reader = restate.Service("Reader")


def _refused(exc: EffectHostError) -> str:
    return type(exc).__name__


@reader.handler()
async def read_all(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """Open an ``ALL`` group of ``n`` echo children under ``key``, read every rank, then
    probe the refusals: a handle claiming another child count, a read past the last
    rank, and a read after close."""
    controller = HandlerController(ctx, tools, owner="reader")
    n, key = int(req["n"]), str(req["key"])
    group = EffectGroup(
        key=key,
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[
            EffectEnvelope(
                replay_key=f"{key}:{i}", kind=EffectKind.TOOL_CALL, name=ECHO, input={"i": i}
            )
            for i in range(n)
        ],
    )
    handle = await controller.open_effect_group(group)
    ranks, values = [], []
    for _ in range(n):
        settlement = await controller.await_next_settlement(handle)
        ranks.append(settlement.rank)
        values.append(settlement.outcome.value["i"])
    answer: dict[str, Any] = {"ranks": ranks, "values": sorted(values)}
    wrong = GroupHandle(
        group_key=key,
        child_count=n + 1,
        consumed=n,
        wake=handle.wake,
        disposition=handle.disposition,
    )
    for name, probe in (("mismatch", wrong), ("exhausted", handle)):
        try:
            await controller.await_next_settlement(probe)
            answer[name] = "served"
        except EffectHostError as exc:
            answer[name] = _refused(exc)
    again = GroupHandle.from_json(handle.to_json())
    again.consumed = 0
    answer["reread"] = (await controller.await_next_settlement(again)).rank
    await controller.close_effect_group(handle)
    try:
        await controller.await_next_settlement(again)
        answer["closed"] = "served"
    except EffectHostError as exc:
        answer["closed"] = _refused(exc)
    return answer


@reader.handler()
async def race_two(ctx: restate.Context, req: dict[str, Any]) -> Any:
    """A 2-child ``race`` of echo tools, as a caller inside Restate runs it."""
    controller = HandlerController(ctx, tools, owner="reader")
    return await race(controller, Scope(scope_id=str(req["scope"])), [tool(ECHO, 1), tool(ECHO, 2)])


if __name__ == "__main__":
    asyncio.run(serve(restate.app([*build_services(tools), reader]), sys.argv[1]))
