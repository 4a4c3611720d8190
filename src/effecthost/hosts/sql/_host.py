"""The SQL host: one design over two substrates (SQLite, PostgreSQL), SPEC §2 and §3.

Tables (one layout for both substrates, with a schema version): ``eh_groups`` (one row per
group: wake, declared and effective disposition, child count, the rank counter, state,
created/closed times), ``eh_children`` (one row per child keyed by replay key: group key,
position, envelope and its hash, state, lease owner, fence token, lease expiry, attempt,
settlement sequence, outcome; ``UNIQUE(group_key, seq)``) and ``eh_retired`` (tombstones
of retired groups, so a late reopen is refused with ``GroupClosed``).

Rank lookup (G-16). Sequences are drawn from the group's counter row, bumped by
``counter = counter + 1 … RETURNING`` inside the finalize transaction only after the fenced
update matched, and rolled back with it; so the sequences of a group are dense
(1, 2, 3…) and in commit order, and a group retires whole (no deletion below a consumed
rank). This host therefore looks rank ``n`` up as sequence ``n`` — a point lookup on
``UNIQUE(group_key, seq)`` — which is the one place it relies on density.

Leases (G-33). Children are claimed under leases owned by ``{node_id}:{uuid4}`` (fresh per
host instance), with expiry on the database clock. One keeper per host renews every lease
it holds in one statement each ``renew_every`` seconds; a lease not returned by a renewal
is lost. Each lease carries a local self-fencing deadline, ``sent + ttl - ttl/6`` of the
last confirmed claim or renewal (``sent`` on the local monotonic clock, taken before the
statement went out); past it the driver is cancelled and writes nothing. A takeover of an
expired lease bumps the fence token, so the old driver's finalize matches no row and bumps
no counter (G-31).

Payloads (G-47…G-50). With ``payloads=PayloadPolicy(...)`` every outcome is encoded with
:func:`~effecthost.payloads.encode_outcome` before the finalize, and the child row's
``outcome`` column holds only the :class:`~effecthost.payloads.StoredOutcome` (inline
plaintext, inline sealed envelope, or a reference). A policy without a store gets this
database's ``eh_payloads`` table, which the retirement transaction empties with the group.
Every read goes through :func:`~effecthost.payloads.decode_outcome` before the handle
advances, so a refusal (no key, wrong key, a value moved to another slot, a shredded key)
raises the typed error and changes nothing. Child envelopes (inputs) stay plaintext.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from effecthost import telemetry
from effecthost._inspect import outcome_status
from effecthost.contract import (
    DrainReport,
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectHostError,
    EffectKind,
    EngineUnavailable,
    ExecutionInput,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    InvalidEnvelope,
    LoserPolicy,
    NoExecutor,
    Outcome,
    PayloadTooLarge,
    Settlement,
    WakePolicy,
    WiredController,
    coerce_disposition,
    is_host_kind,
    kit,
    limits,
    require_group,
    require_handle,
    sleep_durations,
)
from effecthost.payloads import (
    PayloadPolicy,
    decode_outcome,
    encode_outcome,
    event_value,
)

from ._sealing import SealedDeployment, settle_sealing
from ._store import (
    ChildRow,
    ChildSpec,
    Expected,
    Finalize,
    GroupRow,
    OpenGroup,
    RankRead,
    ReplayKeyTaken,
    Sent,
    Store,
)

log = logging.getLogger("effecthost.sql")

DEFAULT_LEASE_TTL = 30.0
DEFAULT_RENEW_EVERY = 10.0
DEFAULT_MAX_PAYLOAD_BYTES = 2 * 1024 * 1024
DEFAULT_OUTAGE_BOUND = 30.0
"""Seconds an open, close or ``deliver_event`` retries an unreachable database before it
raises ``EngineUnavailable`` (R-12)."""
OUTAGE_FIRST_DELAY = 0.05
OUTAGE_MAX_DELAY = 2.0
"""Backoff between tries against an unreachable database: doubling from the first delay
up to the maximum (R-12)."""
_T = TypeVar("_T")

_CANCEL = LoserPolicy.CANCEL.value
_UNREAD: Any = object()  # no commit marker was read for a waiter (SqlEffectHost._mark)
READ_AHEAD = 64
"""Ranks a waiter reads in one range scan; the committed ones past its own are kept for
the next call on that group (dropped when the group closes)."""


@dataclass(eq=False, slots=True)
class _Driver:
    """A child this host runs under a lease it holds."""

    replay_key: str
    group_key: str
    envelope: EffectEnvelope
    envelope_hash: str
    fence: int
    attempt: int
    deadline: float  # local monotonic self-fencing deadline
    position: int  # bound into a sealed outcome's associated data
    task: asyncio.Task[None] | None = None
    started: bool = False  # the task has begun (a cancel before that would skip it whole)
    running: bool = True  # in the executor (cancellable) rather than finalizing
    cancel_requested: bool = False
    lost: bool = False
    cancel_sent: bool = False


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event`` at most ``timeout`` seconds (a cancellation propagates)."""
    if event.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(timeout, 0.001)):
            await event.wait()


