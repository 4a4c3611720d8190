"""The caller's side: an :class:`EffectController` over a Temporal client (G-43…G-45)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    EngineUnavailable,
    GroupClosed,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    GroupShapeError,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    NoExecutor,
    Outcome,
    PayloadShredded,
    ReplayMismatch,
    SealedPayloadUnreadable,
    Settlement,
    UnknownGroup,
    WakePolicy,
    WiredController,
    coerce_disposition,
    group_shape_error,
    kit,
    limits,
    require_group,
    require_handle,
    sleep_durations,
)
from effecthost.hosts import require
from effecthost.payloads import (
    AesGcmSealer,
    KeyStore,
    PayloadPolicy,
    StoredOutcome,
    decode_outcome,
    event_value,
)

require("temporal", "temporal", "temporalio")

from temporalio.client import (  # noqa: E402
    Client,
    RPCTimeoutOrCancelledError,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy  # noqa: E402
from temporalio.exceptions import (  # noqa: E402
    ApplicationError,
    TemporalError,
    WorkflowAlreadyStartedError,
)
from temporalio.service import RPCError, RPCStatusCode  # noqa: E402

from ._claims import Claims  # noqa: E402
from ._codec import is_sealed_payload_error, sealed_client  # noqa: E402
from ._shared import (  # noqa: E402
    AWAIT_RANKS_UPDATE,
    MAX_CHILDREN,
    MAX_SPEC_BYTES,
    MEMO_STATE,
    OPEN_CHUNK_UPDATE,
    PAIRS_PAGE,
    PAIRS_QUERY,
    RANKS_QUERY,
    SETTLED_QUERY,
    SHARD_CHILDREN,
    SHARD_SIGNAL_INTERVAL,
    SHARD_START_SLICE,
    WIDE_SHARD_CHILDREN,
    WORKFLOW_NAME,
    batch_update_id,
    children_digest,
    chunk_update_id,
)
from ._tracing import traced_client  # noqa: E402
from ._workflow import EffectGroupWorkflow  # noqa: E402

_ERRORS: dict[str, type[EffectHostError]] = {
    cls.__name__: cls
    for cls in (
        GroupClosed,
        GroupShapeMismatch,
        ReplayMismatch,
        CursorExhausted,
        DispositionWidened,
        UnknownGroup,
        HandleMismatch,
    )
}

DEFAULT_OUTAGE_BOUND = 60.0
"""How long an open, a close or a ``deliver_event`` retries a transient outage by default
before raising ``EngineUnavailable`` (R-12; the controller's ``outage_bound``)."""

MAX_BACKOFF = 5.0
"""The longest pause between two tries of a call the server did not answer."""

_TRANSIENT = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,  # the server is down or unreachable
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.FAILED_PRECONDITION,  # no worker polls, or the run's task is not done
        RPCStatusCode.ABORTED,
        RPCStatusCode.INTERNAL,
        RPCStatusCode.UNKNOWN,
        RPCStatusCode.CANCELLED,
    }
)
"""Answers that say nothing about the group: the call is tried again."""


@dataclass(frozen=True)
class _Operation:
    """The public call in progress: what it is, its group, since when it tries and for
    how long (``None``: until the caller's own deadline, as an await)."""

    name: str
    key: str | None
    started: float
    bound: float | None


_CURRENT: contextvars.ContextVar[_Operation | None] = contextvars.ContextVar(
    "effecthost_temporal_operation", default=None
)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _key_of(first: Any) -> str | None:
    if isinstance(first, EffectGroup):
        return first.key
    if isinstance(first, GroupHandle):
        return first.group_key
    return first if isinstance(first, str) else None


@contextlib.contextmanager
def _operation(name: str, key: str | None, bound: float | None) -> Iterator[None]:
    """Run a public call (R-12): its RPCs retry a transient outage for ``bound`` seconds
    (``None``: until the caller's own deadline), and no exception of the SDK leaves it:
    what is left is ``EngineUnavailable``."""
    operation = _Operation(name, key, time.monotonic(), bound)
    token = _CURRENT.set(operation)
    try:
        yield
    except TemporalError as exc:
        raise _unavailable(operation, f"the server answered {exc}") from None
    finally:
        _CURRENT.reset(token)


