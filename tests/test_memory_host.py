"""Behaviour of the in-memory reference host that the conformance suite cannot reach on
this tier: the drain after the children's tasks stop (``aclose`` stands in for a dead
process while the record survives), gapped sequences, retirement, host-run kinds."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest
from gated_tools import Lab, group, step

from effecthost.contract import (
    DrainReport,
    EffectKind,
    GroupClosed,
    GroupDrain,
    LoserPolicy,
    NoExecutor,
    UnknownGroup,
    WakePolicy,
    sleep_input,
)
from effecthost.hosts.memory import AdversarialMemoryHost, MemoryEffectHost

pytestmark = pytest.mark.anyio


@pytest.fixture
def lab() -> Lab:
    return Lab()


@pytest.fixture
async def host(lab: Lab) -> AsyncIterator[MemoryEffectHost]:
    host = MemoryEffectHost(lab.registry())
    yield host
    await host.aclose()


async def stop_children(host: MemoryEffectHost, lab: Lab, *labels: str) -> None:
    """Wait until ``labels`` run, then stop every child task without recording anything."""
    with anyio.fail_after(5):
        for label in labels:
            await lab.started[label].wait()
    await host.aclose()
    assert host._tasks == {}


async def test_g12_unwired_drain_reports_every_unfinished_child(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("t:group:unwired:0", step("a"), step("b"), step("c", gate=False))
    handle = await host.open_effect_group(g)
    assert (await host.await_next_settlement(handle)).position == 2
    await stop_children(host, lab, "a", "b")
    host.register_executors(None)
    drain = host.drain()
    reports = [await drain.run_pass(), await drain.run_pass()]
    for report in reports:
        assert not report.empty
        assert (report.resumed, report.cancelled) == ((), ())
        assert all(isinstance(entry, NoExecutor) for entry in report.no_executor)
        assert [(e.group_key, e.replay_key, e.position) for e in report.no_executor] == [
            (g.key, f"{g.key}:a", 0),
            (g.key, f"{g.key}:b", 1),
        ]
        assert all(e.replay_key in str(e) for e in report.no_executor)
    assert g.key in await host.open_group_keys()
    assert lab.runs == Counter(a=1, b=1, c=1)


async def test_g12_drain_over_nothing_is_an_empty_typed_pass() -> None:
    host = MemoryEffectHost()
    drain = host.drain()
    assert isinstance(drain, GroupDrain)
    assert await drain.run_pass() == DrainReport()
    await host.aclose()
    report = await host.drain().run_pass()
    assert isinstance(report, DrainReport) and report.empty


async def test_g11_g09_reopen_after_a_resolver_swap_runs_what_it_can(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("t:group:swap:0", step("a"), step("b", name="other"))
    await host.open_effect_group(g)
    await stop_children(host, lab, "a", "b")
    lab.started["a"].clear()
    host.register_executors(lab.registry("step"))
    handle = await host.open_effect_group(g)
    assert handle.consumed == 0
    report = await host.drain().run_pass()
    assert [(e.group_key, e.replay_key, e.position) for e in report.no_executor] == [
        (g.key, f"{g.key}:b", 1)
    ]
    assert "resolver returned None" in str(report.no_executor[0])
    assert report.resumed == ()
    assert g.key in await host.open_group_keys()
    with anyio.fail_after(5):
        await lab.started["a"].wait()
    assert lab.runs == Counter(a=2, b=1)
    lab.gates["a"].set()
    settlement = await host.await_next_settlement(handle)
    assert (settlement.rank, settlement.replay_key) == (1, f"{g.key}:a")


async def test_g28_g29_drain_resumes_run_to_completion_children_with_fresh_executors(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("t:group:resume:0", step("a"), step("b"))
    handle = await host.open_effect_group(g)
    await stop_children(host, lab, "a", "b")
    report = await host.drain().run_pass()
    assert report.resumed == ((g.key, f"{g.key}:a"), (g.key, f"{g.key}:b"))
    assert (report.cancelled, report.no_executor) == ((), ())
    lab.gates["a"].set()
    lab.gates["b"].set()
    ranks = [await host.await_next_settlement(handle) for _ in range(2)]
    assert all(s.outcome.ok for s in ranks)
    assert lab.runs == Counter(a=2, b=2)
    assert await host.drain().run_pass() == DrainReport()


async def test_g29_drain_cancels_children_of_a_cancel_group_nobody_closed(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("t:group:cancel:0", step("a"), step("b"), disposition=LoserPolicy.CANCEL)
    handle = await host.open_effect_group(g)
    await stop_children(host, lab, "a", "b")
    report = await host.drain().run_pass()
    assert report.cancelled == ((g.key, f"{g.key}:a"), (g.key, f"{g.key}:b"))
    assert report.resumed == ()
    ranks = [await host.await_next_settlement(handle) for _ in range(2)]
    assert [s.outcome.status for s in ranks] == ["cancelled", "cancelled"]
    assert lab.runs == Counter(a=1, b=1)


async def test_g27_cancel_close_of_a_child_without_a_task_settles_it_at_once(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("t:group:orphan:0", step("a"))
    handle = await host.open_effect_group(g)
    await stop_children(host, lab, "a")
    await host.close_effect_group(handle, LoserPolicy.CANCEL)
    assert g.key not in host._groups
    with pytest.raises(GroupClosed):
        await host.open_effect_group(g)
    assert lab.runs == Counter(a=1)


async def test_g27_cancel_close_before_any_child_ran_ranks_each_as_cancelled(
    host: MemoryEffectHost, lab: Lab
) -> None:
    """G-27: a ``CANCEL`` close right after the open, before any child's task took its
    first step (an outer cancellation closes there, R-9), still gives each loser its
    cancelled terminal and rank, and the group retires; nothing ran."""
    g = group("t:group:unstarted:0", step("a"), step("b"), disposition=LoserPolicy.CANCEL)
    handle = await host.open_effect_group(g)
    tasks = list(host._tasks.values())
    await host.close_effect_group(handle)
    with anyio.fail_after(5):
        await asyncio.gather(*tasks, return_exceptions=True)  # after the host's callbacks
    assert g.key not in host._groups
    assert host._tasks == {}
    with pytest.raises(GroupClosed):
        await host.open_effect_group(g)
    assert lab.runs == Counter()


async def test_g16_adversarial_sequences_have_gaps_yet_ranks_are_dense(lab: Lab) -> None:
    host = AdversarialMemoryHost(lab.registry(), seed=7)
    try:
        labels = [f"c{i}" for i in range(6)]
        g = group("t:group:gaps:0", *(step(label) for label in labels))
        handle = await host.open_effect_group(g)
        with anyio.fail_after(5):
            for label in labels:
                await lab.started[label].wait()
        for label in labels:
            lab.gates[label].set()
        with anyio.fail_after(5):
            ranks = [await host.await_next_settlement(handle) for _ in labels]
        record = host._groups[g.key]
        seqs = [c.seq for c in record.settled]
        assert [s.rank for s in ranks] == [1, 2, 3, 4, 5, 6]
        assert all(isinstance(seq, int) for seq in seqs)
        assert seqs == sorted(set(seqs))
        assert seqs != list(range(1, len(labels) + 1))
        assert [s.position for s in ranks] == [c.position for c in record.settled]
        assert await host.settlement_order(g.key) == [s.position for s in ranks]
        assert sorted(s.position for s in ranks) == list(range(len(labels)))
    finally:
        await host.aclose()


async def test_g17_closed_group_retires_whole_once_every_child_settled(
    host: MemoryEffectHost, lab: Lab
) -> None:
    g = group("t:group:retire:0", step("a", gate=False), step("b"))
    handle = await host.open_effect_group(g)
    await host.await_next_settlement(handle)
    await host.close_effect_group(handle)
    assert g.key not in await host.open_group_keys()
    assert len(host._groups[g.key].children) == 2
    assert await host.settlement_order(g.key) == [0]
    lab.gates["b"].set()
    with anyio.fail_after(5):
        await lab.finished["b"].wait()
    assert g.key not in host._groups
    with pytest.raises(UnknownGroup):
        await host.settlement_order(g.key)
    with pytest.raises(GroupClosed):
        await host.await_next_settlement(g.handle())
    with pytest.raises(GroupClosed):
        await host.open_effect_group(g)
    await host.close_effect_group(handle)
    assert await host.deliver_event(g.key, "ping") == 0


async def test_reopen_of_a_closed_group_is_refused_before_retirement(
    host: MemoryEffectHost, lab: Lab
) -> None:
    """A closed group cannot be reopened; the answer must not depend on whether a
    loser happens to have finished (after it, the same open is ``GroupClosed``)."""
    g = group("t:group:reopen:0", step("a", gate=False), step("b"))
    handle = await host.open_effect_group(g)
    await host.await_next_settlement(handle)
    await host.close_effect_group(handle)
    with pytest.raises(GroupClosed):
        await host.open_effect_group(g)


APPROVAL = {"replay_key": "ev", "kind": EffectKind.AWAIT_EVENT, "name": "approval"}
"""A child waiting for event ``approval``."""


async def test_g51_event_delivered_before_the_child_runs_still_settles_it(
    host: MemoryEffectHost,
) -> None:
    g = group("t:group:early:0", APPROVAL, wake=WakePolicy.FIRST)
    handle = await host.open_effect_group(g)
    await host.aclose()
    assert host._tasks == {}
    assert await host.deliver_event(g.key, "approval", {"by": "ops"}) == 1
    assert await host.deliver_event(g.key, "approval", {"by": "late"}) == 0
    report = await host.drain().run_pass()
    assert report.resumed == ((g.key, f"{g.key}:ev"),)
    with anyio.fail_after(5):
        settlement = await host.await_next_settlement(handle)
    assert settlement.outcome.value == {"by": "ops"}


async def test_g51_event_delivered_right_after_open_settles_the_child(
    host: MemoryEffectHost,
) -> None:
    rejection = {"replay_key": "other", "kind": EffectKind.AWAIT_EVENT, "name": "rejection"}
    g = group("t:group:prompt:0", APPROVAL, rejection, wake=WakePolicy.FIRST)
    handle = await host.open_effect_group(g)
    assert await host.deliver_event(g.key, "approval", [1, 2]) == 1
    with anyio.fail_after(5):
        settlement = await host.await_next_settlement(handle)
    assert (settlement.position, settlement.outcome.value) == (0, [1, 2])


async def test_g51_sleep_due_time_is_recorded_at_open_and_kept_by_the_drain(
    host: MemoryEffectHost,
) -> None:
    g = group(
        "t:group:nap:0",
        {
            "replay_key": "nap",
            "kind": EffectKind.SLEEP,
            "name": "sleep",
            "input": sleep_input(3600),
        },
    )
    loop = asyncio.get_running_loop()
    before = loop.time()
    await host.open_effect_group(g)
    after = loop.time()
    due = host._groups[g.key].children[0].due_at
    assert due is not None
    assert before + 3600 <= due <= after + 3600
    await host.aclose()
    report = await host.drain().run_pass()
    assert report.resumed == ((g.key, f"{g.key}:nap"),)
    assert host._groups[g.key].children[0].due_at == due
