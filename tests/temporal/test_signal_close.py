"""A close through the controller that opened the group is a signal (G-26, G-27, R-4).

The opener knows the recorded shape, so the handle fence and the narrowing are decided
on its side; the close is then durably recorded in history when the signal returns. A
query waits for an outstanding workflow task and an update is applied after the events
before it, so nothing served after the close returns can be a settlement."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from group_support import group as effect_group

from effecthost.conformance._lab import Lab
from effecthost.contract import (
    DispositionWidened,
    EffectGroup,
    GroupClosed,
    GroupHandle,
    HandleMismatch,
    LoserPolicy,
    WakePolicy,
)
from effecthost.hosts.temporal import TemporalEffectHost
from effecthost.hosts.temporal.testing import TemporalHostUnderTest

from ._support import on_host, step

pytestmark = pytest.mark.timeout(120)


def _updates(ctl: TemporalEffectHost) -> list[str]:
    """The names of the updates ``ctl`` sends from now on."""
    sent: list[str] = []
    update = ctl._update

    async def counted(key: str, name: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(name if isinstance(name, str) else name.__name__)
        return await update(key, name, *args, **kwargs)

    ctl._update = counted  # type: ignore[method-assign]
    return sent


async def _signals(host: Any, key: str) -> list[str]:
    """The signals recorded in the history of group ``key``."""
    history = await host.client.get_workflow_handle(key).fetch_history()
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]


async def _closed(ctl: TemporalEffectHost, handle: GroupHandle) -> None:
    with pytest.raises(GroupClosed):
        await asyncio.wait_for(ctl.await_next_settlement(handle), 20)


def _race(key: str, *tags: str, disposition: LoserPolicy = LoserPolicy.CANCEL) -> EffectGroup:
    return effect_group(
        key,
        [step(tags[0], gate=False, result="W"), *(step(t) for t in tags[1:])],
        WakePolicy.FIRST,
        disposition,
    )


@on_host()
async def test_the_openers_close_is_a_signal_and_serves_nothing_after(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-26, G-27, R-4: the opener closes with a signal, no update; as soon as the close
    returns, an await through the opener, through a controller that reopened the group,
    and through one with only the handle are ``GroupClosed``, and so is a reopen; the
    loser's cancel is issued (it ends cancelled and takes rank 2). With the worker
    stopped the close still returns (the signal is in history), and reads sent before
    the worker resumes wait for the task that applies it: none returns a settlement."""
    assert host.client is not None and host.worker is not None
    for round_ in range(3):
        stopped = round_ == 2
        group = _race(f"sigclose:group:race:{round_}", f"sc.win.{round_}", f"sc.lose.{round_}")
        opener = TemporalEffectHost(host.client, host.task_queue, host.resolver())
        other = TemporalEffectHost(host.client, host.task_queue, host.resolver())
        reader = TemporalEffectHost(host.client, host.task_queue, host.resolver())
        handle = await opener.open_effect_group(group)
        await other.open_effect_group(group)
        first = await asyncio.wait_for(opener.await_next_settlement(handle), 30)
        assert first.replay_key == f"sc.win.{round_}"
        await lab.wait_for("started", f"sc.lose.{round_}", timeout=20)
        sent = _updates(opener)
        process = host.worker.process
        assert process is not None
        if stopped:
            os.kill(process.pid, signal.SIGSTOP)
        try:
            await asyncio.wait_for(opener.close_effect_group(handle), 20)
            assert sent == [], sent
            # at once, from every side, concurrently: the opener (a query), a
            # reopener at rank 2 (its waiting update), a reader (a query)
            reads = [
                asyncio.ensure_future(_closed(opener, handle)),
                asyncio.ensure_future(_closed(other, handle.copy_cursor())),
                asyncio.ensure_future(_closed(reader, group.handle())),
                asyncio.ensure_future(_closed(reader, handle.copy_cursor())),
            ]
            if stopped:
                # bounded: no read is answered while no worker can apply the close
                done, _ = await asyncio.wait(reads, timeout=1.0)
                assert not done, done
        finally:
            if stopped:
                os.kill(process.pid, signal.SIGCONT)
        await asyncio.gather(*reads)
        with pytest.raises(GroupClosed):
            await reader.open_effect_group(group)
        assert await _signals(host, group.key) == ["close_signal"]
        await lab.wait_for("cancelled", f"sc.lose.{round_}", timeout=20)
        wf = host.client.get_workflow_handle(group.key)
        second = await wf.query("read", 2)
        assert second["settlement"]["outcome"]["status"] == "cancelled"
        # idempotent: a second close is a no-op and records nothing more
        await opener.close_effect_group(handle)
        assert await _signals(host, group.key) == ["close_signal"]
        # A reopener closes with a signal, which a closed run still running (its
        # retirement releases its claims, R-11) would record as a no-op: once
        # retired, its close records nothing either.
        await asyncio.wait_for(wf.result(), 20)
        await other.close_effect_group(group.handle(), LoserPolicy.CANCEL)
        assert await _signals(host, group.key) == ["close_signal"]
        assert group.key not in await opener.open_group_keys()