def _public(name: str, *, waits: bool = False) -> Callable[[F], F]:
    """A public method run as :func:`_operation` ``name`` on the group its first argument
    names, bounded by the controller's ``outage_bound`` unless it ``waits``."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        async def guarded(self: TemporalEffectHost, *args: Any, **kwargs: Any) -> Any:
            key = _key_of(args[0]) if args else None
            with _operation(name, key, None if waits else self._outage_bound):
                return await method(self, *args, **kwargs)

        return guarded  # type: ignore[return-value]

    return wrap


def _unavailable(operation: _Operation, why: str) -> EngineUnavailable:
    spent = time.monotonic() - operation.started
    subject = f"group {operation.key!r}" if operation.key is not None else "the groups"
    return EngineUnavailable(
        f"{operation.name} of {subject}: {why} (tried for {spent:.1f} s)",
        group_key=operation.key,
        operation=operation.name,
        tried_for=spent,
    )


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _call(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, tried again with backoff while the server or the group's worker does
    not answer (R-12), within the current public call's bound; past it,
    ``EngineUnavailable``. Cancelling the caller raises ``CancelledError`` (the SDK
    reports a cancelled update as an RPC timeout-or-cancel error)."""
    operation = _CURRENT.get() or _Operation("call", None, time.monotonic(), DEFAULT_OUTAGE_BOUND)
    delay = 0.05
    last = "no answer"
    while True:
        left = None
        if operation.bound is not None:
            left = operation.started + operation.bound - time.monotonic()
            if left <= 0:
                raise _unavailable(operation, f"the Temporal server did not answer ({last})")
        try:
            if left is None:
                return await call()
            return await asyncio.wait_for(call(), left)
        except TimeoutError:
            if left is None:
                raise
            last = "timed out"
        except RPCTimeoutOrCancelledError as exc:
            if _cancelling():
                raise asyncio.CancelledError from None
            last = str(exc)
        except RPCError as exc:
            if exc.status not in _TRANSIENT:
                raise
            if exc.status == RPCStatusCode.CANCELLED and _cancelling():
                raise asyncio.CancelledError from None
            last = f"{exc.status.name}: {exc.message}"
        except WorkflowUpdateFailedError as exc:
            # A workflow task that ended without taking the update up (a worker restarting,
            # an evicted run): the server rejected it unapplied, so it is sent again.
            cause = exc.cause
            if not (isinstance(cause, ApplicationError) and cause.type == "UnprocessedUpdate"):
                raise
            last = "the update was not taken up by a worker"
        pause = delay if left is None else min(delay, max(0.0, left))
        await asyncio.sleep(pause)  # the server or the worker is away: back off
        delay = min(delay * 2, MAX_BACKOFF)


_LIVE_OPENERS: set[str] = set()
"""Incarnations of the controllers alive in this process (see the drain)."""

log = logging.getLogger(__name__)

OWNER_LEASE = "EffecthostOwnerLease"
"""The workflow type of an owner lease (R-1): one workflow per incarnation that opened a
group, id ``effecthost-owner:{incarnation}``. It never runs: no worker polls its task
queue and its first task is delayed past its execution timeout. It is *running* exactly
while its incarnation renews it (each renewal starts a fresh run, terminating the last);
the server times it out ``owner_ttl`` seconds after the last renewal, on its own clock."""
LEASE_QUEUE = "effecthost-owner-leases"
_NEVER = timedelta(days=3650)


def lease_id(incarnation: str) -> str:
    """The workflow id of ``incarnation``'s owner lease."""
    return f"effecthost-owner:{incarnation}"


class GroupTooWide(GroupShapeError):
    """The group has more children than one workflow run can hold (:data:`MAX_CHILDREN`)."""