class SqlEffectHost(WiredController):
    """A durable host over a :class:`Store` (SQLite or PostgreSQL).

    ``supports_effect_groups()`` is true iff a resolver is registered (G-07). Use
    :func:`effecthost.hosts.sql.sqlite_host` or :func:`effecthost.hosts.sql.postgres_host`
    to build one; :meth:`start` is called on first use if not before.

    Args:
        store: the substrate.
        resolver: the registered ``GroupExecutors`` (G-09), or ``None``.
        node_id: the node part of the lease owner (default: the host name).
        lease_ttl: lease time-to-live in seconds (default 30).
        renew_every: renewal cadence in seconds (default 10); must be under
            ``lease_ttl - lease_ttl / 6``.
        poll_interval: the bound on how long a waiter or the timer loop sleeps without a
            wake-up from this process (cross-process commits on SQLite; a safety net for
            lost notifications on PostgreSQL).
        drain_every: when set, this host's timer loop also runs a drain pass this often.
        payloads: payload references and sealing (G-47…G-50); a policy whose ``store`` is
            ``None`` gets this database's payload table (``eh_payloads``). ``None`` (the
            default) records every outcome inline as plain JSON, as before.
        fault: a test hook called with named points (``claim``, ``finalize:after_update``,
            ``finalize:after_commit``, ``close:before_commit``, ``wake``…).
        outage_bound: how long (seconds) an open, close, ``deliver_event``, a drain pass
            or a listing retries a database it cannot reach before it raises
            ``EngineUnavailable`` (R-12). An await is not bounded by it: it waits with
            backoff until the database is back or its caller's deadline.
    """

    def __init__(
        self,
        store: Store,
        resolver: GroupExecutors | None = None,
        *,
        node_id: str | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        renew_every: float = DEFAULT_RENEW_EVERY,
        poll_interval: float = 0.5,
        drain_every: float | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        payloads: PayloadPolicy | None = None,
        fault: Callable[[str], None] | None = None,
        outage_bound: float = DEFAULT_OUTAGE_BOUND,
    ) -> None:
        if not 0 < renew_every < lease_ttl - lease_ttl / 6:
            raise ValueError("renew_every must be positive and under lease_ttl - lease_ttl/6")
        self.store = store
        self._resolver = resolver
        self.owner = f"{node_id or socket.gethostname()}:{uuid.uuid4()}"
        self.lease_ttl = lease_ttl
        self.renew_every = renew_every
        self.poll_interval = poll_interval
        self.drain_every = drain_every
        self.max_payload_bytes = max_payload_bytes
        if payloads is not None and payloads.store is None:
            payloads = replace(payloads, store=store.payload_store())
        self.payloads = payloads
        self.fault = fault
        self.outage_bound = outage_bound
        self._drivers: dict[str, _Driver] = {}
        # the batched finalize: per group, children waiting to finalize, and the task
        # that drains them (whatever is pending when a transaction ends goes in the next)
        self._pending: dict[str, list[tuple[_Driver, str, asyncio.Future[int | None]]]] = {}
        self._flushers: dict[str, asyncio.Task[None]] = {}
        self._ahead: dict[str, dict[int, RankRead]] = {}  # ranks read ahead, per group
        self._last_record: tuple[GroupRow, kit.GroupRecord] | None = None
        # outcomes this host finalized in groups it owns, with the text it recorded: a
        # waiter that reads that very text back takes the outcome without decoding it
        self._written: dict[str, dict[str, tuple[str, Outcome]]] = {}
        self._changed: dict[str, list[asyncio.Future[None]]] = {}  # waiters per group
        self._watcher: asyncio.Task[None] | None = None  # other processes' commits (SQLite)
        self._markers: dict[asyncio.Future[None], int | None] = {}  # read before a waiter's read
        # groups this host created whose every child it runs under its own fresh lease,
        # and of which nothing has committed since: rank 1 cannot be recorded yet
        self._fresh: dict[str, GroupRow] = {}
        # open groups this incarnation owns (opened or reopened last, R-1): the keeper
        # renews their ownership with the child leases
        self._owned: set[str] = set()
        # owned groups a reopen found decided: their unsettled tool calls stay down
        # until a caller awaits a rank that does not exist yet
        self._held: set[str] = set()
        self._timer_changed = asyncio.Event()
        self._keeper_changed = asyncio.Event()
        self._keeper_idle = False  # the keeper waits for a first lease
        self._urgent = False
        self._background: list[asyncio.Task[None]] = []
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        self._dead = False
        self._seals = payloads is not None and payloads.sealer is not None
        self._plaintext_refused = False  # no sealer, and the deployment is sealed

    # -- wiring and life cycle ------------------------------------------------------------

    def supports_concurrent_effects(self) -> bool:
        return True

    @property
    def self_fence_margin(self) -> float:
        return self.lease_ttl / 6

    async def start(self) -> None:
        """Connect, create or check the schema, start the keeper and timer loops. An
        unreachable database is retried up to :attr:`outage_bound` (R-12).

        Raises:
            EngineUnavailable: the database stayed unreachable past the bound.
            SchemaVersionError: the database records another schema version.
        A host without a sealer on a sealed deployment starts (it reads, and a sealed
        outcome it cannot open is :class:`SealedPayloadUnreadable`) but writes no outcome:
        its opens, drain passes and event deliveries raise :class:`SealedDeployment`, and
        its close records the cancel requests but leaves the cancelled outcomes to a
        sealing writer.
        """
        await self._bounded("start", None, lambda _retried: self._start())

    async def _start(self) -> None:
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("this host was closed")
            await self.store.start()
            try:
                self._plaintext_refused = await settle_sealing(self.store, self._seals)
            except BaseException:
                await self.store.aclose()
                raise
            if self.store.wakes_across_processes:
                await self.store.listen(self._on_remote)
            loop = asyncio.get_running_loop()
            self._background = [
                loop.create_task(self._keeper(), name="effecthost-sql-keeper"),
                loop.create_task(self._timers(), name="effecthost-sql-timers"),
            ]
            self._started = True

    async def _ready(self) -> None:
        if not self._started:
            await self._start()  # inside a call that bounds its own outage

    async def idle(self) -> None:
        """Wait until every child this host runs has finalized (or lost its lease): what a
        one-shot drain process waits for before it exits."""
        while tasks := [
            d.task for d in self._drivers.values() if d.task is not None and not d.task.done()
        ]:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._flushers.values(), return_exceptions=True)

    async def aclose(self) -> None:
        """Stop like a process ending: cancel every child task and loop without writing
        anything (leases simply expire), then close the connections."""
        self._closed = True
        tasks = [d.task for d in self._drivers.values() if d.task is not None]
        tasks += self._background + list(self._flushers.values())
        if self._watcher is not None:
            tasks.append(self._watcher)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._drivers.clear()
        self._background = []
        if self._started:
            await self.store.aclose()
        self._started = False

    async def abandon(self) -> list[asyncio.Task[None]]:
        """Die like a SIGKILLed process, as far as one can inside a process: from now on
        this host writes nothing (no renewal, no finalize, no timer), its connections are
        closed, and its child tasks are *not* cancelled — a killed process runs no
        cancellation handlers. Returns those tasks; whoever abandons them may cancel them
        much later (test tooling does, at its own shutdown)."""
        self._closed = self._dead = True
        if self._watcher is not None:
            self._background.append(self._watcher)
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []
        orphans = [d.task for d in self._drivers.values() if d.task is not None]
        for driver in self._drivers.values():
            driver.lost = True
        self._drivers.clear()
        if self._started:
            await self.store.aclose()
        self._started = False
        return orphans

    def _refuse_plaintext(self) -> None:
        if self._plaintext_refused:
            raise SealedDeployment(_store_name(self.store))

    def _fault(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

    # -- wake-ups -------------------------------------------------------------------------

    def _waiter(self, group_key: str) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._changed.setdefault(group_key, []).append(waiter)
        return waiter

    def _mark(self, waiter: asyncio.Future[None]) -> None:
        """For a store whose other processes cannot notify, when no watcher runs: its
        commit marker, read before ``waiter``'s read, for the watcher :meth:`_sleep` starts
        if that waiter parks (a commit after the read changes a later marker). A running
        watcher already compares against an earlier one."""
        if self.store.change_poll is not None and self._watcher is None and not self._closed:
            self._markers[waiter] = self.store.commit_marker()

    async def _watch(self, marker: int | None, interval: float) -> None:
        """While a waiter is parked, wake every waiter when the store's commit marker
        changes: another process committed something (SQLite cannot notify). A waiter
        woken for another group's commit re-reads and parks again."""
        try:
            while self._changed:
                await asyncio.sleep(interval)
                now = self.store.commit_marker()
                if now is None or now != marker:
                    marker = now
                    for key in [k for k in self._changed if k not in self._fresh]:
                        for waiter in self._changed.pop(key):
                            _wake(waiter)
        finally:
            self._watcher = None

    def _notify(self, group_key: str) -> None:
        self._fresh.pop(group_key, None)
        for waiter in self._changed.pop(group_key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def _forget(self, group_key: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._changed.get(group_key)
        if waiters is not None and waiter in waiters:  # not woken by a commit
            waiters.remove(waiter)
            if not waiters:
                del self._changed[group_key]

    def _on_remote(self, kind: str, group_key: str) -> None:
        """A commit in any process (PostgreSQL LISTEN/NOTIFY)."""
        self._notify(group_key)
        if kind == "c":
            self._ahead.pop(group_key, None)
        if kind == "c" and any(d.group_key == group_key for d in self._drivers.values()):
            self._urgent = True  # a close: learn of cancels now, not at the next tick
            self._keeper_changed.set()

    # -- outages (R-12) ---------------------------------------------------------------------

    async def _bounded(
        self, operation: str, group_key: str | None, call: Callable[[bool], Awaitable[_T]]
    ) -> _T:
        """``call(retried)``, tried again with backoff while the database cannot be reached,
        up to :attr:`outage_bound`; then ``EngineUnavailable``. A driver error never
        leaves. A value the database itself refuses (a NUL byte, an unencodable string, a
        key too long to index) is a typed refusal naming the group only (the driver's
        error, which may quote the value, is dropped; each store operation is one
        transaction, so it wrote nothing); an outage is retried. ``retried`` tells the
        call an earlier try may have committed."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        delay = OUTAGE_FIRST_DELAY
        retried = False
        while True:
            try:
                return await call(retried)
            except EffectHostError:
                raise
            except self.store.input_errors as exc:
                raise _refused(group_key, exc) from None
            except self.store.driver_errors as exc:
                tried = loop.time() - began
                if tried >= self.outage_bound:
                    where = "" if group_key is None else f" of group {group_key!r}"
                    raise EngineUnavailable(
                        f"{operation}{where}: the database was unreachable for {tried:.1f}s "
                        f"({type(exc).__name__}); it may or may not have been done, and "
                        "calling it again is safe",
                        group_key=group_key,
                        operation=operation,
                        tried_for=tried,
                    ) from None
                _outage(operation, group_key, exc, retried)
                await asyncio.sleep(min(delay, self.outage_bound - tried))
                delay = min(delay * 2, OUTAGE_MAX_DELAY)
                retried = True

    # -- open -----------------------------------------------------------------------------

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        key = require_group(group).key
        began = time.monotonic()  # before any try's lease: the self-fencing start (G-33)
        return await self._bounded("open", key, lambda retried: self._open(group, retried, began))

    async def _open(self, group: EffectGroup, retried: bool, began: float) -> GroupHandle:
        """Open or reopen (G-08…G-13, R-1, R-2, R-4, R-6, R-7). Every check of the input
        runs before anything is written; a first open records the group row, owned by
        this incarnation, and all its children in one transaction, so a concurrent open
        of the same key finds either nothing or the whole group and is fenced as a
        reopen. A reopen that passes its fences makes this incarnation the owner in the
        same store operation (on SQLite the same transaction). A ``retried`` open (an
        earlier try may have committed before the database became unreachable, R-12) that
        finds the group recorded is a reopen, and runs the tool calls that try leased to
        this host."""
        self._require_wired(group.key)
        await self._ready()
        self._refuse_plaintext()
        canonical = self._check_sizes(group)
        hashes = [child.envelope_hash() for child in group.children]  # kept by the group
        specs = self._specs(group, canonical, hashes)
        executors: list[EffectExecutor | None] | None = None

        def resolve_all() -> None:  # first open only, before anything is written (G-10)
            nonlocal executors
            executors = self._resolve_all(group)

        def fence(record: GroupRow, rows: tuple[ChildRow, ...]) -> None:
            # a reopen (or the loser of a concurrent first open), before it takes the
            # group over: a refused reopen changes no owner
            kit.check_reopen(kit.Offer.of(group, hashes), _known(record), _recorded(rows))

        stamp = Sent()
        before = time.monotonic()
        try:
            opened = await self.store.open_group(
                group.key,
                group.wake.value,
                group.disposition.value,
                group.child_count,
                specs,
                self.owner,
                self.lease_ttl,
                resolve_all,
                reopen=fence,
                sent=stamp,
                trace_context=telemetry.group_context(),  # None while telemetry is off
            )
        except ReplayKeyTaken as taken:
            raise kit.replay_key_taken(
                group.key, taken.position, taken.replay_key, taken.holder
            ) from None
        record = opened.group
        if record is None or record.state == "closed":  # a closed key stays closed
            raise kit.group_closed(group.key)
        self._owned.add(group.key)  # this incarnation is the caller now
        if self._keeper_idle:
            self._keeper_changed.set()
        if opened.created:
            self._fault("open:created")
            sent = before if stamp.at is None else stamp.at
            self._start_children(group, specs, executors, record, sent)
            return group.handle()
        if await self._decided(record):
            self._held.add(group.key)  # its losers stay down
        else:
            self._held.discard(group.key)
        if retried:
            self._run_own_leases(group, opened.children, began)
        await self._resume_children(group, specs, opened.children)
        return group.handle()

    async def _decided(self, record: GroupRow) -> bool:
        """R-13: ``CANCEL`` in force and the wake policy met (the kit's rule). A success
        this host cannot read (sealed, and no key here) does not count."""
        known = _known(record)
        if not kit.decided_kind(known) or record.counter < 1:
            return False
        if known.wake is WakePolicy.FIRST:
            return True
        got = await self.store.read_ranks(record.group_key, 1, record.counter)
        statuses: list[str] = []
        for seq, position, replay_key, recorded in got[1] if got is not None else []:
            status, _sealed = outcome_status(recorded)
            if status not in ("success", "error", "cancelled"):
                try:
                    outcome = await self._decode(
                        record.group_key, replay_key, position, seq, recorded
                    )
                except EffectHostError:
                    continue
                status = outcome.status
            statuses.append(status)
        return kit.decided(known, statuses)

    def _run_own_leases(self, group: EffectGroup, rows: tuple[ChildRow, ...], sent: float) -> None:
        """The tool calls an earlier try of this open recorded under this host's lease
        and never started (its reply was lost, R-12): run them under that lease, as the
        first open would have. ``sent`` is when the first try began, before any lease it
        recorded, so the self-fencing deadline comes no later than the lease's (G-33)."""
        for row in rows:
            if (
                row.kind == EffectKind.TOOL_CALL
                and row.state == "claimed"
                and row.lease_owner == self.owner
                and not row.lease_expired
                and not row.cancel_requested
                and row.replay_key not in self._drivers
            ):
                envelope = group.children[row.position]
                executor = self._resolve(envelope)
                if executor is not None:
                    self._dispatch(
                        envelope, executor, row.fence, row.attempt, sent, row.envelope_hash
                    )

    def _check_sizes(self, group: EffectGroup) -> list[bytes]:
        """Every child's canonical bytes (encoded once per open), each within the limit."""
        canonical = [child.canonical_bytes() for child in group.children]
        for position, child in enumerate(group.children):
            size = len(canonical[position])
            if size > self.max_payload_bytes:
                raise PayloadTooLarge(
                    f"child {child.replay_key!r} of group {group.key!r} encodes to {size} "
                    f"bytes, over the limit of {self.max_payload_bytes}",
                    group_key=group.key,
                    replay_key=child.replay_key,
                    position=position,
                )
        return canonical

    @staticmethod
    def _specs(group: EffectGroup, canonical: list[bytes], hashes: list[str]) -> list[ChildSpec]:
        """The child rows of a first open: tool calls leased to this host (a first open
        resolves them all), host-run kinds unleased. Checks every sleep (G-10).

        Raises:
            InvalidEnvelope: a malformed ``sleep`` child (names its position).
        """
        durations = sleep_durations(group)
        return [
            ChildSpec(
                replay_key=envelope.replay_key,
                position=position,
                kind=envelope.kind,
                name=envelope.name,
                envelope=canonical[position].decode(),
                envelope_hash=hashes[position],
                claim=envelope.kind == EffectKind.TOOL_CALL,
                sleep_seconds=durations[position],
            )
            for position, envelope in enumerate(group.children)
        ]

    def _resolve_all(self, group: EffectGroup) -> list[EffectExecutor | None]:
        """First open: resolve every child before recording anything (G-10); the host
        runs ``sleep`` and ``await_event`` itself (G-51)."""
        return kit.resolve_first_open(group, self._resolve, skip=lambda _p, c: is_host_kind(c))

    def _resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        if self._resolver is None:
            return None
        return self._resolver.resolve(envelope)

    def _start_children(
        self,
        group: EffectGroup,
        specs: list[ChildSpec],
        executors: list[EffectExecutor | None] | None,
        record: GroupRow,
        sent: float,
    ) -> None:
        """A first open recorded every child; run the tool calls under the leases it
        recorded (fence 1) with the executors it resolved."""
        assert executors is not None
        if all(spec.claim for spec in specs):
            self._fresh[group.key] = record  # nothing of it can commit but through us
        for spec, envelope, executor in zip(specs, group.children, executors, strict=True):
            if spec.claim and executor is not None:
                self._dispatch(
                    envelope, executor, fence=1, attempt=1, sent=sent, digest=spec.envelope_hash
                )
        if any(spec.sleep_seconds is not None for spec in specs):
            self._timer_changed.set()

    async def _resume_children(
        self, group: EffectGroup, specs: list[ChildSpec], rows: tuple[ChildRow, ...]
    ) -> None:
        """Reopen: dispatch what this host can run and nobody holds; a reopen resolves
        only what it dispatches and refuses nothing (G-11). A group an older release
        recorded without all its children gets the missing rows, fenced as above. The
        tool calls of a decided group (``_held``) stay down: an await of a rank that does
        not exist yet takes them over (R-13)."""
        have = {row.position for row in rows}
        missing = [spec for spec in specs if spec.position not in have]
        if missing:
            missing = [replace(spec, claim=False) for spec in missing]
            await self.store.insert_children(group.key, missing, self.owner, self.lease_ttl)
            rows = tuple(await self.store.children(group.key))
            hashes = [spec.envelope_hash for spec in specs]
            kit.check_children(kit.Offer.of(group, hashes), _recorded(rows))
            if len(rows) != group.child_count:
                taken = next(s for s in missing if s.position not in {r.position for r in rows})
                raise kit.replay_key_taken(group.key, taken.position, taken.replay_key, None)
            if any(spec.sleep_seconds is not None for spec in missing):
                self._timer_changed.set()
        for row in rows:
            if (
                row.state == "settled"
                or row.kind != EffectKind.TOOL_CALL
                or row.replay_key in self._drivers
            ):
                continue
            envelope = group.children[row.position]
            if row.cancel_requested:
                await self._settle_free(
                    row.group_key, row.replay_key, row.position, Outcome.cancelled()
                )
                continue
            if group.key in self._held:
                continue
            executor = self._resolve(envelope)
            if executor is not None:
                await self._claim_and_dispatch(envelope, executor)

    # -- drivers --------------------------------------------------------------------------

    async def _claim_and_dispatch(self, envelope: EffectEnvelope, executor: EffectExecutor) -> bool:
        """Conditional takeover through the child's own lease (G-33, G-34). The
        self-fencing deadline counts from when the claim statement went out, not from
        any wait for a connection or a lock before it (seed D11)."""
        stamp = Sent()
        before = time.monotonic()
        claim = await self.store.claim(envelope.replay_key, self.owner, self.lease_ttl, stamp)
        if claim is None:
            return False
        self._fault("claim")
        sent = before if stamp.at is None else stamp.at
        driver = self._dispatch(envelope, executor, claim.fence, claim.attempt, sent)
        if claim.cancel_requested:
            driver.cancel_requested = True
            self._cancel_driver(driver)
        return True

    def _dispatch(
        self,
        envelope: EffectEnvelope,
        executor: EffectExecutor,
        fence: int,
        attempt: int,
        sent: float,
        digest: str | None = None,
    ) -> _Driver:
        assert envelope.membership is not None
        driver = _Driver(
            replay_key=envelope.replay_key,
            group_key=envelope.membership.group_key,
            envelope=envelope,
            envelope_hash=digest or envelope.envelope_hash(),
            fence=fence,
            attempt=attempt,
            deadline=sent + self.lease_ttl - self.self_fence_margin,
            position=envelope.membership.position,
        )
        self._drivers[driver.replay_key] = driver
        driver.task = asyncio.get_running_loop().create_task(
            self._drive(driver, executor), name=f"effecthost-child:{driver.replay_key}"
        )
        if self._keeper_idle:  # a busy keeper already wakes before this lease's deadline
            self._keeper_changed.set()
        return driver

    async def _drive(self, driver: _Driver, executor: EffectExecutor) -> None:
        driver.started = True
        finalized = False
        seq: int | None = None
        telemetry.rank_later()  # the finalize below gives the child's span its rank
        try:
            if driver.lost:
                return  # lost before it ran: write nothing (G-33)
            try:
                if driver.cancel_requested:  # cancelled before it ran (G-27)
                    raise asyncio.CancelledError
                outcome = await executor.execute(ExecutionInput(driver.envelope, driver.attempt))
            except asyncio.CancelledError:
                if not driver.cancel_requested or driver.lost:
                    raise  # lease lost or host going away: write nothing
                outcome = Outcome.cancelled()
            except EffectHostError as exc:
                outcome = Outcome.failure(type(exc).__name__, str(exc))
            driver.running = False
            if self._dead:
                return  # this incarnation is gone: write nothing
            if driver.lost or time.monotonic() >= driver.deadline:
                log.warning("lease on %s lost or past its deadline: not finalizing", driver)
                return  # self-fenced: write nothing (G-33)
            recorded = await self._encode(
                driver.group_key, driver.replay_key, driver.position, outcome
            )
            if self._dead or driver.lost or time.monotonic() >= driver.deadline:
                return  # self-fenced while encoding: write nothing (G-33)
            seq = await self._finalize(driver, recorded)
            if seq is not None:
                finalized = True
                if (
                    self.payloads is None
                    and type(outcome) is Outcome
                    and driver.group_key in self._owned
                ):
                    written = self._written.setdefault(driver.group_key, {})
                    written[driver.replay_key] = (recorded, outcome)
                self._fault("wake")
                self._notify(driver.group_key)
        except Exception:
            # ended without an outcome (a store error): give the lease back so another
            # driver takes the child at once, rather than leaving it to expire
            if not self._dead and not driver.lost:
                with contextlib.suppress(Exception):
                    await self.store.release(self.owner, driver.replay_key, driver.fence)
            raise
        finally:
            telemetry.ranked(driver.group_key, driver.position, seq)
            self._fresh.pop(driver.group_key, None)  # finalized, or never will be here
            if self._drivers.get(driver.replay_key) is driver:
                del self._drivers[driver.replay_key]
            if not finalized and not self._dead:
                # another driver may settle the child, in another process: the waiters
                # re-read without it among this host's own children (G-21)
                self._notify(driver.group_key)

    async def _finalize(self, driver: _Driver, outcome: str) -> int | None:
        """Queue the child's finalize with its group's and wait for the sequence. Children
        of one group that settle while a finalize of that group is being written go
        together in the next transaction (:meth:`_flush`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int | None] = loop.create_future()
        self._pending.setdefault(driver.group_key, []).append((driver, outcome, future))
        if driver.group_key not in self._flushers:
            self._flushers[driver.group_key] = loop.create_task(
                self._flush(driver.group_key), name=f"effecthost-finalize:{driver.group_key}"
            )
        return await future

    async def _flush(self, group_key: str) -> None:
        """Drain a group's pending finalizes, one transaction per round: a lone child
        through the single-child finalize, several through the batched one (each child
        still through its own fenced update; one counter bump for those that matched).
        The self-fencing deadline is checked again when the round is taken."""
        outage = OUTAGE_FIRST_DELAY
        try:
            while batch := self._pending.pop(group_key, None):
                live = []
                now = time.monotonic()
                for entry in batch:
                    driver, _outcome, future = entry
                    if self._dead or driver.lost or now >= driver.deadline:
                        if not self._dead:
                            log.warning("lease on %s lost or past its deadline", driver)
                        if not future.done():
                            future.set_result(None)  # self-fenced: write nothing (G-33)
                    else:
                        live.append(entry)
                if not live:
                    continue
                try:
                    if len(live) == 1:
                        driver, outcome, _future = live[0]
                        seqs = [
                            await self.store.finalize(
                                driver.replay_key,
                                driver.envelope_hash,
                                self.owner,
                                driver.fence,
                                outcome,
                            )
                        ]
                    else:
                        seqs = await self.store.finalize_many(
                            self.owner,
                            [
                                Finalize(d.replay_key, d.envelope_hash, d.fence, o)
                                for d, o, _ in live
                            ],
                        )
                except self.store.driver_errors as exc:
                    if self._dead or isinstance(exc, self.store.input_errors):
                        for _driver, _outcome, future in live:
                            if not future.done():
                                future.set_exception(exc)
                        continue
                    # the database is unreachable: the same fenced finalizes again, while
                    # their leases last (the loop's deadline check fences them after);
                    # one that committed unseen is fenced off, never recorded twice
                    _outage("finalize", group_key, exc, retried=outage > OUTAGE_FIRST_DELAY)
                    self._pending[group_key] = live + self._pending.get(group_key, [])
                    await asyncio.sleep(outage)
                    outage = min(outage * 2, OUTAGE_MAX_DELAY)
                    continue
                except Exception as exc:
                    for _driver, _outcome, future in live:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                outage = OUTAGE_FIRST_DELAY
                for (_driver, _outcome, future), seq in zip(live, seqs, strict=True):
                    if not future.done():
                        future.set_result(seq)
                matched = [
                    d.replay_key for (d, _o, _f), q in zip(live, seqs, strict=True) if q is not None
                ]
                hints = self.store.open_at_finalize
                still_open = bool(hints) and all(key in hints for key in matched)
                if hints:
                    hints.difference_update(d.replay_key for d, _o, _f in live)
                if matched and not still_open and not self._dead:
                    await self._maybe_retire(group_key)  # once per transaction
        finally:
            if self._flushers.get(group_key) is asyncio.current_task():
                del self._flushers[group_key]
            if group_key not in self._flushers:
                for _driver, _outcome, future in self._pending.pop(group_key, []):
                    future.cancel()

    def _cancel_driver(self, driver: _Driver) -> None:
        """Cancel the child's task once: a second ``cancel()`` would interrupt the
        executor's own cancellation handler. A task that has not begun is not cancelled
        (it would never run its handlers: no outcome, no deregistration); it reads
        ``cancel_requested`` / ``lost`` when it begins."""
        if driver.running and not driver.cancel_sent and driver.task is not None:
            driver.cancel_sent = True
            if driver.started:
                driver.task.cancel()

    def _lose(self, driver: _Driver) -> None:
        """The driver's lease is gone (or past its deadline): it writes nothing, and
        whoever takes the child over may finalize it in another process, so the group's
        waiters re-read now, without it among their host's own children (G-21)."""
        driver.lost = True
        self._cancel_driver(driver)
        self._notify(driver.group_key)

    async def _keeper(self) -> None:
        """Renew every lease this host holds, one statement per tick; cancel drivers
        whose lease is gone or past its self-fencing deadline (they write nothing)."""
        next_renew = time.monotonic() + self.renew_every
        while True:
            now = time.monotonic()
            for driver in list(self._drivers.values()):
                if now >= driver.deadline and not driver.lost:
                    self._lose(driver)
            if not self._drivers and not self._owned:
                self._keeper_changed.clear()
                self._keeper_idle = True
                try:
                    await self._keeper_changed.wait()
                finally:
                    self._keeper_idle = False
                next_renew = max(next_renew, time.monotonic() + self.renew_every / 2)
                continue
            wake_at = min([next_renew] + [d.deadline for d in self._drivers.values()])
            if not self._drivers and not self._urgent:
                wake_at = next_renew
            if wake_at > now and not self._urgent:
                self._keeper_changed.clear()
                await _wait(self._keeper_changed, wake_at - now)
                if time.monotonic() < next_renew and not self._urgent:
                    continue
            self._urgent = False
            # only children with a live driver are renewed: a lease whose driver ended
            # without an outcome expires and is taken over
            held = {k: d for k, d in self._drivers.items() if d.task is None or not d.task.done()}
            owned = sorted(self._owned)
            stamp = Sent()
            before = time.monotonic()
            next_renew = before + self.renew_every
            try:
                renewed, still_owned = await self.store.renew(
                    self.owner, self.lease_ttl, sorted(held), owned, stamp
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # the store is unreachable: the deadlines will fence
                log.warning("lease renewal failed", exc_info=True)
                continue
            sent = before if stamp.at is None else stamp.at
            for key in set(owned) - set(still_owned):  # closed, or reopened elsewhere
                self._owned.discard(key)
                self._held.discard(key)
                self._written.pop(key, None)
            still = {r.replay_key: r for r in renewed}
            for key, driver in held.items():
                r = still.get(key)
                if r is None or r.fence != driver.fence:
                    if self._drivers.get(key) is driver and driver.running:
                        self._lose(driver)
                    continue
                driver.deadline = sent + self.lease_ttl - self.self_fence_margin
                if r.cancel_requested and not driver.cancel_requested:
                    driver.cancel_requested = True
                    self._cancel_driver(driver)

    # -- timers ---------------------------------------------------------------------------

    async def _timers(self) -> None:
        """Fire due ``sleep`` children at their recorded due time on the database clock
        (G-51), in whichever process runs this loop; optionally run drain passes."""
        last_drain = time.monotonic()
        while True:
            try:
                for row in () if self._plaintext_refused else await self.store.due_sleeps():
                    outcome = Outcome.cancelled() if row.cancel_requested else Outcome.success()
                    await self._settle_free(row.group_key, row.replay_key, row.position, outcome)
                if (
                    self.drain_every is not None
                    and time.monotonic() - last_drain >= self.drain_every
                ):
                    last_drain = time.monotonic()
                    await self.drain().run_pass()
                due = await self.store.next_due()
                wait = self.poll_interval * 2
                if due is not None:
                    wait = min(wait, max(0.005, due - await self.store.now()))
                if self.drain_every is not None:
                    wait = min(wait, self.drain_every)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("timer loop error", exc_info=True)
                wait = self.poll_interval
            self._timer_changed.clear()
            await _wait(self._timer_changed, wait)

    async def _settle_free(
        self,
        group_key: str,
        replay_key: str,
        position: int,
        outcome: Outcome,
        orphan: bool = False,
    ) -> bool:
        recorded = await self._encode(group_key, replay_key, position, outcome)
        seq = await self.store.settle_free(replay_key, self.owner, recorded, orphan)
        if seq is None:
            return False
        self._notify(group_key)
        await self._maybe_retire(group_key)
        return True

    async def _maybe_retire(self, group_key: str) -> None:
        """Retire the group when it is closed and settled. Best effort: what committed
        before it (a close, a finalize) stands, and whichever finalize or close of the
        group comes next tries again."""
        try:
            retired = await self.store.retire_closed(group_key)
        except Exception:
            log.warning("retirement of %r failed; a later write retries", group_key, exc_info=True)
            return
        if retired:
            self._notify(group_key)

    # -- payloads (G-47…G-50) ----------------------------------------------------------------

    async def _encode(
        self, group_key: str, replay_key: str, position: int, outcome: Outcome
    ) -> str:
        """What the child row's ``outcome`` column records: the outcome's JSON without a
        payload policy (unchanged), else its :class:`StoredOutcome` (sealed when the policy
        seals; above the threshold the bytes go to the payload store first)."""
        self._refuse_plaintext()
        if self.payloads is None:
            return outcome.model_dump_json()
        stored = await encode_outcome(
            self.payloads, group_key, replay_key, outcome, position=position
        )
        return stored.model_dump_json()

    async def _decode(
        self, group_key: str, replay_key: str, position: int, rank: int, recorded: str | bytes
    ) -> Outcome:
        """The outcome a child row records, opened with this host's policy. Reads only.

        Raises:
            SealedPayloadUnreadable, PayloadShredded, PayloadMissing: as
                :func:`~effecthost.payloads.decode_outcome` (ids only), also for a row
                that is not a well-formed record.
        """
        if self.payloads is None and isinstance(recorded, str):
            written = self._written.get(group_key)
            mine = written.pop(replay_key, None) if written is not None else None
            if mine is not None and mine[0] == recorded:
                return mine[1]  # the very text this host encoded from that outcome
            if not recorded.startswith('{"form"'):
                with contextlib.suppress(ValueError, RecursionError):
                    return Outcome.model_validate_json(recorded)  # the default path
        # a stored form, a plain outcome under a policy (still shape-guarded, ADR 0130 D2)
        # or a malformed row: decode_outcome refuses it typed
        return await decode_outcome(
            self.payloads, group_key, replay_key, recorded, position=position, rank=rank
        )

    # -- consume --------------------------------------------------------------------------

    async def _tombstone(self, group_key: str) -> kit.Tombstone | None:
        """What the host knows of a key with no group row: closed and retired, or never."""
        return kit.Tombstone(group_key) if await self.store.retired(group_key) else None

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        """As the contract says; an unreachable database is waited out with backoff (only
        the caller's own deadline ends the wait, R-12). Trying again is safe: the handle
        advances only when a rank is served."""
        key = require_handle(handle).group_key
        delay = OUTAGE_FIRST_DELAY
        retried = False
        while True:
            try:
                return await self._await_next(handle)
            except EffectHostError:
                raise
            except self.store.input_errors as exc:
                raise _refused(key, exc) from None
            except self.store.driver_errors as exc:
                _outage("await", key, exc, retried)
                await asyncio.sleep(delay)
                delay = min(delay * 2, OUTAGE_MAX_DELAY)
                retried = True

    async def _await_next(self, handle: GroupHandle) -> Settlement:
        self._require_wired(handle.group_key)
        await self._ready()
        rank = handle.consumed + 1
        ahead = self._ahead.get(handle.group_key)
        read = ahead.get(rank) if ahead is not None else None
        if read is not None:
            # committed, and read by an earlier range scan: served without a waiter
            self._pop_ahead(handle.group_key, rank)
            return await self._serve(handle, rank, read)
        adopt_at = time.monotonic() + self.renew_every
        while True:
            waiter = self._waiter(handle.group_key)  # taken before the read: no lost wake-up
            try:
                fresh = self._fresh.get(handle.group_key) if rank == 1 else None
                if fresh is not None:
                    # nothing of this group has committed yet, and only this host's leases
                    # can commit it: wait for that commit (or the bound) without a read
                    kit.check_handle(handle.group_key, handle, _known(fresh))
                    await self._sleep(waiter)
                    self._fresh.pop(handle.group_key, None)
                    continue
                self._mark(waiter)
                # rank n is sequence n: dense, commit-ordered sequences (see the module doc)
                read = await self._read_rank(handle.group_key, rank)
                if read is None:
                    known = await self._tombstone(handle.group_key)
                    kit.check_await(handle.group_key, handle, known)  # R-2's order
                    raise AssertionError("unreachable: no record and no refusal")
                if read.replay_key is not None and read.outcome is not None:
                    return await self._serve(handle, rank, read)
                kit.check_await(handle.group_key, handle, self._record(read.group))
                if time.monotonic() >= adopt_at or handle.group_key in self._held:
                    self._held.discard(handle.group_key)  # the losers run on demand
                    adopt_at = time.monotonic() + self.renew_every
                    if await self._adopt(handle.group_key):
                        continue
                await self._sleep(waiter)
            finally:
                self._markers.pop(waiter, None)
                self._forget(handle.group_key, waiter)

    async def _serve(self, handle: GroupHandle, rank: int, read: RankRead) -> Settlement:
        """Rank ``rank`` as ``read`` records it, once R-2's checks pass against the group
        row read with it; decoded before the handle advances: a refusal leaves it
        (G-49)."""
        kit.check_await(handle.group_key, handle, self._record(read.group))  # R-2's order
        assert read.replay_key is not None and read.outcome is not None
        assert read.position is not None
        outcome = await self._decode(
            handle.group_key, read.replay_key, read.position, rank, read.outcome
        )
        settlement = Settlement.recorded(rank, read.position, read.replay_key, outcome)
        handle.consumed = rank
        return settlement

    def _record(self, row: GroupRow) -> kit.GroupRecord:
        """:func:`_known` of ``row``, kept for the last row: the ranks of one range scan
        share their group row."""
        last = self._last_record
        if last is not None and last[0] is row:
            return last[1]
        record = _known(row)
        self._last_record = (row, record)
        return record

    async def _adopt(self, group_key: str) -> bool:
        """Take over the waited-on group's tool calls whose lease expired (G-33): a
        restarted caller that reopened within the lease TTL, or this host's own driver
        that lost its lease, would otherwise leave the rank to an external drain. True
        when something was taken over or settled."""
        acted = False
        for row in await self.store.children(group_key):
            if (
                row.state == "settled"
                or not row.lease_expired
                or row.replay_key in self._drivers
                or (row.kind != EffectKind.TOOL_CALL and not row.cancel_requested)
            ):
                continue  # sleeps fire from the timer loop, event waits on delivery
            if row.cancel_requested:
                acted |= await self._settle_free(
                    group_key, row.replay_key, row.position, Outcome.cancelled()
                )
                continue
            envelope = EffectEnvelope.model_validate(json.loads(row.envelope))
            executor = self._resolve(envelope)
            if executor is not None and await self._claim_and_dispatch(envelope, executor):
                acted = True
        return acted

    async def _sleep(self, waiter: asyncio.Future[None]) -> None:
        """Until a commit of the group here (or a notification) wakes ``waiter``, at most
        the poll bound (cross-process commits on SQLite; lost notifications). A marker
        :meth:`_mark` read for the waiter starts the watcher of other processes' commits
        when none runs; without one only this process wakes the waiter (a group nothing
        but this host's own leases can settle)."""
        marker = self._markers.pop(waiter, _UNREAD)
        if not waiter.done():
            interval = self.store.change_poll
            if (
                marker is not _UNREAD
                and interval is not None
                and self._watcher is None
                and not self._closed
            ):
                self._watcher = asyncio.get_running_loop().create_task(
                    self._watch(marker, interval), name="effecthost-sql-watch"
                )
            bound = self.poll_interval * (10 if self.store.wakes_across_processes else 1)
            timer = asyncio.get_running_loop().call_later(bound, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()

    async def _read_rank(self, group_key: str, rank: int) -> RankRead | None:
        """Rank ``rank`` (sequence ``rank``): from what an earlier range scan read ahead,
        else one range scan of up to :data:`READ_AHEAD` sequences. A settled rank never
        changes (G-15), so a rank read ahead is what a later point lookup would return;
        what was read ahead is dropped when the group closes."""
        if group_key in self._ahead:
            read = self._pop_ahead(group_key, rank)
            if read is not None:
                return read
        if self.store.wakes_across_processes:
            # the children whose finalizes wake this waiter in-process; the store has the
            # group notified when another may settle it (G-21)
            local = [
                key for key, d in self._drivers.items() if d.group_key == group_key and not d.lost
            ]
            got = await self.store.read_ranks(group_key, rank, READ_AHEAD, local)
        else:
            got = await self.store.read_ranks(group_key, rank, READ_AHEAD)
        if got is None:
            return None
        group, found = got
        reads = {seq: RankRead(group, pos, key, out) for seq, pos, key, out in found}
        read = reads.pop(rank, None) or RankRead(group, None, None, None)
        if reads and group.state == "open":
            self._ahead.setdefault(group_key, {}).update(reads)
        return read

    def _pop_ahead(self, group_key: str, rank: int) -> RankRead | None:
        ahead = self._ahead[group_key]
        read = ahead.pop(rank, None)
        if not ahead:
            del self._ahead[group_key]
        return read

    async def settlement_order(self, group_key: str) -> list[int]:
        limits.check_key(group_key, what="the group key of settlement_order")
        self._require_wired(group_key)

        async def read(_retried: bool) -> list[int]:
            await self._ready()
            if await self.store.get_group(group_key) is None:
                raise kit.unknown_group(group_key)
            order = await self.store.settlement_order(group_key)
            # retirement deletes the children between the two reads: unknown, never [] (G-22)
            if await self.store.get_group(group_key) is None:
                raise kit.unknown_group(group_key)
            return order

        return await self._bounded("settlement_order", group_key, read)

    async def open_group_keys(self) -> list[str]:
        return [g.group_key for g in await self.open_groups()]

    async def open_groups(self) -> list[OpenGroup]:
        """Open groups with their age (database clock) and counts (G-30, inspection)."""

        async def read(_retried: bool) -> list[OpenGroup]:
            await self._ready()
            return await self.store.open_groups()

        return await self._bounded("open_groups", None, read)

    # -- close ----------------------------------------------------------------------------

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        disposition = coerce_disposition(require_handle(handle).group_key, disposition)

        await self._bounded(
            "close", handle.group_key, lambda retried: self._close(handle, disposition, retried)
        )

    async def _close(
        self, handle: GroupHandle, disposition: LoserPolicy | None, retried: bool = False
    ) -> None:
        """A ``retried`` close (an earlier try may have committed, R-12) that finds the
        group closed is a no-op that finishes what that try left: the cancels of a
        ``CANCEL`` close and the retirement."""
        self._require_wired(handle.group_key)
        await self._ready()
        key = handle.group_key
        target: LoserPolicy | None = None
        already = False

        def decide(record: GroupRow | None, tombstone: str | None) -> str | None:
            """Refusals raise before anything is written; ``None``: nothing to write."""
            nonlocal target, already
            if record is not None:
                known: kit.Known = _known(record)
            else:
                known = kit.Tombstone(key) if tombstone is not None else None
            target = kit.check_close(key, handle, known, disposition)
            already = target is None and record is not None
            return None if target is None else target.value

        # closed, and retired in the same transaction when every child has settled; an
        # open group's disposition in force is its declared one, so a handle that matches
        # it predicts the close
        try:
            expect: Expected | None = Expected(
                handle.child_count,
                WakePolicy(handle.wake).value,
                LoserPolicy(handle.disposition).value,
                kit.narrow(key, handle.disposition, disposition).value,
            )
        except (EffectHostError, ValueError):
            expect = None  # a widening: the record decides which refusal comes first
        row, recorded, done = await self.store.close_group(key, decide, expect)
        # closed (or found closed or retired): nothing left to own. A refused close raised
        # above and the group stays this caller's
        self._owned.discard(key)
        self._held.discard(key)
        self._written.pop(key, None)
        if already:
            if retried and row is not None and row.effective == _CANCEL:
                await self._cancel_unsettled(key)
            await self._maybe_retire(key)
            return
        if target is None:
            return  # retired before: the tombstone answered
        self._ahead.pop(key, None)
        self._notify(key)
        if done or not recorded:
            return
        if target is LoserPolicy.CANCEL:
            await self._cancel_unsettled(key)
        await self._maybe_retire(key)

    async def _cancel_unsettled(self, group_key: str) -> None:
        """The cancels are durable (``cancel_requested``); act on them where this host can:
        its own drivers are cancelled, free children (timers, event waits, expired
        leases) are settled as cancelled. Children leased by another live process learn
        of it at their next renewal (or at once, by NOTIFY, on PostgreSQL). Does not
        wait for a loser to stop (G-27)."""
        for row in await self.store.children(group_key):
            if row.state == "settled":
                continue
            driver = self._drivers.get(row.replay_key)
            if driver is not None:
                driver.cancel_requested = True
                self._cancel_driver(driver)
            elif row.lease_expired and not self._plaintext_refused:
                # (in a sealed deployment without a sealer: a sealing drain settles it)
                await self._settle_free(
                    group_key, row.replay_key, row.position, Outcome.cancelled()
                )

    # -- events ---------------------------------------------------------------------------

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        """Durably settle the unsettled ``await_event`` children named ``name`` (G-51):
        works whether or not the process that opened the group is alive."""

        return await self._bounded(
            "deliver_event",
            group_key,
            lambda _retried: self._deliver_event(group_key, name, payload),
        )

    async def _deliver_event(self, group_key: str, name: str, payload: Any) -> int:
        self._require_wired(group_key)
        await self._ready()
        value = event_value(group_key, name, payload)
        record = await self.store.get_group(group_key)
        if record is None:
            if await self.store.retired(group_key) is not None:
                return 0
            raise kit.unknown_group(group_key)
        reached = 0
        for row in await self.store.children(group_key):
            if row.kind == EffectKind.AWAIT_EVENT and row.name == name and row.state != "settled":
                if await self._settle_free(
                    group_key, row.replay_key, row.position, Outcome.success(value)
                ):
                    reached += 1
        return reached

    # -- drain ----------------------------------------------------------------------------

    def drain(self) -> SqlDrain:
        return SqlDrain(self)


class SqlDrain(GroupDrain):
    """Finishes children whose driver is gone (G-29, G-34, G-12, R-1).

    A pass reads every unsettled child; children under a live lease are someone's and
    are skipped, and so is every child of an open group whose owner (the incarnation that
    last opened it) still holds its claim: its caller is live (R-1), and its host-run
    children (``sleep``, ``await_event``) are its own like its tool calls. The others are
    claimed through their own lease (a conditional takeover that bumps the fence, so two
    drain workers never both finalize one child) and the disposition recorded on the
    group is applied: ``CANCEL`` settles them as cancelled (even when no close came, once
    the owner is gone), ``RUN_TO_COMPLETION`` re-runs them through the registered
    resolver; due timers fire. The owner's own drain acts as the owner: it re-runs its
    expired tool calls (not those of a group its reopen found decided: they stay down
    until its caller awaits them, R-13) and cancels nothing the caller has not closed. A
    child the
    resolver cannot run is reported ``NoExecutor`` and stays visible; a host without a
    resolver reports every unfinished child so.
    """

    def __init__(self, host: SqlEffectHost) -> None:
        self.host = host

    async def run_pass(self) -> DrainReport:
        """One pass; a database outage is retried up to the host's ``outage_bound``,
        then ``EngineUnavailable`` (R-12). A pass tried again redoes only what the
        fenced claims still allow."""
        return await self.host._bounded("drain", None, lambda _retried: self._pass())

    async def _pass(self) -> DrainReport:
        host = self.host
        await host._ready()
        if not host._seals and not host._plaintext_refused:
            # a deployment sealed since this host started (a sealing host started since)
            host._plaintext_refused = await settle_sealing(host.store, False)
        host._refuse_plaintext()
        resumed: list[tuple[str, str]] = []
        cancelled: list[tuple[str, str]] = []
        missing: list[NoExecutor] = []
        for row in await host.store.unfinished():
            ids = (row.group_key, row.replay_key)
            if host._resolver is None:
                if not (row.owner_live and row.group_owner != host.owner):
                    missing.append(_no_executor(row, kit.NO_RESOLVER))
                continue  # a live caller's children are its own, not missing
            if row.replay_key in host._drivers or not row.lease_expired:
                continue
            if row.owner_live and row.group_owner != host.owner:
                continue  # a live caller's group
            gone = not row.owner_live  # closed, or its owner's claim expired
            if row.cancel_requested or (gone and row.effective == _CANCEL):
                # a declared CANCEL applies only while the owner is still gone
                orphan = not row.cancel_requested
                cancel = Outcome.cancelled()
                if await host._settle_free(
                    row.group_key, row.replay_key, row.position, cancel, orphan
                ):
                    cancelled.append(ids)
                continue
            if row.kind == EffectKind.SLEEP:
                if row.due_at is not None and row.due_at <= await host.store.now():
                    if await host._settle_free(
                        row.group_key, row.replay_key, row.position, Outcome.success()
                    ):
                        resumed.append(ids)
                continue
            if row.kind == EffectKind.AWAIT_EVENT:
                continue  # settles when its event is delivered
            if row.group_key in host._held:
                continue  # a decided group's losers stay down until awaited
            envelope = EffectEnvelope.model_validate(json.loads(row.envelope))
            executor = host._resolve(envelope)
            if executor is None:
                missing.append(_no_executor(row, kit.RESOLVER_MISS))
            else:
                # the child's span joins its caller's trace, whichever process opened it
                with telemetry.taken_over(row.trace_context):
                    if await host._claim_and_dispatch(envelope, executor):
                        resumed.append(ids)
        return DrainReport(
            resumed=tuple(resumed), cancelled=tuple(cancelled), no_executor=tuple(missing)
        )

    async def run(self, interval: float = 1.0, stop: asyncio.Event | None = None) -> None:
        """Run passes every ``interval`` seconds until ``stop`` is set (or cancelled)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.run_pass()
            except EngineUnavailable as exc:
                log.warning("drain pass: %s; trying again at the next pass", exc)
            await _wait(stop, interval)


def _outage(operation: str, group_key: str | None, exc: BaseException, retried: bool) -> None:
    """Log a try that found the database unreachable: the first one of a call as a
    warning, the rest quietly (the driver's message is left out: it may quote values)."""
    level = logging.DEBUG if retried else logging.WARNING
    log.log(
        level,
        "%s of %s: database unreachable (%s); retrying",
        operation,
        group_key,
        type(exc).__name__,
    )


def _refused(group_key: str | None, exc: BaseException) -> InvalidEnvelope:
    """A value the database refused, named by its group only (the driver's message may
    quote the value)."""
    where = "" if group_key is None else f" of group {group_key!r}"
    return InvalidEnvelope(
        f"the database refused a key or value{where} ({type(exc).__name__})",
        group_key=group_key,
    )


def _no_executor(row: ChildRow, why: str) -> NoExecutor:
    return kit.no_executor(row.group_key, row.replay_key, row.position, why)


_WAKES = {w.value: w for w in WakePolicy}
_LOSERS = {p.value: p for p in LoserPolicy}


def _known(record: GroupRow) -> kit.GroupRecord:
    """A group row as the kit's fences read it (a value no policy has is refused as the
    enum refuses it)."""
    return kit.GroupRecord(
        record.group_key,
        record.child_count,
        _WAKES.get(record.wake) or WakePolicy(record.wake),
        _LOSERS.get(record.disposition) or LoserPolicy(record.disposition),
        _LOSERS.get(record.effective) or LoserPolicy(record.effective),
        closed=record.state == "closed",
    )


def _recorded(rows: tuple[ChildRow, ...]) -> list[kit.RecordedChild]:
    return [kit.RecordedChild(r.position, r.replay_key, r.envelope_hash) for r in rows]


def _store_name(store: Store) -> str:
    """The database a refusal names: a SQLite file or a PostgreSQL schema (never a DSN)."""
    path = getattr(store, "path", None)
    return str(path) if path is not None else f"PostgreSQL schema {getattr(store, 'schema', '?')!r}"