@on_host()
async def test_a_reopener_reading_a_rank_read_before_the_close(
    host: TemporalHostUnderTest, _lab: Lab
) -> None:
    """R-4: a controller that reopened the group and reads a rank another controller read
    before closing it gets ``GroupClosed``. The server answers an update whose id it has
    completed from the stored outcome, without the validator, so each waiting read sends
    its own update id."""
    assert host.client is not None
    group = _race("sigclose:group:reread:0", "rr.win", "rr.lose")
    opener = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    other = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    handle = await opener.open_effect_group(group)
    again = await other.open_effect_group(group)
    await asyncio.wait_for(opener.await_next_settlement(handle), 30)
    await opener.close_effect_group(handle)
    await _closed(other, again)


@on_host()
async def test_a_close_refused_by_the_opener_records_nothing(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-26, R-2, G-20: through the opener, a handle of another shape is
    ``HandleMismatch`` and a widening is ``DispositionWidened``, as through any
    controller; neither records anything (no signal, the group stays open and serves)."""
    assert host.client is not None
    group = _race("sigclose:group:refused:0", "sr.win", "sr.lose")
    opener = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    handle = await opener.open_effect_group(group)
    bad = handle.model_copy(update={"child_count": 3})
    with pytest.raises(HandleMismatch):
        await opener.close_effect_group(bad)
    with pytest.raises(DispositionWidened):
        await opener.close_effect_group(handle, LoserPolicy.RUN_TO_COMPLETION)
    assert await _signals(host, group.key) == []
    status = await host.client.get_workflow_handle(group.key).query("status")
    assert status["closed"] is False and status["effective"] == "cancel"
    first = await asyncio.wait_for(opener.await_next_settlement(handle), 30)
    assert first.replay_key == "sr.win"
    await opener.close_effect_group(handle)
    await lab.wait_for("cancelled", "sr.lose", timeout=20)


@on_host()
async def test_a_close_not_through_the_opener_is_an_update(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-26, R-4: a controller that neither opened nor reopened the group (a restored
    handle in a fresh process) closes with the update, which checks the record; the
    opener's later close of the closed group is a no-op, a widening included (the record
    decides, not what the opener knew), and so is one after the run has ended."""
    assert host.client is not None
    group = _race(
        "sigclose:group:foreign:0",
        "sf.win",
        "sf.lose",
        disposition=LoserPolicy.RUN_TO_COMPLETION,
    )
    opener = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    handle = await opener.open_effect_group(group)
    restored = TemporalEffectHost(host.client, host.task_queue, host.resolver())
    sent = _updates(restored)
    await restored.close_effect_group(handle.copy_cursor(), LoserPolicy.CANCEL)
    assert sent == ["close"], sent
    assert await _signals(host, group.key) == []
    await _closed(opener, handle)
    # closed under CANCEL by another: the opener's RUN_TO_COMPLETION close is a no-op
    await opener.close_effect_group(handle, LoserPolicy.RUN_TO_COMPLETION)
    await lab.wait_for("cancelled", "sf.lose", timeout=20)
    await asyncio.wait_for(host.client.get_workflow_handle(group.key).result(), 20)

    ended = _race(
        "sigclose:group:ended:0",
        "se.win",
        "se.two",
        disposition=LoserPolicy.RUN_TO_COMPLETION,
    )
    handle = await opener.open_effect_group(ended)
    lab.open("se.two")
    await restored.close_effect_group(handle.copy_cursor())
    await asyncio.wait_for(host.client.get_workflow_handle(ended.key).result(), 20)
    await opener.close_effect_group(handle)  # the run has ended: a no-op
    with pytest.raises(HandleMismatch):
        await opener.close_effect_group(handle.model_copy(update={"child_count": 3}))
    await _closed(opener, handle)


@on_host()
async def test_a_group_its_opener_closed_is_not_listed_while_no_worker_applies_it(
    host: TemporalHostUnderTest, lab: Lab
) -> None:
    """G-30, G-26: once ``close_effect_group`` returns, the closing controller does not
    list the group as open, even while no worker has applied the close yet (the
    visibility index follows the worker's task, the close is already in history). With
    the worker stopped, the listing still names the other open group of the opener."""
    assert host.client is not None and host.worker is not None
    opener = TemporalEffectHost(host.client, host.task_queue, host.resolver(), visibility_wait=2.0)
    closing = _race("sigclose:group:listed:0", "ls.win.0", "ls.lose.0")
    staying = _race("sigclose:group:listed:1", "ls.win.1", "ls.lose.1")
    handle = await opener.open_effect_group(closing)
    await opener.open_effect_group(staying)
    await lab.wait_for("started", "ls.lose.0", timeout=20)
    process = host.worker.process
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:
        await asyncio.wait_for(opener.close_effect_group(handle), 20)
        listed = await asyncio.wait_for(opener.open_group_keys(), 20)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert closing.key not in listed, listed
    assert staying.key in listed, listed
    await lab.wait_for("cancelled", "ls.lose.0", timeout=20)
    assert closing.key not in await opener.open_group_keys()