class TemporalEffectHost(WiredController):
    """Opens groups as workflows of the ``EffectGroup`` type on ``task_queue``.

    ``supports_effect_groups()`` is true iff a resolver is registered (G-07). Register the
    same resolver here as on the worker: the first open resolves every child locally
    before anything is recorded (G-10); the worker resolves them again to run them.

    Payloads (G-47…G-50): ``payloads`` decodes what the worker's child activity recorded
    (the same store and keys as the worker's policy); a group opened with a store deletes
    its stored payloads when it retires. ``keys`` wires the sealing codec into ``client``
    (:func:`~._codec.sealed_client`) and, when ``payloads`` is not given, opens sealed
    outcomes with ``AesGcmSealer(keys)``. A sealing policy is read in mixed mode
    (``accept_plaintext``): the workflow records the outcomes it derives itself without
    keys, so only the tool results of child activities are sealed per slot; the codec
    protects the rest of history. ``test_hooks`` opens groups that accept the
    record-tampering update of the conformance checks; never set it in production.

    A group wider than ``shard_size`` children runs them in shards of that many, each a
    child workflow of the group's run reporting settlements to it; the group's run
    assigns the ranks as it records the reports (G-43). No run then holds more pending
    activities than one shard. By default (``shard_size=None``) a group of up to
    ``SHARD_CHILDREN`` runs in one workflow and a wider one in shards of
    ``WIDE_SHARD_CHILDREN``. Smaller shards cost the server less per child; measure
    before lowering it (docs/temporal.md, "Limits"). A shard reports to the group at
    most once per ``shard_signal_interval`` seconds (recorded per group at open): its
    first settlement at once, the ones it observes within the interval after a report
    together at the interval's end; 0 reports once per shard workflow task. A group's
    run, and each shard, starts at most ``shard_start_slice`` children per workflow task
    (recorded per group at open), so no first task of a wide group schedules them all.

    A group whose encoded children exceed ``chunk_bytes`` (one workflow input may be at
    most 2 MiB) opens in chunks: the run starts with the shape and the children's digests,
    the children follow in chunk updates of at most ``chunk_bytes`` each, and the run
    starts no child until all are recorded; shards are then cut at ``chunk_bytes`` too.

    Outages (R-12): a call the server or the group's worker does not answer is tried
    again with backoff; an await until it is answered (the caller's deadline bounds it),
    any other call for ``outage_bound`` seconds, then ``EngineUnavailable``. No exception
    of the SDK leaves the controller.

    Owner liveness (R-1): from its first open the controller holds an owner lease in the
    engine (a workflow of type :data:`OWNER_LEASE` that no worker runs), renewed every
    ``owner_ttl / 3`` seconds and ended by :meth:`aclose`; the server times it out
    ``owner_ttl`` seconds after the last renewal. A drain of another process leaves this
    incarnation's groups alone while the lease runs.
    """

    def __init__(
        self,
        client: Client,
        task_queue: str,
        resolver: GroupExecutors | None = None,
        *,
        heartbeat_timeout: float = 5.0,
        start_to_close_timeout: float = 86400.0,
        visibility_wait: float = 10.0,
        payloads: PayloadPolicy | None = None,
        keys: KeyStore | None = None,
        test_hooks: bool = False,
        shard_size: int | None = None,
        shard_signal_interval: float = SHARD_SIGNAL_INTERVAL,
        shard_start_slice: int = SHARD_START_SLICE,
        chunk_bytes: int = MAX_SPEC_BYTES,
        outage_bound: float = DEFAULT_OUTAGE_BOUND,
        owner_ttl: float = 30.0,
    ) -> None:
        if owner_ttl <= 0:
            raise ValueError("owner_ttl must be positive")
        client = traced_client(client)  # the caller's trace context reaches the children
        if keys is not None:
            client = sealed_client(client, keys)
            if payloads is None:
                payloads = PayloadPolicy(sealer=AesGcmSealer(keys))
        if payloads is not None and payloads.sealer is not None:
            # the workflow records the outcomes it derives (a cancellation, an activity
            # failure, a timer, an event) itself, holding no keys: read in mixed mode
            payloads = replace(payloads, accept_plaintext=True)
        self._client = client
        self._task_queue = task_queue
        self._resolver = resolver
        self._payloads = payloads
        self._options: dict[str, Any] = {
            "heartbeat_timeout": heartbeat_timeout,
            "start_to_close": start_to_close_timeout,
        }
        if payloads is not None and payloads.store is not None:
            self._options["payloads"] = True
        if test_hooks:
            self._options["test_hooks"] = True
        if shard_size is not None and shard_size < 1:
            raise ValueError("shard_size must be at least 1")
        # Recorded: the widest group one run holds (a run started without its shards
        # listed derives them from it); the shards' size is the controller's own.
        self._options["shard_size"] = shard_size or SHARD_CHILDREN
        self._shard = shard_size or WIDE_SHARD_CHILDREN
        if not 0 <= shard_signal_interval <= 60:
            raise ValueError("shard_signal_interval must be between 0 and 60 seconds")
        if shard_signal_interval:
            # Recorded; a run without it (every run recorded before it) reports per task.
            self._options["signal_interval"] = shard_signal_interval
        if shard_start_slice < 1:
            raise ValueError("shard_start_slice must be at least 1")
        # Recorded: a shard replays with the slice it ran with (runs without it start all
        # their children in their first task).
        self._options["start_slice"] = shard_start_slice
        if not 0 < chunk_bytes <= MAX_SPEC_BYTES:
            raise ValueError(f"chunk_bytes must be between 1 and {MAX_SPEC_BYTES}")
        self._chunk_bytes = chunk_bytes
        self._visibility_wait = visibility_wait
        if outage_bound < 0:
            raise ValueError("outage_bound must not be negative")
        self._outage_bound = outage_bound
        self._expected: dict[str, bool] = {}
        self._owned: dict[str, tuple[int, str, str]] = {}
        self._batches: dict[str, _Batch] = {}
        self._claims = Claims(client)
        self.incarnation = f"{uuid.uuid4().hex}"
        self._owner_ttl = owner_ttl
        self._lease: asyncio.Task[None] | None = None
        self._leasing = asyncio.Lock()
        _LIVE_OPENERS.add(self.incarnation)

    # -- wiring -------------------------------------------------------------------------

    def supports_concurrent_effects(self) -> bool:
        return True

    @property
    def client(self) -> Client:
        return self._client

    @property
    def task_queue(self) -> str:
        return self._task_queue

    async def aclose(self) -> None:
        """Mark this caller gone (its owner lease ends now, R-1): a drain may now apply
        the declared ``CANCEL`` of the groups it opened and left unclosed."""
        _LIVE_OPENERS.discard(self.incarnation)
        lease, self._lease = self._lease, None
        if lease is None:
            return
        lease.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lease
        ending = self._client.get_workflow_handle(lease_id(self.incarnation)).terminate()
        with contextlib.suppress(RPCError, TemporalError, asyncio.TimeoutError):
            await asyncio.wait_for(ending, 5.0)  # else it lapses by itself after owner_ttl

    # -- owner lease (R-1) --------------------------------------------------------------

    async def _hold_lease(self) -> None:
        """Make this incarnation live in the engine before it records itself as a
        group's owner, and keep it live (renewed every ``owner_ttl / 3`` seconds) until
        :meth:`aclose`."""
        async with self._leasing:  # concurrent first opens take one lease
            if self._lease is not None and not self._lease.done():
                return
            await _call(self._renew_lease)
            self._lease = asyncio.create_task(self._keep_lease())

    async def _renew_lease(self) -> None:
        await self._client.start_workflow(
            OWNER_LEASE,
            id=lease_id(self.incarnation),
            task_queue=LEASE_QUEUE,
            execution_timeout=timedelta(seconds=self._owner_ttl),
            start_delay=_NEVER,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            rpc_timeout=timedelta(seconds=max(self._owner_ttl / 3, 1.0)),
        )

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self._owner_ttl / 3)
            try:
                await self._renew_lease()
            except (RPCError, TemporalError) as exc:
                # tried again at the next beat; past owner_ttl a drain may take this
                # incarnation for gone, as for any lost lease
                log.warning("owner lease of %s not renewed: %s", self.incarnation, exc)

    async def _owner_live(self, opener: str | None) -> bool:
        """Whether the incarnation ``opener`` is live: a controller of this process that
        is not closed, or one whose owner lease is running in the engine (R-1)."""
        if opener is None:
            return False
        if opener in _LIVE_OPENERS:
            return True
        try:
            described = await _call(self._client.get_workflow_handle(lease_id(opener)).describe)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False  # never held one (or long gone)
            raise
        return described.status == WorkflowExecutionStatus.RUNNING

    def _handle(self, key: str) -> WorkflowHandle[Any, Any]:
        return self._client.get_workflow_handle(key)

    async def _update(self, key: str, update: Any, *args: Any, id: str | None = None) -> Any:
        """An update, tried again while the server or the worker does not answer (R-12;
        ``FAILED_PRECONDITION`` also says the run's current workflow task has not
        completed yet). A retry sends the same update id, so an update the server has
        completed is answered from its stored outcome, never applied twice.

        Cancelling the caller while the update is in flight raises ``CancelledError``, as
        on every tier (G-19)."""
        handle = self._handle(key)
        return await _call(lambda: handle.execute_update(update, args=list(args), id=id))

    # -- open ---------------------------------------------------------------------------

    @_public("open")
    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        return await self._open(require_group(group), check_routes=True)

    @_public("open")
    async def open_unresolved(self, group: EffectGroup) -> GroupHandle:
        """Open without resolving children locally (a caller that does not share the
        worker's resolver); an unbound child then ends as a terminal 404 (G-14)."""
        return await self._open(group, check_routes=False)

    async def _open(self, group: EffectGroup, *, check_routes: bool) -> GroupHandle:
        self._require_wired(group.key)
        plan = self._plan(group)
        await self._hold_lease()
        miss = self._first_unresolvable(group) if check_routes else None
        fresh = await self._claim(group)
        if miss is not None and not await self._exists(group.key):
            await self._release(fresh)
            raise group_shape_error(group, *miss)
        try:
            await self._start(group, plan)
        except EngineUnavailable:
            raise  # it may have committed: a retry of the open is its reopen
        except EffectHostError:
            # Refused: the open records nothing. A claim it started was not its group's
            # before (a group holding the key is answered, not started), so it goes too.
            await self._release(fresh)
            raise
        self._expected[group.key] = True
        self._owned[group.key] = (
            group.child_count,
            group.wake.value,
            group.disposition.value,
        )
        return group.handle()

    async def _claim(self, group: EffectGroup) -> list[tuple[str, str]]:
        """Claim the group's replay keys (R-6; :mod:`._claims`): the claims started here.
        A key another live group holds refuses a first open and records nothing; a
        reopen goes on to the group's own fences (R-2: ``GroupClosed`` and the shape come
        first, and its children are fenced against its record)."""
        keys = [c.replay_key for c in group.children]
        claimed = await _call(lambda: self._claims.claim(group.key, keys))
        if claimed.holder is None:
            return claimed.fresh
        if await self._exists(group.key):
            return claimed.fresh
        await self._release(claimed.fresh)
        assert claimed.position is not None and claimed.replay_key is not None
        raise kit.replay_key_taken(group.key, claimed.position, claimed.replay_key, claimed.holder)

    async def _release(self, fresh: list[tuple[str, str]]) -> None:
        if fresh:
            await _call(lambda: self._claims.release(fresh))

    async def _start(self, group: EffectGroup, plan: _Plan) -> None:
        """Record the group (or reopen it): update-with-start, then the chunks the run
        still lacks."""
        update_id = f"open-{uuid.uuid4().hex}"  # a retry is answered, not applied again

        async def attempt() -> Any:
            start = WithStartWorkflowOperation(
                EffectGroupWorkflow.run,
                plan.spec,
                id=group.key,
                task_queue=self._task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                memo={MEMO_STATE: "open"},
                static_summary=_summary(group),
                static_details=_details(group),
            )
            try:
                return await self._client.execute_update_with_start_workflow(
                    EffectGroupWorkflow.open,
                    plan.fence,
                    start_workflow_operation=start,
                    id=update_id,
                )
            except WorkflowAlreadyStartedError:
                with contextlib.suppress(Exception):
                    await start.workflow_handle()  # consume the start operation's failure
                raise

        try:
            opened: Any = await _call(attempt)
        except WorkflowUpdateFailedError as exc:
            await self._name_mismatch(group.key, plan, exc)
            _raise_from(exc.cause, group.key)
        except WorkflowAlreadyStartedError:
            raise kit.group_closed(group.key) from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.ALREADY_EXISTS:
                raise kit.group_closed(group.key) from None
            raise
        # A chunked open, or a retry of one left partial: the chunks the run still lacks,
        # cut as its manifest says (the children matched its digest).
        for index, lo, hi in opened.get("missing") or ():
            await self._send_chunk(group.key, index, plan.entries[lo:hi])

    async def _send_chunk(self, key: str, index: int, entries: list[dict[str, Any]]) -> None:
        digest = children_digest(_pairs(entries))
        try:
            await self._update(
                key, OPEN_CHUNK_UPDATE, index, entries, id=chunk_update_id(index, digest)
            )
        except WorkflowUpdateFailedError as exc:
            _raise_from(exc.cause, key)

    async def _name_mismatch(self, key: str, plan: _Plan, exc: WorkflowUpdateFailedError) -> None:
        """A chunked fence refuses on the children's digest without a position: read the
        recorded pairs (queries add no history) and raise the first that differs."""
        cause = exc.cause
        if not (isinstance(cause, ApplicationError) and cause.type == "ReplayMismatch"):
            return
        details = cause.details[0] if cause.details else {}
        if isinstance(details, dict) and details.get("position") is not None:
            return
        offer = _pairs(plan.entries)
        for start in range(0, len(offer), PAIRS_PAGE):
            try:
                page: Any = await _call(
                    functools.partial(self._handle(key).query, f"{PAIRS_QUERY}{start}")
                )
            except (RPCError, WorkflowQueryFailedError):
                return  # the refusal stands without a position
            recorded = [
                kit.RecordedChild(start + i, p[0], p[1])
                for i, p in enumerate(page)
                if p is not None
            ]
            kit.check_children(
                kit.Offer(
                    key,
                    len(offer),
                    plan.spec["wake"],
                    plan.spec["disposition"],
                    tuple((k, h) for k, h in offer),
                ),
                recorded,
            )

    def _group_spec(self, group: EffectGroup) -> dict[str, Any]:
        """The workflow's start input for ``group``."""
        return self._plan(group).spec

    def _plan(self, group: EffectGroup) -> _Plan:
        """The start input and the open's fence; a group over ``chunk_bytes`` is cut in
        chunks (the start input then holds their manifest, not the children)."""
        if group.child_count > MAX_CHILDREN:
            raise GroupTooWide(
                f"group {group.key!r} has {group.child_count} children; one workflow run "
                f"holds at most MAX_CHILDREN={MAX_CHILDREN} (pending activities and updates "
                "per run are limited); split it into smaller groups",
                group_key=group.key,
                position=MAX_CHILDREN,
            )
        sleep_durations(group)  # a malformed sleep refuses the open before it starts (G-10)
        entries = [
            {"envelope": c.canonical_dict(), "hash": c.envelope_hash()} for c in group.children
        ]
        spec: dict[str, Any] = {
            "key": group.key,
            "wake": group.wake.value,
            "disposition": group.disposition.value,
            "children": entries,
            "options": self._options,
            "opener": self.incarnation,
        }
        fence: dict[str, Any] = {
            "count": group.child_count,
            "wake": group.wake.value,
            "disposition": group.disposition.value,
            "opener": self.incarnation,
        }
        wide = group.child_count > int(self._options["shard_size"])
        sizes = [len(json.dumps(e)) + 2 for e in entries]
        if sum(sizes) + 1024 <= self._chunk_bytes:
            fence["children"] = _pairs(entries)
            if wide:
                spec["shards"] = list(range(0, group.child_count, self._shard))
            return _Plan(spec, fence, entries)
        limit = self._chunk_bytes - 1024
        cuts = _cut(sizes, limit, len(sizes))
        chunks = [
            [lo, hi, children_digest(_pairs(entries[lo:hi]))]
            for lo, hi in zip(cuts, [*cuts[1:], len(entries)], strict=True)
        ]
        shards = _cut(sizes, limit, self._shard if wide else group.child_count)
        digest = children_digest(_pairs(entries))
        spec.update(
            children=[], count=group.child_count, chunks=chunks, digest=digest, shards=shards
        )
        fence["digest"] = digest
        return _Plan(spec, fence, entries)

    async def _exists(self, key: str) -> bool:
        try:
            await _call(self._handle(key).describe)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    # -- read ---------------------------------------------------------------------------

    async def _query(
        self, key: str, query: str, *args: Any, rank: int | None = None
    ) -> dict[str, Any]:
        try:
            with _opened(key, rank):
                handle = self._handle(key)
                result: dict[str, Any] = await _call(lambda: handle.query(query, args=list(args)))
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise kit.unknown_group(key) from None
            raise
        except WorkflowQueryFailedError as exc:
            raise UnknownGroup(f"group {key!r} cannot be read: {exc}", group_key=key) from None
        return result

    @_public("await", waits=True)
    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        """Serve rank ``consumed + 1`` from the batch this controller read last, else
        read a batch: a query of the ranks recorded after the cursor, and when none is,
        a waiting update (G-44) with an id of its own: the server answers a repeated id
        from the stored outcome without the validator, which would serve a closed group
        (R-4). A group this controller opened and has not closed skips the query: the
        update's validator applies the same fences.

        A batch holds recorded ranks only (G-15: they never change). A close through
        this controller drops its batch, so the next await reads the group again (R-4);
        a close through another client is seen at this controller's next read."""
        key = require_handle(handle).group_key
        self._require_wired(key)
        rank = handle.consumed + 1
        cached = self._batches.get(key)
        doc = cached.get(rank) if cached is not None else None
        if doc is not None and cached is not None:
            kit.check_await(key, handle, cached.record)
        else:
            doc = await self._read_batch(key, handle)
        replay_key, position = doc["replay_key"], doc["position"]
        # Decoded before the handle advances: a refusal leaves the cursor (G-49).
        outcome = await decode_outcome(
            self._payloads, key, replay_key, doc["outcome"], position=position, rank=rank
        )
        settlement = Settlement(
            rank=rank, position=position, replay_key=replay_key, outcome=outcome
        )
        handle.consumed = rank
        return settlement

    async def _read_batch(self, key: str, handle: GroupHandle) -> dict[str, Any]:
        after = handle.consumed
        rank = after + 1
        shape = self._owned.get(key)
        mine = shape == (handle.child_count, handle.wake.value, handle.disposition.value)
        if not mine or rank > handle.child_count:
            # The rank and cursor are in the query's name: nothing for the worker to
            # decode, so a caller with other codec keys fails here, caller-side, and
            # records nothing (G-49).
            state = await self._query(key, f"{RANKS_QUERY}{after}", rank=rank)
            kit.check_await(key, handle, _record(key, state))  # R-2's order
            if state["settlements"]:
                return self._keep(key, after, state)
        try:
            with _opened(key, rank):
                state = await self._update(
                    key, f"{AWAIT_RANKS_UPDATE}{after}", id=batch_update_id(after)
                )
        except WorkflowUpdateFailedError as exc:
            _raise_from(exc.cause, key)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise kit.group_closed(key) from None
            if exc.status != RPCStatusCode.RESOURCE_EXHAUSTED:
                raise
            return await self._poll_batch(key, handle)
        # accepted while open: the shape and cursor fences hold for what it returns
        kit.check_await(key, handle, replace(_record(key, state), closed=False))
        return self._keep(key, after, state)

    async def _poll_batch(self, key: str, handle: GroupHandle) -> dict[str, Any]:
        """The run's update budget is spent (2,000 per run; a wide group read one rank
        at a time can spend it): query until a rank after the cursor is recorded,
        backing off, with the fences of every read."""
        after = handle.consumed
        delay = 0.02
        while True:
            state = await self._query(key, f"{RANKS_QUERY}{after}", rank=after + 1)
            kit.check_await(key, handle, _record(key, state))
            if state["settlements"]:
                return self._keep(key, after, state)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _keep(self, key: str, after: int, state: dict[str, Any]) -> dict[str, Any]:
        batch = _Batch(replace(_record(key, state), closed=False), after, state["settlements"])
        self._batches[key] = batch
        first: dict[str, Any] = state["settlements"][0]
        return first

    @_public("recorded_settlements")
    async def recorded_settlements(self, group_key: str) -> list[dict[str, Any]]:
        """Every settlement of ``group_key`` as history records it (outcomes in their
        stored form: a reference or an envelope when the worker has a policy). For
        inspection and the conformance hooks; never decodes."""
        result: Any = await self._query(group_key, SETTLED_QUERY)
        return list(result)

    @_public("overwrite_outcome")
    async def overwrite_outcome(self, group_key: str, replay_key: str, outcome: Any) -> None:
        """Test hook: replace the recorded outcome of a settled child (groups opened by a
        controller with ``test_hooks=True`` only; the update is refused otherwise)."""
        try:
            await self._update(
                group_key, EffectGroupWorkflow.overwrite_outcome, replay_key, outcome
            )
        except WorkflowUpdateFailedError as exc:
            _raise_from(exc.cause, group_key)

    @_public("settlement_order")
    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(limits.check_key(group_key, what="the group key of settlement_order"))
        status = await self._query(group_key, "status")
        order = list(status["order"])
        if kit.retires(status["closed"], status["shape"][0], len(order)):
            raise kit.unknown_group(group_key)  # its run ended or is ending: retired (G-22)
        return order

    # -- close --------------------------------------------------------------------------

    @_public("close")
    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        """Through the controller that opened the group, a signal (:meth:`_close_mine`);
        otherwise an update (validated: narrowing only), a signal when the run's update
        budget is spent; on a finished run, checks narrowing against the record (G-26)."""
        disposition = coerce_disposition(require_handle(handle).group_key, disposition)
        key = handle.group_key
        self._require_wired(key)
        known = self._owned.pop(key, None)
        self._batches.pop(key, None)
        target = disposition.value if disposition is not None else None
        if known is not None and await self._close_mine(key, handle, known, target):
            self._expected[key] = False
            return
        shape = [handle.child_count, handle.wake.value, handle.disposition.value]
        wf = self._handle(key)
        try:
            await self._update(key, EffectGroupWorkflow.close, target, shape)
        except WorkflowUpdateFailedError as exc:
            _raise_from(exc.cause, key)
        except RPCError as exc:
            if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED:
                state = await self._query(key, "status")
                if kit.check_close(key, handle, _record(key, state), target) is not None:
                    await _call(lambda: wf.signal(EffectGroupWorkflow.close_signal, target))
            elif exc.status == RPCStatusCode.NOT_FOUND:
                # Not found, or the run already finished (closed and retired: a later
                # close is a no-op, R-4); the handle is still compared with the record.
                state = await self._query(key, "status")
                kit.check_close(key, handle, _record(key, state), target)
            else:
                raise
        self._expected[key] = False

    async def _close_mine(
        self, key: str, handle: GroupHandle, known: tuple[int, str, str], target: str | None
    ) -> bool:
        """Close a group this controller opened with a signal, saving the update's extra
        workflow task: whether it was sent. Returns once history records it (G-27: the
        cancels are then determined; the run issues them in the task that applies it).

        The open fenced the recorded shape, and the disposition in force is the declared
        one until a close: the handle's fence and the narrowing are decided here as the
        update's validator would (R-2). A refusal, or a run that has ended, takes the
        update path, which decides on the record itself (a group another client closed
        is a no-op there, whatever is asked). Nothing is served after the signal (R-4): a
        query of a run with an outstanding workflow task is answered after that task,
        and an update is applied after the events recorded before it; this controller's
        reads of the key take the query path from now on."""
        count, wake, declared = known
        record = kit.GroupRecord(key, count, WakePolicy(wake), LoserPolicy(declared))
        try:
            kit.check_close(key, handle, record, target)
        except EffectHostError:
            return False
        try:
            wf = self._handle(key)
            await _call(lambda: wf.signal(EffectGroupWorkflow.close_signal, target))
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    # -- events -------------------------------------------------------------------------

    @_public("deliver_event")
    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self._require_wired(group_key)
        value = event_value(group_key, name, payload)
        try:
            reached: int = await self._update(
                group_key,
                EffectGroupWorkflow.deliver,
                name,
                value,
                id=f"deliver-{uuid.uuid4().hex}",  # a retry is answered, not applied again
            )
        except WorkflowUpdateFailedError as exc:
            _raise_from(exc.cause, group_key)  # a group whose chunked open is partial
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            if await self._exists(group_key):
                return 0  # the run finished: no child can take the event
            raise kit.unknown_group(group_key) from None
        return reached

    # -- inspection ---------------------------------------------------------------------

    async def _running(self) -> dict[str, bool]:
        """Running group workflows of this task queue → whether a caller closed it."""
        query = (
            f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running' "
            f"AND TaskQueue = '{self._task_queue}'"
        )

        async def listing() -> dict[str, bool]:
            found: dict[str, bool] = {}
            async for execution in self._client.list_workflows(query):
                memo = await execution.memo()
                found[execution.id] = memo.get(MEMO_STATE) == "closed"
            return found

        return await _call(listing)

    @_public("open_group_keys")
    async def open_group_keys(self) -> list[str]:
        """Groups not yet closed, from the visibility API (G-30).

        Visibility is eventually consistent, so a caller reads its own writes: a group
        this controller closed is left out at once (the close is in the run's history;
        the index follows only once a worker has applied it, and a closed key stays
        closed), and the listing is re-read (with backoff, up to ``visibility_wait``
        seconds) until it shows the groups this controller opened.
        """
        deadline = time.monotonic() + self._visibility_wait
        delay = 0.02
        while True:
            running = await self._running()
            keys = {key for key, closed in running.items() if not closed}
            stale = [k for k, is_open in self._expected.items() if (k in keys) != is_open]
            for key in [k for k in self._expected if k not in stale]:
                del self._expected[key]
            keys -= {k for k in stale if not self._expected[k]}
            if all(not self._expected[k] for k in stale) or time.monotonic() > deadline:
                return sorted(keys)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    # -- drain --------------------------------------------------------------------------

    def drain(self, caller_gone: Callable[[str | None], bool] | None = None) -> GroupDrain:
        """The engine owns retries and losers; a pass leaves the groups of every other
        live incarnation alone (R-1), reports children this deployment cannot run as
        ``NoExecutor`` and applies a declared ``CANCEL`` to groups whose caller is gone.
        An opener is gone when its owner lease has lapsed or ended (``aclose``) and no
        controller of this process is it; ``caller_gone`` replaces that test."""
        return _TemporalDrain(self, caller_gone)


