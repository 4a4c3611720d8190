"""R-12 on the Restate tier against a real restate-server: an await rides out the
endpoint and the server going down; open, close and ``deliver_event`` give up after the
controller's bound with ``EngineUnavailable``; several URLs fail over."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from restate_stack import Stack as BaseStack
from restate_stack import running_stack

from effecthost._inspect import TierUnreachable
from effecthost.conformance import conformance_resolver, step_input
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectGroupUnsupported,
    EffectHostError,
    EffectKind,
    EngineUnavailable,
    GroupHandle,
    LoserPolicy,
    UnknownGroup,
    WakePolicy,
    group_key,
)
from effecthost.hosts.restate import RestateController, register_deployment
from effecthost.hosts.restate._inspect import RestateInspector
from effecthost.hosts.restate.testing import _stop, free_port

pytestmark = pytest.mark.anyio
TIMEOUT = 30.0
OUTAGE = 100.0
BOUND = 2.0


class Stack(BaseStack):
    def short(self, **urls: Any) -> RestateController:
        """A controller that gives up on open/close/deliver after ``BOUND`` seconds."""
        return RestateController(
            urls.get("ingress", self.local.ingress_url),
            urls.get("admin", self.local.admin_url),
            conformance_resolver(self.lab.path),
            owner="tests",
            outage_bound=BOUND,
        )


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path, stack=Stack) as built:
        yield built


def _group(name: str, tags: list[str], **kw: Any) -> EffectGroup:
    return effect_group(
        group_key("outage", name, 0),
        [
            EffectEnvelope(
                replay_key=tag,
                kind=EffectKind.TOOL_CALL,
                name="conformance.step",
                input=step_input(tag),
            )
            for tag in tags
        ],
        kw.get("wake", WakePolicy.ALL),
        kw.get("disposition", LoserPolicy.RUN_TO_COMPLETION),
    )


async def _outcome(call: Awaitable[Any], raised: list[BaseException]) -> Any:
    try:  # a call that never gives up fails the check with a TimeoutError
        return await asyncio.wait_for(call, BOUND + TIMEOUT)
    except Exception as exc:
        raised.append(exc)
        return exc


async def _give_up_in_bound(stack: Stack, closing: GroupHandle, tag: str) -> None:
    """Open, close and deliver_event through a short-bound controller raise
    ``EngineUnavailable`` (nothing else) naming the group, the call and how long it tried."""
    short = stack.short()
    raised: list[BaseException] = []
    try:
        fresh = _group(f"{tag}.fresh", [f"{tag}.f0"])
        await _outcome(short.open_effect_group(fresh), raised)
        await _outcome(short.close_effect_group(closing, LoserPolicy.CANCEL), raised)
        await _outcome(short.deliver_event(fresh.key, "ping"), raised)
    finally:
        await short.aclose()
    assert [type(exc) for exc in raised] == [EngineUnavailable] * 3, raised
    ops = [(exc.operation, exc.group_key) for exc in raised if isinstance(exc, EngineUnavailable)]
    assert ops == [
        ("open", fresh.key),
        ("close", closing.group_key),
        ("deliver_event", fresh.key),
    ]
    assert all(isinstance(exc, EngineUnavailable) and exc.tried_for >= BOUND for exc in raised)


@pytest.mark.idle
@pytest.mark.timeout(OUTAGE + 120)
async def test_R12_an_await_rides_out_the_endpoint_down_100s(stack: Stack) -> None:
    """R-12: with the endpoint down 100 s, an await in flight keeps waiting and returns
    the right rank once it is back; open, close and deliver_event meanwhile raise
    ``EngineUnavailable`` after the controller's bound; the calls that went through
    later are fenced: the reopen records nothing twice, the close is a no-op."""
    ctl, lab = stack.controller, stack.lab
    group = _group("endpoint", ["ep.a", "ep.b"])
    other = _group("endpoint.other", ["ep.c"], disposition=LoserPolicy.CANCEL)
    handle = await ctl.open_effect_group(group)
    other_handle = await ctl.open_effect_group(other)
    lab.open("ep.a")
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (first.rank, first.replay_key) == (1, "ep.a")
    await lab.wait_for("started", "ep.b", 1, TIMEOUT)
    await lab.wait_for("started", "ep.c", 1, TIMEOUT)

    loop = asyncio.get_running_loop()
    down_at = loop.time()
    stack.local.kill_endpoint()
    waiting = asyncio.ensure_future(ctl.await_next_settlement(handle))
    await _give_up_in_bound(stack, other_handle, "ep")
    with pytest.raises(TimeoutError):  # the outage's length, not an ordering sleep
        await asyncio.wait_for(asyncio.shield(waiting), OUTAGE - (loop.time() - down_at))
    await stack.local.start_endpoint()
    lab.open("ep.b")
    second = await asyncio.wait_for(waiting, TIMEOUT)
    assert (second.rank, second.replay_key, second.outcome.ok) == (2, "ep.b", True)

    again = await ctl.open_effect_group(_group("ep.fresh", ["ep.f0"]))  # a reopen now
    lab.open("ep.f0")
    settled = await asyncio.wait_for(ctl.await_next_settlement(again), TIMEOUT)
    assert settled.replay_key == "ep.f0"
    await ctl.close_effect_group(again)
    await ctl.close_effect_group(other_handle, LoserPolicy.CANCEL)  # closed already: no-op
    await ctl.close_effect_group(handle)
    assert lab.count("started", "ep.f0") == 1
    assert lab.count("finished", "ep.c") == 0


async def test_R12_an_await_rides_out_a_server_restart(stack: Stack) -> None:
    """R-12: with the restate-server SIGKILLed, an await in flight keeps retrying (no
    ``httpx`` error reaches the caller) and returns the right rank once the server is
    back on its data; open, close and deliver_event raise ``EngineUnavailable``."""
    ctl, lab = stack.controller, stack.lab
    group = _group("server", ["sv.a", "sv.b"])
    other = _group("server.other", ["sv.c"], disposition=LoserPolicy.CANCEL)
    handle = await ctl.open_effect_group(group)
    other_handle = await ctl.open_effect_group(other)
    await lab.wait_for("started", "sv.b", 1, TIMEOUT)
    waiting = asyncio.ensure_future(ctl.await_next_settlement(handle))
    await lab.wait_for("started", "sv.a", 1, TIMEOUT)

    await asyncio.to_thread(_stop, stack.local.server, signal.SIGKILL)
    await _give_up_in_bound(stack, other_handle, "sv")
    inspector = RestateInspector(stack.local.admin_url, timeout=BOUND)
    try:
        with pytest.raises(TierUnreachable):
            await inspector.groups()
    finally:
        await inspector.aclose()
    assert not waiting.done()
    await stack.local.start_server()
    lab.open("sv.b")
    first = await asyncio.wait_for(waiting, TIMEOUT)
    assert (first.rank, first.replay_key) == (1, "sv.b")
    lab.open("sv.a")
    second = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert (second.rank, second.replay_key) == (2, "sv.a")
    await ctl.close_effect_group(handle)
    await ctl.close_effect_group(other_handle, LoserPolicy.CANCEL)
    with pytest.raises(UnknownGroup):
        await ctl.deliver_event(_group("sv.fresh", ["sv.f0"]).key, "ping")


async def test_R12_several_urls_fail_over_to_a_live_node(stack: Stack) -> None:
    """R-12: a controller given a dead node's URLs before the live ones opens, awaits,
    closes and queries through the live node, and so do the inspector and
    ``register_deployment``; no URL at all is a typed refusal."""
    dead = f"http://127.0.0.1:{free_port()}"
    ctl = stack.short(ingress=[dead, stack.local.ingress_url], admin=(dead, stack.local.admin_url))
    try:
        handle = await ctl.open_effect_group(_group("urls", ["url.a"]))
        stack.lab.open("url.a")
        settled = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        assert settled.replay_key == "url.a"
        assert handle.group_key in await ctl.open_group_keys()
        inspector = RestateInspector([dead, stack.local.admin_url], timeout=BOUND)
        try:
            assert handle.group_key in [row.key for row in await inspector.groups()]
        finally:
            await inspector.aclose()
        await ctl.close_effect_group(handle)
    finally:
        await ctl.aclose()
    await register_deployment([dead, stack.local.admin_url], stack.local.endpoint_uri)
    for bad in ([], [""], [None]):
        with pytest.raises(EffectGroupUnsupported):
            RestateController(bad, stack.local.admin_url)  # type: ignore[arg-type]
    with pytest.raises(EffectHostError):
        RestateController(stack.local.ingress_url, ())
