"""Liveness of the SQL tiers: every claimed child ends in a recorded outcome or a released
lease, and renewal covers only children with a live driver (G-27, G-33, G-36)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from group_support import event, race, timer
from sql_support import running, tools_group
from sql_support import until as poll_until

from effecthost.contract import (
    DispositionWidened,
    EffectGroup,
    LoserPolicy,
    ToolRegistry,
)
from effecthost.hosts.sql import SqlEffectHost, Store

pytestmark = pytest.mark.anyio

BOUND = 10.0  # a hang guard, never an ordering


async def never(_value: object) -> object:
    await asyncio.Event().wait()  # only a cancel ends it


async def until(probe: Callable[[], Awaitable[Any]], what: str, bound: float = BOUND) -> Any:
    return await poll_until(probe, what, bound)


def host(make: Callable[[], Store], fn: Any = never, **kw: Any) -> SqlEffectHost:
    kw.setdefault("lease_ttl", 1.2)
    kw.setdefault("renew_every", 0.2)
    kw.setdefault("poll_interval", 0.05)
    return SqlEffectHost(make(), ToolRegistry({"t": fn}), **kw)


async def test_G27_G36_children_cancelled_before_their_task_runs_settle(
    stores: Callable[[], Store],
) -> None:
    """G-27, G-36: a close under CANCEL right after the open, before the children's tasks
    first ran, still ends every child in a recorded cancelled outcome; the closed group
    retires and nothing stays leased or registered."""
    async with running(host(stores)) as (h,):
        group = tools_group("live:cancel-early:0")
        handle = await h.open_effect_group(group)
        await h.close_effect_group(handle, LoserPolicy.CANCEL)  # no yield in between
        await until(lambda: h.store.retired(group.key), "the closed group never retired")
        assert not h._drivers
        assert await h.store.max_lease_expiry(h.owner) is None


async def test_G27_G33_claim_returning_a_cancel_settles_the_child(
    stores: Callable[[], Store],
) -> None:
    """G-27, G-33: a claim that returns with ``cancel_requested`` already set (a close
    committed between the drain's read and its claim) ends in a recorded cancelled
    outcome, not in a driver cancelled before it ran that the keeper renews forever."""
    other = host(stores)
    async with _abandoned(stores, "live:cancel-claim:0", other) as group:
        await until(
            lambda: _all_expired(other.store, group.key), "the dead host's lease never expired"
        )
        real_claim = other.store.claim

        async def claim_after_close(*args: Any, **kw: Any) -> Any:
            await other.store.close(group.key, "cancel")  # marks cancel_requested
            return await real_claim(*args, **kw)

        other.store.claim = claim_after_close  # type: ignore[method-assign]
        await other.drain().run_pass()
        other.store.claim = real_claim  # type: ignore[method-assign]
        await until(lambda: other.store.retired(group.key), "the cancelled child never settled")
        assert not other._drivers
        assert await other.store.max_lease_expiry(other.owner) is None


@contextlib.asynccontextmanager
async def _abandoned(
    stores: Callable[[], Store], key: str, survivor: SqlEffectHost
) -> AsyncIterator[EffectGroup]:
    """A one-child ``RUN_TO_COMPLETION`` group ``key`` that a host opened and abandoned (as
    if its process died), beside ``survivor`` (started here and closed at the end); the
    dead host's orphaned tasks are cancelled last."""
    dead = host(stores)
    await dead.start()
    orphans: list[asyncio.Task[None]] = []
    try:
        async with running(survivor):
            group = tools_group(key, n=1, disposition=LoserPolicy.RUN_TO_COMPLETION)
            await dead.open_effect_group(group)
            orphans = await dead.abandon()
            yield group
    finally:
        for task in orphans:
            task.cancel()


async def _all_expired(store: Store, group_key: str) -> bool:
    rows = await store.children(group_key)
    return all(r.lease_expired for r in rows if r.state != "settled")


# -- R-1, G-52: a drain never mistakes a live caller's select for an orphan ---------------


def select_group(key: str, seconds: float = 60.0) -> EffectGroup:
    """A signal/deadline select (G-52): ``await_event`` and ``sleep``, ``FIRST``,
    ``CANCEL``; both children are host-run and carry no lease of their own."""
    return race(key, [event(f"{key}.ev", "sig"), timer(f"{key}.dl", seconds)])


def count_drain_passes(h: SqlEffectHost) -> list[int]:
    """Count the passes of ``h``'s own drains (its ``drain_every`` loop among them)."""
    passes = [0]
    make = h.drain

    def counting() -> Any:
        drain = make()
        run_pass = drain.run_pass

        async def counted() -> Any:
            report = await run_pass()
            passes[0] += 1
            return report

        drain.run_pass = counted  # type: ignore[method-assign]
        return drain

    h.drain = counting  # type: ignore[method-assign]
    return passes


async def test_R1_G52_drains_beside_a_live_select_cancel_nothing(
    stores: Callable[[], Store],
) -> None:
    """R-1, G-52: another host's drain pass and the caller's own ``drain_every`` passes,
    beside a live caller waiting on its deadline/signal select, cancel neither child;
    the event then takes rank 1."""
    caller = host(stores, drain_every=0.05)
    passes = count_drain_passes(caller)
    async with running(caller, host(stores)) as (_, other):
        group = select_group("live:select:0")
        handle = await caller.open_effect_group(group)
        waiting = asyncio.create_task(caller.await_next_settlement(handle))
        report = await other.drain().run_pass()
        assert not report.cancelled and not report.resumed
        before = passes[0]
        await until(lambda: _true(passes[0] >= before + 3), "the caller's drain never ran")
        assert not waiting.done()
        assert all(r.state != "settled" for r in await other.store.children(group.key))
        assert await other.deliver_event(group.key, "sig", "hi") == 1
        first = await asyncio.wait_for(waiting, BOUND)
        assert (first.position, first.outcome.status, first.outcome.value) == (0, "success", "hi")
        await caller.close_effect_group(handle)


async def test_R1_G29_drain_cancels_once_the_owner_is_gone(
    stores: Callable[[], Store],
) -> None:
    """R-1, G-29: when the owner's claim on a ``CANCEL`` group has expired (its process
    died), a drain applies the declared ``CANCEL``; before that it cancels nothing."""
    caller = host(stores, lease_ttl=2.0, renew_every=0.3)
    other = host(stores)
    await caller.start()
    await other.start()
    async with contextlib.aclosing(other):
        group = select_group("live:gone:0")
        handle = await caller.open_effect_group(group)
        expiry = await other.store.max_lease_expiry(caller.owner)
        assert expiry is not None
        await caller.abandon()
        report = await other.drain().run_pass()
        if await other.store.now() < expiry:  # the owner's claim was still live throughout
            assert not report.cancelled
        cancelled: list[tuple[str, str]] = []

        async def drained() -> bool:
            cancelled.extend((await other.drain().run_pass()).cancelled)
            return bool(cancelled)

        await until(drained, "the drain never cancelled the gone caller's group")
        assert await other.store.now() >= expiry
        ranks = [await asyncio.wait_for(other.await_next_settlement(handle), BOUND)]
        ranks.append(await asyncio.wait_for(other.await_next_settlement(handle), BOUND))
        assert [s.outcome.status for s in ranks] == ["cancelled", "cancelled"]


async def test_R1_a_refused_close_keeps_the_caller_the_owner(
    stores: Callable[[], Store],
) -> None:
    """R-1, R-2: a close the host refuses (``DispositionWidened``) leaves the group open
    and its caller live: the owner's claim is still renewed past the TTL it held at the
    refusal, so another host's drain does not apply the declared ``CANCEL``."""
    async with running(host(stores), host(stores)) as (caller, other):
        group = select_group("live:refused-close:0")
        handle = await caller.open_effect_group(group)
        with pytest.raises(DispositionWidened):
            await caller.close_effect_group(handle, LoserPolicy.RUN_TO_COMPLETION)
        expiry = await other.store.max_lease_expiry(caller.owner)
        assert expiry is not None
        await until(lambda: _later(other.store, expiry), "the database clock never passed")
        report = await other.drain().run_pass()
        assert not report.cancelled
        assert await other.store.max_lease_expiry(caller.owner) is not None
        await caller.close_effect_group(handle)


async def test_R1_a_reopened_cancel_group_is_the_returning_callers(
    stores: Callable[[], Store],
) -> None:
    """R-1: a caller that comes back to an unclosed ``CANCEL`` group (a reopen by a new
    incarnation, after the old owner's claim expired) owns it again: a drain pass does
    not cancel its in-flight host-run children."""
    async with _owner_gone(stores, "live:back:0") as (back, drainer, group):
        handle = await back.open_effect_group(group)
        report = await drainer.drain().run_pass()
        assert not report.cancelled
        assert await back.deliver_event(group.key, "sig", "back") == 1
        first = await asyncio.wait_for(back.await_next_settlement(handle), BOUND)
        assert (first.position, first.outcome.status) == (0, "success")


@contextlib.asynccontextmanager
async def _owner_gone(
    stores: Callable[[], Store], key: str
) -> AsyncIterator[tuple[SqlEffectHost, SqlEffectHost, EffectGroup]]:
    """A ``select`` group whose opener was abandoned and whose claim has expired, a host
    to come back to it and a host to drain it."""
    dead = host(stores)
    await dead.start()
    async with running(host(stores), host(stores)) as (back, drainer):
        group = select_group(key)
        await dead.open_effect_group(group)
        await dead.abandon()
        await until(lambda: _ownerless(back.store, group.key), "the dead owner never expired")
        yield back, drainer, group


async def _true(value: bool) -> bool:
    return value


async def _ownerless(store: Store, group_key: str) -> bool:
    rows = [r for r in await store.unfinished() if r.group_key == group_key]
    return bool(rows) and not any(getattr(r, "owner_live", False) for r in rows)


# -- G-33: a waiter makes progress without an external drain ----------------------------


async def test_G33_restarted_caller_reopening_within_the_ttl_progresses_without_a_drain(
    stores: Callable[[], Store],
) -> None:
    """G-33, G-35: a restarted caller that reopens while its predecessor's lease is still
    live is not left waiting for an external drain: once the lease expires the waiting
    host takes the child over and the rank settles."""

    async def quick(_value: object) -> str:
        return "again"

    back = host(stores, quick)
    async with _abandoned(stores, "live:reopen-ttl:0", back) as group:
        assert not await _all_expired(back.store, group.key)  # within the TTL
        handle = await back.open_effect_group(group)
        first = await asyncio.wait_for(back.await_next_settlement(handle), BOUND)
        assert (first.outcome.status, first.outcome.value) == ("success", "again")


async def test_G33_a_host_reclaims_its_own_child_after_losing_its_lease(
    stores: Callable[[], Store],
) -> None:
    """G-33: a driver that lost its lease stops and writes nothing; the child is not
    abandoned for good: this host's waiter takes it over once the lease has expired."""
    attempts = [0]
    started = asyncio.Event()

    async def first_hangs(_value: object) -> str:
        attempts[0] += 1
        if attempts[0] == 1:
            started.set()
            await asyncio.Event().wait()
        return "again"

    async with running(host(stores, first_hangs)) as (h,):
        group = tools_group("live:own-lost:0", n=1, disposition=LoserPolicy.RUN_TO_COMPLETION)
        handle = await h.open_effect_group(group)
        await asyncio.wait_for(started.wait(), BOUND)
        real_renew = h.store.renew

        async def lose_children(*args: Any, **kw: Any) -> Any:
            _children, groups = await real_renew(*args, **kw)
            return [], groups  # the store answers: no child lease is held any more

        h.store.renew = lose_children  # type: ignore[method-assign]
        await until(lambda: _true(not h._drivers), "the driver never stopped")
        h.store.renew = real_renew  # type: ignore[method-assign]
        first = await asyncio.wait_for(h.await_next_settlement(handle), BOUND)
        assert (first.outcome.status, first.outcome.value) == ("success", "again")
        assert attempts[0] == 2


# -- G-33, D11: the self-fencing deadline counts from the confirmed claim ----------------


@pytest.mark.parametrize("where", ["insert", "claim"])
async def test_G33_a_stall_before_the_claim_statement_does_not_fence_a_fresh_lease(
    stores: Callable[[], Store], where: str
) -> None:
    """G-33 (seed D11): the self-fencing deadline is measured from when the claim went
    out (the leased insert of a first open, or a takeover claim), not from before a
    stall that came first (waiting for a connection or a lock): a child whose lease is
    fresh runs once and records its outcome."""
    starts = [0]
    release = asyncio.Event()

    async def gated(_value: object) -> str:
        starts[0] += 1
        await release.wait()
        return "done"

    ttl = 1.2
    h = host(stores, gated, lease_ttl=ttl)
    await h.start()
    dead: SqlEffectHost | None = None
    orphans: list[asyncio.Task[None]] = []
    try:
        group = tools_group(f"live:stall-{where}:0", n=1)
        if where == "claim":  # the child is the dead host's, expired: reopen claims it
            dead = host(stores)
            await dead.start()
            await dead.open_effect_group(group)
            orphans = await dead.abandon()
            await until(lambda: _all_expired(h.store, group.key), "never expired", 3 * BOUND)
        name = "insert_children" if where == "insert" else "claim"
        real = getattr(h.store, name)

        async def stalled(*args: Any, **kw: Any) -> Any:
            t0 = await h.store.now()
            await until(lambda: _later(h.store, t0 + ttl), "the database clock stood still")
            return await real(*args, **kw)

        setattr(h.store, name, stalled)
        handle = await h.open_effect_group(group)
        setattr(h.store, name, real)
        await until(lambda: _true(starts[0] == 1), "the child never started")
        release.set()
        first = await asyncio.wait_for(h.await_next_settlement(handle), BOUND)
        assert (first.outcome.status, first.outcome.value) == ("success", "done")
        assert starts[0] == 1
    finally:
        await h.aclose()
        for task in orphans:
            task.cancel()


async def _later(store: Store, at: float) -> bool:
    return await store.now() > at


async def test_G36_a_failed_retirement_does_not_fail_the_committed_close(
    stores: Callable[[], Store],
) -> None:
    """G-36: when the retirement after a committed close fails (a deadlock victim past
    its retries, a lost connection), the close still returns (it is recorded) and the
    next close of the group retires it."""

    async def quick(_value: object) -> str:
        return "ok"

    async with running(host(stores, quick)) as (h,):
        group = tools_group("live:retire-fails:0", n=1, disposition=LoserPolicy.RUN_TO_COMPLETION)
        handle = await h.open_effect_group(group)
        await asyncio.wait_for(h.await_next_settlement(handle), BOUND)
        real = h.store.retire_closed

        async def broken(_group_key: str) -> bool:
            raise ConnectionResetError("the server went away")

        h.store.retire_closed = broken  # type: ignore[method-assign]
        h.store.close_retire = _close_only(h.store)  # type: ignore[method-assign]
        await h.close_effect_group(handle)
        record = await h.store.get_group(group.key)  # SQLite closes and retires in one
        assert record is None or record.state == "closed"
        h.store.retire_closed = real  # type: ignore[method-assign]
        await h.close_effect_group(handle)
        assert await h.store.retired(group.key) is not None


def _close_only(store: Store) -> Callable[[str, str], Awaitable[tuple[bool, bool]]]:
    """``close_retire`` without its retirement: the close commits, retirement is left to
    the host's separate call."""

    async def close_retire(group_key: str, effective: str) -> tuple[bool, bool]:
        return await store.close(group_key, effective), False

    return close_retire


class _Victim(Exception):
    sqlstate = "40P01"


async def test_G32_postgres_deadlock_victims_run_again_bounded() -> None:
    """G-32: an operation the server rolled back as a deadlock victim (40P01) or a
    serialization failure (40001) runs again, a bounded number of times; any other error
    propagates at once."""
    from effecthost.hosts.sql._postgres import _RETRIES, _retried

    calls = [0]

    @_retried
    async def flaky(fail: int, exc: type[Exception] = _Victim) -> str:
        calls[0] += 1
        if calls[0] <= fail:
            raise exc()
        return "ok"

    assert await flaky(2) == "ok" and calls[0] == 3
    calls[0] = 0
    with pytest.raises(_Victim):
        await flaky(_RETRIES)
    assert calls[0] == _RETRIES
    calls[0] = 0
    with pytest.raises(ValueError):
        await flaky(1, ValueError)
    assert calls[0] == 1


async def test_R1_a_caller_back_between_the_drains_read_and_its_cancel_wins(
    stores: Callable[[], Store],
) -> None:
    """R-1 (seed D11, conditional takeover): a drain read the group as ownerless, then
    the caller reopened before the drain's cancel: the cancel re-checks the owner under
    the group row's lock and writes nothing."""
    async with _owner_gone(stores, "live:race:0") as (back, drainer, group):
        real = drainer.store.unfinished
        handles = []

        async def read_then_reopen() -> Any:
            rows = await real()
            handles.append(await back.open_effect_group(group))  # the caller is back
            return rows

        drainer.store.unfinished = read_then_reopen  # type: ignore[method-assign]
        report = await drainer.drain().run_pass()
        assert not report.cancelled
        assert await back.deliver_event(group.key, "sig", "back") == 1
        first = await asyncio.wait_for(back.await_next_settlement(handles[0]), BOUND)
        assert (first.position, first.outcome.status) == (0, "success")