class _TemporalDrain(GroupDrain):
    def __init__(self, host: TemporalEffectHost, caller_gone: Callable[[str | None], bool] | None):
        self._host = host
        self._caller_gone = caller_gone

    async def run_pass(self) -> DrainReport:
        with _operation("drain", None, self._host._outage_bound):
            return await self._run_pass()

    async def _run_pass(self) -> DrainReport:
        host = self._host
        cancelled: list[tuple[str, str]] = []
        missing: list[NoExecutor] = []
        engine_owned = 0
        judged: dict[str | None, bool] = {}

        async def gone(opener: str | None) -> bool:
            if opener not in judged:
                if self._caller_gone is not None:
                    judged[opener] = self._caller_gone(opener)
                else:
                    judged[opener] = not await host._owner_live(opener)
            return judged[opener]

        for key in sorted(await host._running()):
            try:
                status = await host._query(key, "status")
            except EffectHostError:
                continue
            opener = status["opener"]
            if not status["closed"] and opener != host.incarnation and not await gone(opener):
                continue  # another live incarnation's group, its timers and waits too
            if host._resolver is None:
                for child in status["unsettled"]:
                    missing.append(_no_executor(key, child, kit.NO_RESOLVER))
                continue
            if (
                not status["closed"]
                and status["effective"] == LoserPolicy.CANCEL.value
                and await gone(opener)
            ):
                try:
                    done = await host._update(key, EffectGroupWorkflow.drain_cancel, opener)
                except (WorkflowUpdateFailedError, RPCError):
                    done = []
                cancelled.extend((key, replay_key) for replay_key in done)
                continue
            for child in status["unsettled"]:
                envelope = EffectEnvelope.model_validate(child["envelope"])
                if envelope.kind in (EffectKind.SLEEP, EffectKind.AWAIT_EVENT):
                    engine_owned += 1
                elif host._resolver.resolve(envelope) is None:
                    missing.append(_no_executor(key, child, kit.RESOLVER_MISS))
                else:
                    engine_owned += 1
        return DrainReport(
            cancelled=tuple(cancelled),
            no_executor=tuple(missing),
            extra={"engine_owned": engine_owned},
        )


