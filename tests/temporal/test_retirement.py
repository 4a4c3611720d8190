"""Replay-key claims and retirement on Temporal (R-6, R-11): a replay key is held by one
live group; a closed group holds its keys and takes events until every child settled and
its run ended (retirement); then its keys are free and an event reaches nothing."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowExecutionStatus

from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupShapeMismatch,
    LoserPolicy,
    ReplayMismatch,
    UnknownGroup,
    WakePolicy,
)
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal._claims import CLAIM_WORKFLOW, MEMO_HOLDER
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step, temporal_controller

pytestmark = pytest.mark.timeout(120)


def _group(key: str, *children: EffectEnvelope, wake: WakePolicy = WakePolicy.ALL) -> EffectGroup:
    return EffectGroup(
        key=key, wake=wake, disposition=LoserPolicy.RUN_TO_COMPLETION, children=list(children)
    )


async def _retired(host: object, key: str) -> None:
    """Wait for the group's run to end (its retirement)."""
    client = host.client  # type: ignore[attr-defined]
    await asyncio.wait_for(client.get_workflow_handle(key).result(), 30)


async def _listed(ctl: TemporalEffectHost, key: str) -> bool:
    try:
        await ctl.client.get_workflow_handle(key).describe()
    except Exception:
        return False
    return True