@dataclass(frozen=True)
class _Plan:
    """An open: the workflow's start input, the open update's fence, and the children's
    entries (envelope and hash) in position order."""

    spec: dict[str, Any]
    fence: dict[str, Any]
    entries: list[dict[str, Any]]


def _pairs(entries: list[dict[str, Any]]) -> list[list[str]]:
    return [[e["envelope"]["replay_key"], e["hash"]] for e in entries]


def _cut(sizes: list[int], limit: int, most: int) -> list[int]:
    """Start positions of contiguous runs of at most ``most`` items and ``limit`` bytes
    (an item larger than ``limit`` alone)."""
    starts = [0]
    count = total = 0
    for position, size in enumerate(sizes):
        if count and (count == most or total + size > limit):
            starts.append(position)
            count = total = 0
        count += 1
        total += size
    return starts


@dataclass(frozen=True)
class _Batch:
    """Settlements ranked ``after + 1`` onward, as one read returned them, with the
    group's record at that read."""

    record: kit.GroupRecord
    after: int
    settlements: list[dict[str, Any]]

    def get(self, rank: int) -> dict[str, Any] | None:
        index = rank - self.after - 1
        return self.settlements[index] if 0 <= index < len(self.settlements) else None


@contextlib.contextmanager
def _opened(key: str, rank: int | None) -> Iterator[None]:
    """Turn a payload this client's codec cannot open (or, without a codec, a sealed
    payload) into the typed error of the read, with the group's ids only."""
    try:
        yield
    except PayloadShredded:
        raise PayloadShredded(
            f"a sealed payload of group {key!r} cannot be opened: its codec key was destroyed",
            group_key=key,
            rank=rank,
        ) from None
    except SealedPayloadUnreadable:
        raise SealedPayloadUnreadable(
            f"a sealed payload of group {key!r} cannot be opened here: this client's codec "
            "keys are not the worker's",
            group_key=key,
            rank=rank,
        ) from None
    except KeyError as exc:
        if not is_sealed_payload_error(exc):
            raise
        raise SealedPayloadUnreadable(
            f"a sealed payload of group {key!r} cannot be opened here: no codec is "
            "configured on this client",
            group_key=key,
            rank=rank,
        ) from None


def _summary(group: EffectGroup) -> str:
    """The group's one-line summary in the engine's UI and CLI."""
    return (
        f"effecthost group: wake {group.wake.value}, losers {group.disposition.value}, "
        f"{group.child_count} children"
    )


DETAILED_CHILDREN = 50
"""Children listed by name in a group's static details (the rest are counted)."""


def _details(group: EffectGroup) -> str:
    """The group's children by position, tool and replay key (the UI renders Markdown)."""
    lines = [
        f"- {position}: {child.name} ({child.kind}) · {child.replay_key}"
        for position, child in enumerate(group.children[:DETAILED_CHILDREN])
    ]
    if group.child_count > DETAILED_CHILDREN:
        lines.append(f"- … and {group.child_count - DETAILED_CHILDREN} more")
    return "\n".join(lines)


def _stored_form(key: str, replay_key: str, rank: int, doc: Any) -> StoredOutcome:
    """What the workflow recorded: a stored form from a worker with a policy, a plain
    outcome otherwise (and for outcomes the workflow itself derives: a cancellation, an
    activity failure, a timer, an event)."""
    try:
        if isinstance(doc, dict) and "form" in doc:
            return StoredOutcome.model_validate(doc)
        return StoredOutcome(form="inline", outcome=Outcome.model_validate(doc))
    except ValueError:  # a ValidationError quotes its input: never chain it
        pass
    raise SealedPayloadUnreadable(
        f"the recorded outcome of child {replay_key!r} in group {key!r} is malformed",
        group_key=key,
        replay_key=replay_key,
        rank=rank,
    )