@on_host()
async def test_R6_a_live_groups_prefixed_keys_refuse_another_group(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """R-6: keys of the form ``{prefix}:{n}`` (the combinators') are claimed per prefix:
    a group reusing one that a live group holds is ``ReplayMismatch`` naming both group
    keys, and nothing of it is recorded (no workflow, no child started); a plain key
    likewise; the holder's own reopen is not refused, and its refused reopen with another
    child claims nothing (that child's key opens in another group)."""
    ctl = await temporal_controller(host)
    holder = "r6:group:a:0"
    first = _group(holder, step(f"{holder}:0"), step(f"{holder}:1"), step("r6.plain"))
    handle = await ctl.open_effect_group(first)
    await ctl.open_effect_group(first)  # a reopen
    for reused in (f"{holder}:1", "r6.plain"):
        other = _group(f"r6:group:b:{reused[-1]}", step("r6.own", gate=False), step(reused))
        with pytest.raises(ReplayMismatch) as refused:
            await ctl.open_effect_group(other)
        assert holder in str(refused.value) and other.key in str(refused.value)
        assert refused.value.replay_key == reused and refused.value.position == 1
        assert not await _listed(ctl, other.key)
    assert lab.count("started", "r6.own") == 0
    with pytest.raises(GroupShapeMismatch):  # a refused reopen claims nothing
        await ctl.open_effect_group(_group(holder, step("r6.extra")))
    extra = await ctl.open_effect_group(
        _group("r6:group:c:0", step("r6.extra", gate=False, result="X"))
    )
    settled = await asyncio.wait_for(ctl.await_next_settlement(extra), 20)
    assert settled.outcome.value == "X"
    await ctl.close_effect_group(extra)
    lab.open_all("")
    for _ in range(3):
        await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    await ctl.close_effect_group(handle)


@on_host()
async def test_R11_a_closed_groups_keys_stay_claimed_until_its_loser_settles(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """R-11, R-6: a closed RUN_TO_COMPLETION race whose loser still runs holds the loser's
    replay key: a new group reusing it is refused naming the closed group; once the loser
    settled and the group retired, the same open succeeds."""
    ctl = await temporal_controller(host)
    key = "r11:group:race:0"
    loser = f"{key}:1"
    race = _group(key, step(f"{key}:0", gate=False, result="W"), step(loser), wake=WakePolicy.FIRST)
    handle = await ctl.open_effect_group(race)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    assert first.replay_key == f"{key}:0"
    await ctl.close_effect_group(handle)
    await lab.wait_for("started", loser)
    reuse = _group("r11:group:again:0", step(loser, gate=False, result="again"))
    with pytest.raises(ReplayMismatch) as refused:
        await ctl.open_effect_group(reuse)
    assert key in str(refused.value) and reuse.key in str(refused.value)
    assert not await _listed(ctl, reuse.key)
    lab.open(loser)
    await _retired(host, key)
    again = await ctl.open_effect_group(reuse)
    settled = await asyncio.wait_for(ctl.await_next_settlement(again), 20)
    assert settled.replay_key == loser and settled.outcome.value == "again"
    await ctl.close_effect_group(again)


@on_host()
async def test_G22_a_retired_groups_order_is_unknown(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """G-22: ``settlement_order`` of a retired group raises ``UnknownGroup`` (the run that
    held its order ended), as it does for a key never recorded; before the close it
    answers the order."""
    ctl = await host.controller()
    key = "g22:group:retired:0"
    handle = await ctl.open_effect_group(_group(key, step(f"{key}:0", gate=False)))
    await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    assert await ctl.settlement_order(key) == [0]
    await ctl.close_effect_group(handle)
    await _retired(host, key)
    with pytest.raises(UnknownGroup) as refused:
        await ctl.settlement_order(key)
    assert refused.value.group_key == key


@on_host()
async def test_R11_an_event_reaches_a_closed_groups_pending_wait_until_it_retires(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """R-11, R-5: after a RUN_TO_COMPLETION race is closed on its tool's win,
    ``deliver_event`` to its pending ``await_event`` child returns 1 and the child
    settles, so the group retires; a later ``deliver_event`` returns 0."""
    ctl = await temporal_controller(host)
    key = "r11:group:event:0"
    wait = EffectEnvelope(
        replay_key=f"{key}:1", kind=EffectKind.AWAIT_EVENT, name="ping", input=None
    )
    race = _group(key, step(f"{key}:0", gate=False, result="W"), wait, wake=WakePolicy.FIRST)
    handle = await ctl.open_effect_group(race)
    await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    await ctl.close_effect_group(handle)
    wf = ctl.client.get_workflow_handle(key)
    assert (await wf.describe()).status == WorkflowExecutionStatus.RUNNING
    assert await ctl.deliver_event(key, "ping", {"n": 1}) == 1
    await _retired(host, key)
    settled = await ctl.recorded_settlements(key)
    assert [s["replay_key"] for s in settled] == [f"{key}:0", f"{key}:1"]
    assert await ctl.deliver_event(key, "ping", {"n": 2}) == 0


@on_host()
async def test_R6_claims_are_per_key_not_per_prefix(host: TemporalHostUnderTest, lab: Lab) -> None:
    """R-6 is per key: hand-built keys ``p:1`` and ``p:2`` in two groups are both open; a
    hand-built key equal to a live combinator group's child key is refused naming that
    group, and one of its prefix that the group does not hold opens."""
    ctl = await temporal_controller(host)
    one = await ctl.open_effect_group(_group("r6:hand:a", step("p:1", gate=False)))
    two = await ctl.open_effect_group(_group("r6:hand:b", step("p:2", gate=False)))
    combinator = "r6:combinator:0"
    live = await ctl.open_effect_group(
        _group(combinator, step(f"{combinator}:0"), step(f"{combinator}:1"))
    )
    other = _group("r6:hand:c", step(f"{combinator}:1", gate=False))
    with pytest.raises(ReplayMismatch) as refused:
        await ctl.open_effect_group(other)
    assert combinator in str(refused.value) and other.key in str(refused.value)
    assert not await _listed(ctl, other.key)
    spare = await ctl.open_effect_group(_group("r6:hand:d", step(f"{combinator}:7", gate=False)))
    for handle in (one, two, spare):
        await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
        await ctl.close_effect_group(handle)
    lab.open_all("")
    await ctl.close_effect_group(live)


async def _claims_of(ctl: TemporalEffectHost, key: str) -> list[str]:
    """The running claim workflows whose memo names group ``key`` (visibility)."""
    held = []
    query = f'WorkflowType="{CLAIM_WORKFLOW}" AND ExecutionStatus="Running"'
    async for claim in ctl.client.list_workflows(query):
        if (await claim.memo()).get(MEMO_HOLDER) == key:
            held.append(claim.id)
    return held


async def _listing(ctl: TemporalEffectHost, key: str, *, held: bool) -> list[str]:
    for _ in range(200):  # bounded poll: the engine's listing catches up with its state
        claims = await _claims_of(ctl, key)
        if bool(claims) == held:
            return claims
        await asyncio.sleep(0.1)
    raise AssertionError(f"claims of {key!r} listed: {claims}, expected held={held}")


@on_host()
async def test_R11_a_retired_groups_claims_end(host: TemporalHostUnderTest, lab: Lab) -> None:
    """R-11: at retirement a group's replay-key claims go: while it is live its claim
    workflows are listed running (one per prefix, one per other key); once it retired,
    none of them is, and a new group takes its keys."""
    ctl = await temporal_controller(host)
    key = "r11:claims:0"
    group = _group(key, step(f"{key}:0", gate=False), step(f"{key}:1"), step("r11.own"))
    handle = await ctl.open_effect_group(group)
    assert len(await _listing(ctl, key, held=True)) == 2
    lab.open_all("")
    for _ in group.children:
        await asyncio.wait_for(ctl.await_next_settlement(handle), 20)
    await ctl.close_effect_group(handle)
    await _retired(host, key)
    assert await _listing(ctl, key, held=False) == []
    again = await ctl.open_effect_group(_group("r11:claims:1", step("r11.own", gate=False)))
    await asyncio.wait_for(ctl.await_next_settlement(again), 20)
    await ctl.close_effect_group(again)