def _no_executor(key: str, child: dict[str, Any], why: str) -> NoExecutor:
    return kit.no_executor(key, child["envelope"]["replay_key"], child["position"], why)


def _record(key: str, state: dict[str, Any]) -> kit.GroupRecord:
    """The group workflow's ``read``/``status`` answer as the kit's fences read it."""
    count, wake, declared = state["shape"]
    return kit.GroupRecord(key, count, wake, declared, state["effective"], state["closed"])


def _raise_from(cause: BaseException | None, key: str) -> NoReturn:
    """Turn a workflow-side refusal (an ``ApplicationError`` whose type names a contract
    error) into that typed error, with its ids."""
    if isinstance(cause, ApplicationError) and cause.type in _ERRORS:
        details = cause.details[0] if cause.details else {}
        ids = details if isinstance(details, dict) else {}
        message = cause.message
        prefix = f"[{_ERRORS[cause.type].code.value}] "
        if message.startswith(prefix):
            message = message[len(prefix) :]
        raise _ERRORS[cause.type](
            message,
            group_key=ids.get("group_key", key),
            replay_key=ids.get("replay_key"),
            position=ids.get("position"),
            rank=ids.get("rank"),
        ) from None
    raise RuntimeError(
        f"group {key!r}: unexpected failure from the group workflow: {cause!r}"
    ) from cause
