"""The group workflow (G-43…G-45). Workflow id = group key.

Everything here is replay-deterministic: each child has its own watcher task, created
in position order, and a settlement takes rank ``len(settled) + 1`` at the moment its
watcher observes it (:func:`assign_rank`). History orders completions, so a replay
re-derives the same ranks. No ``asyncio.wait``/``as_completed`` and no local activities.

Only the standard library, ``temporalio``, :mod:`._shared` and the contract's host kit
(pure functions; ``effecthost`` passes through the sandbox) are imported, so the module
loads inside the workflow sandbox. The fences of the validators are the kit's.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from effecthost import telemetry
from effecthost.contract import EffectHostError, kit
from effecthost.hosts import require

require("temporal", "temporal", "temporalio")

from temporalio import workflow  # noqa: E402
from temporalio.common import RawValue, RetryPolicy  # noqa: E402
from temporalio.exceptions import (  # noqa: E402
    ActivityError,
    ApplicationError,
    CancelledError,
    TimeoutError,
)

from ._shared import (  # noqa: E402
    AWAIT_RANKS_UPDATE,
    AWAIT_UPDATE,
    BATCH_BYTES,
    CHILD_ACTIVITY,
    CLAIMS_QUERY,
    HAS_KEY_QUERY,
    HOLD_QUERY,
    MEMO_STATE,
    OPEN_CHUNK_UPDATE,
    PAIRS_PAGE,
    PAIRS_QUERY,
    RANKS_QUERY,
    READ_QUERY,
    RELEASE_CLAIMS_ACTIVITY,
    RESULT_BYTES,
    RETIRE_ACTIVITY,
    SETTLED_QUERY,
    SHARD_CANCEL,
    SHARD_EVENT,
    SHARD_SETTLED,
    SHARD_WORKFLOW_NAME,
    WORKFLOW_NAME,
    children_digest,
    claim_bucket,
    error_details,
    shard_id,
)

Json = dict[str, Any]

_CANCELLED: Json = {"status": "cancelled", "value": None, "error": None}

NAMED_CHILDREN = "effecthost-named-children"
"""Patch id: runs started with it give each child activity an id and summary naming its
tool and position, wait for a cancelled loser's activity to end (so history shows the
end) and report progress as current details. Runs recorded before keep ``child-N`` and
replay unchanged."""

RELEASE_CLAIMS = "effecthost-release-claims"
"""Patch id: runs that record it end their replay-key claims at retirement (R-11) with
:data:`RELEASE_CLAIMS_ACTIVITY`; runs recorded before leave them to be taken over by a
later claim and replay unchanged."""

RELEASE_CLAIMS_SUMMARY = "retirement · release replay-key claims"
"""The summary operators see on the retirement's claim release."""

PACED_STARTS = "effecthost-paced-starts"
"""Patch id: runs (groups and shards) that record it start their children
``start_slice`` at a time, a workflow task per slice (:data:`~._shared.SHARD_START_SLICE`);
runs recorded before it (or run by a worker before it) started them all in their first
task, and replay so."""

START_PACE = timedelta(seconds=1)
"""How long a run waits to start its next slice of children when none of the slice before
has ended: the next slice starts in the workflow task that sees a child of the slice
before end (trivial children end within milliseconds), or after this. (A timer, not the
trigger: the dev server fires short timers about a second late.) A group's recorded
option ``start_pace`` (seconds) stretches it in its run and its shards', so a test can
close a group while slices wait; nothing else sets it."""

SIGNAL_STARTED_SHARDS = "effecthost-signal-started-shards"
"""Patch id: runs that record it send a shard its events and cancels only once the shard
has started, so a signal is never sent to a shard workflow that does not exist yet (and
lost). Runs recorded before keep sending at once and replay unchanged."""


def assign_rank(settled: list[Json], settlement: Json) -> None:
    """The rank rule: a settlement takes the next rank in the order the workflow
    observes it. The replay test re-derives ranks through this function."""
    settlement["rank"] = kit.next_rank(len(settled), already_ranked=False)
    settled.append(settlement)


def _refuse(kind: str, message: str, **ids: Any) -> ApplicationError:
    return ApplicationError(message, error_details(**ids), type=kind, non_retryable=True)


def _refusal(exc: EffectHostError) -> ApplicationError:
    """A kit refusal as the workflow raises it (the caller raises the same error again)."""
    return _refuse(
        type(exc).__name__,
        exc.message,
        group_key=exc.group_key,
        replay_key=exc.replay_key,
        position=exc.position,
        rank=exc.rank,
    )


def _failure(exc: ActivityError) -> Json:
    cause = exc.cause
    if isinstance(cause, CancelledError):
        return dict(_CANCELLED)
    if isinstance(cause, ApplicationError):
        details = cause.details[0] if cause.details else None
        data = details.get("data") if isinstance(details, dict) else None
        code = details.get("code") if isinstance(details, dict) else None
        return {
            "status": "error",
            "value": None,
            "error": {
                "type": cause.type or "ApplicationError",
                "message": cause.message,
                "data": data,
                "code": code,
            },
        }
    if isinstance(cause, TimeoutError):
        kind = "ActivityTimeout"
    else:
        kind = type(cause).__name__ if cause is not None else "ActivityError"
    return {
        "status": "error",
        "value": None,
        "error": {"type": kind, "message": str(cause or exc), "data": None, "code": None},
    }


def _status(outcome: Json) -> str:
    """An outcome's status for the run's result; a stored form whose outcome the workflow
    cannot read (sealed, or by reference) shows its form instead."""
    if "status" in outcome:
        return str(outcome["status"])
    inner = outcome.get("outcome")
    if outcome.get("form") == "inline" and isinstance(inner, dict):
        return str(inner.get("status"))
    return f"stored ({outcome.get('form')})"


def activity_options(options: Json) -> Json:
    """How a ``tool_call`` child's activity runs: the group's timeouts, retried without
    limit (the engine owns retries)."""
    return {
        "start_to_close_timeout": timedelta(seconds=float(options.get("start_to_close", 86400.0))),
        "heartbeat_timeout": timedelta(seconds=float(options.get("heartbeat_timeout", 5.0))),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=1),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=10),
            maximum_attempts=0,
        ),
        "result_type": dict,
    }


def _rank_of(name: str, prefix: str) -> int:
    try:
        return int(name[len(prefix) :])
    except ValueError:
        raise ApplicationError(
            f"malformed rank in {name!r}", type="UnknownQuery", non_retryable=True
        ) from None


def _pairs(entries: Sequence[Json]) -> list[list[str]]:
    return [[e["envelope"]["replay_key"], e["hash"]] for e in entries]


def _left(envelope: Json, started_at: datetime | None) -> timedelta:
    """A ``sleep`` child's duration, less the time since its run started its first slice
    (``started_at``, paced runs only): a child of a later slice still fires when it
    would have, had every child started at once."""
    duration = timedelta(seconds=float(envelope["input"]["seconds"]))
    if started_at is None:
        return duration
    return max(duration - (workflow.now() - started_at), timedelta(milliseconds=1))


def _start_pace(options: Json) -> timedelta:
    return timedelta(seconds=float(options.get("start_pace") or 0)) or START_PACE


async def _pace(ended: Callable[[], int], pace: timedelta) -> None:
    """Wait until ``ended`` (a count of children ended) grows, or for ``pace``: either way
    a new workflow task, in which the next slice of children starts."""
    before = ended()
    try:
        await workflow.wait_condition(
            lambda: ended() > before,
            timeout=pace,
            timeout_summary="start the next slice of children",
        )
    except asyncio.TimeoutError:  # noqa: UP041 (TimeoutError is Temporal's here)
        pass


def shard_starts(spec: Json, count: int) -> list[int]:
    """The first position of each shard; empty when the group runs in one workflow. A
    chunked open records its starts (cut by count and bytes); older specs derive them
    from the shard size."""
    starts = spec.get("shards")
    if starts is None:
        size = int((spec.get("options") or {}).get("shard_size") or 0)
        starts = list(range(0, count, size)) if 0 < size < count else []
    return [int(s) for s in starts] if len(starts) > 1 else []


@workflow.defn(name=WORKFLOW_NAME)
class EffectGroupWorkflow:
    """One group. Start argument: the group spec (see ``_controller._plan``).

    A group too large for one workflow input is opened in chunks: the spec then holds the
    shape, the children's digest and a manifest ``chunks`` (``[start, end, digest]``)
    instead of the children, which arrive by :data:`OPEN_CHUNK_UPDATE`. Until every
    chunk is recorded the run starts nothing, and reads, closes and events are refused as
    ``UnknownGroup``: a partial open is completed by a retry of the same open."""

    @workflow.init
    def __init__(self, spec: Json) -> None:
        self._key: str = spec["key"]
        self._wake: str = spec["wake"]
        self._declared: str = spec["disposition"]
        self._effective: str = spec["disposition"]
        children: list[Any] = list(spec["children"])
        self._count: int = int(spec.get("count", len(children)))
        self._chunks: list[list[Any]] = list(spec.get("chunks") or [])
        self._digest: str | None = spec.get("digest")
        self._recorded: set[int] = set()
        self._children: list[Any] = [None] * self._count if self._chunks else children
        self._complete = not self._chunks
        self._options: Json = dict(spec.get("options") or {})
        self._opener: str | None = spec.get("opener")
        self._settled: list[Json] = []
        self._ledger = kit.RankLedger(self._count)  # first settlement wins
        self._events: dict[int, Any] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._activities: dict[int, workflow.ActivityHandle[Json]] = {}
        self._closed = False
        self._named = False
        self._paced = False  # children started a slice per workflow task (PACED_STARTS)
        self._started_at: datetime | None = None  # when a paced run started its first slice
        self._shard_starts = shard_starts(spec, self._count)
        self._shards: list[asyncio.Task[Any]] = []
        self._started_shards: set[int] = set()
        self._sends: list[asyncio.Task[None]] = []
        self._wanting = 0  # awaits of a rank not recorded yet

    # -- run ----------------------------------------------------------------------------

    @workflow.run
    async def run(self, spec: Json) -> Json:
        self._named = workflow.patched(NAMED_CHILDREN)
        self._show_progress()
        if not self._complete:
            await workflow.wait_condition(lambda: self._complete)
        if self._shard_starts:
            for index in range(len(self._shard_starts)):
                self._shards.append(asyncio.create_task(self._run_shard(index)))
        else:
            await self._start_children()
        await workflow.wait_condition(
            lambda: (
                self._closed
                and len(self._settled) == self._count
                and workflow.all_handlers_finished()
                and (not self._named or all(t.done() for t in self._tasks.values()))
                and all(t.done() for t in self._shards)
                and all(t.done() for t in self._sends)
            )
        )
        if self._options.get("payloads"):
            # Retirement deletes the group's stored payloads (G-47). Only groups opened
            # with a payload store schedule it, so older histories replay unchanged.
            await workflow.execute_activity(
                RETIRE_ACTIVITY,
                self._key,
                activity_id="retire",
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
        if workflow.patched(RELEASE_CLAIMS):
            await self._release_claims()
        result = {
            "ranks": [s["replay_key"] for s in self._settled],
            "settled": [
                {
                    "rank": s["rank"],
                    "position": s["position"],
                    "replay_key": s["replay_key"],
                    "tool": self._children[s["position"]]["envelope"]["name"],
                    "status": _status(s["outcome"]),
                }
                for s in self._settled
            ],
        }
        if len(json.dumps(result)) > RESULT_BYTES:  # a result is one payload (2 MiB)
            result = {"order": [s["position"] for s in self._settled]}
        return result

    async def _start_children(self) -> None:
        """Watch (and so start) every child: ``start_slice`` of them per workflow task,
        as a shard does (:data:`~._shared.SHARD_START_SLICE`), skipping a child a
        ``CANCEL`` close ranked before its slice; runs recorded before the slice start
        them all in their first task."""
        count = self._count
        step = int(self._options.get("start_slice") or count)
        self._paced = step < count and workflow.patched(PACED_STARTS)
        if self._paced:
            self._started_at = workflow.now()
        else:
            step = count
        pace = _start_pace(self._options)
        for start in range(0, count, step):
            if start:
                if len(self._settled) == count:
                    break  # a CANCEL close ranked every child: nothing left to start
                await _pace(lambda: len(self._settled), pace)
            for position in range(start, min(start + step, count)):
                if not self._paced or self._ledger.rank_of(position) is None:
                    self._tasks[position] = asyncio.create_task(self._watch(position))

    async def _release_claims(self) -> None:
        """R-11: at retirement the group's claims go. A failure is not retried for long
        and never blocks retirement: a claim left running holds nothing once the group's
        run ended (the next claim of its id takes it over)."""
        try:
            await workflow.execute_activity(
                RELEASE_CLAIMS_ACTIVITY,
                self._key,
                activity_id="release-claims",
                summary=RELEASE_CLAIMS_SUMMARY,
                start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(seconds=5)),
                result_type=int,
            )
        except ActivityError:
            pass

    async def _watch(self, position: int) -> None:
        child = self._children[position]
        envelope = child["envelope"]
        kind = envelope["kind"]
        outcome: Json
        try:
            if kind == "sleep":
                await workflow.sleep(_left(envelope, self._started_at))
                outcome = {"status": "success", "value": None, "error": None}
            elif kind == "await_event":
                await workflow.wait_condition(lambda: position in self._events)
                outcome = {"status": "success", "value": self._events[position], "error": None}
            elif self._named:
                outcome = await self._run_named(position, envelope)
            else:
                outcome = await workflow.execute_activity(
                    CHILD_ACTIVITY,
                    envelope,
                    activity_id=f"child-{position}",
                    cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
                    **self._activity_options(),
                )
        except asyncio.CancelledError:
            outcome = dict(_CANCELLED)
        except ActivityError as exc:
            outcome = _failure(exc)
        self._settle(position, outcome)

    # -- shards (a group wider than its shard size) ---------------------------------------

    async def _run_shard(self, index: int) -> None:
        """Run shard ``index``'s children as a child workflow; their settlements come
        back by :meth:`shard_settled`."""
        starts = self._shard_starts
        start = starts[index]
        end = starts[index + 1] if index + 1 < len(starts) else self._count
        chunk = self._children[start:end]
        try:
            handle = await workflow.start_child_workflow(
                SHARD_WORKFLOW_NAME,
                {
                    "offset": start,
                    "children": [child["envelope"] for child in chunk],
                    "options": self._options,
                },
                id=shard_id(self._key, index),
            )
        finally:
            self._started_shards.add(index)  # a start that failed must not hold signals
        await handle

    @workflow.signal(name=SHARD_SETTLED)
    def shard_settled(self, batch: list[list[Any]]) -> None:
        """A shard's settlements in the order it observed them: each takes the next rank
        as this run records the signal (history orders signals, so replay agrees)."""
        for position, outcome in batch:
            self._settle(int(position), outcome)

    def _send_to_shards(self, signal: str, positions: list[int], *extra: Any) -> None:
        """``signal`` to each shard holding one of ``positions``; the commands go out in
        this workflow task for the shards that have started, and as each other one starts
        (R-5: an event delivered before its shard exists still reaches its waiter)."""
        by_shard: dict[int, list[int]] = {}
        for position in positions:
            index = bisect.bisect_right(self._shard_starts, position) - 1
            by_shard.setdefault(index, []).append(position)
        if not by_shard:
            return
        after_start = workflow.patched(SIGNAL_STARTED_SHARDS)
        for index, held in by_shard.items():
            send = self._signal_shard(index, signal, [held, *extra], after_start)
            self._sends.append(asyncio.create_task(send))

    async def _signal_shard(
        self, index: int, signal: str, args: list[Any], after_start: bool
    ) -> None:
        if after_start and index not in self._started_shards:
            await workflow.wait_condition(lambda: index in self._started_shards)
        shard = workflow.get_external_workflow_handle(shard_id(self._key, index))
        await shard.signal(signal, args)

    def _activity_options(self) -> Json:
        return activity_options(self._options)

    async def _run_named(self, position: int, envelope: Json) -> Json:
        """The child's activity, named ``child-{position}:{tool}`` with a summary. A cancel
        settles the child at once (:meth:`_cancel_unsettled`, so a close still returns
        without waiting) but this watcher waits for the activity to end, so history
        records the loser's end (``ActivityTaskCanceled``, or its completion if it
        finished anyway)."""
        handle = workflow.start_activity(
            CHILD_ACTIVITY,
            envelope,
            activity_id=f"child-{position}:{envelope['name']}",
            summary=f"{envelope['name']} · position {position} · {envelope['replay_key']}",
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            **self._activity_options(),
        )
        self._activities[position] = handle
        outcome: Json = await handle
        return outcome

    def _show_progress(self) -> None:
        """Current details (``temporal workflow describe``, the UI): shape and progress."""
        if not self._named:
            return
        state = f"closed ({self._effective})" if self._closed else "open"
        if not self._complete:
            state = f"opening ({len(self._recorded)}/{len(self._chunks)} chunks recorded)"
        workflow.set_current_details(
            f"effecthost group: wake {self._wake}, losers {self._declared}, "
            f"{self._count} children, settled {len(self._settled)}/"
            f"{self._count}, {state}"
        )

    def _settle(self, position: int, outcome: Json) -> None:
        if self._ledger.settle(position) is None:
            return  # the position holds a rank already: a duplicate takes none
        settlement: Json = {
            "position": position,
            "replay_key": self._children[position]["envelope"]["replay_key"],
            "outcome": outcome,
        }
        assign_rank(self._settled, settlement)
        if telemetry.instrumented() and not workflow.unsafe.is_replaying():
            # the child's span, kept by this process if its activity ran here, ends with
            # its rank (issue 23); no command, so a replay (which skips it) agrees
            telemetry.ranked(self._key, position, settlement["rank"])
        self._show_progress()

    def _cancel_unsettled(self) -> list[str]:
        cancelled: list[str] = []
        if self._shard_starts:
            unsettled = [p for p in range(self._count) if self._ledger.rank_of(p) is None]
            for position in unsettled:
                self._settle(position, dict(_CANCELLED))
                cancelled.append(self._children[position]["envelope"]["replay_key"])
            self._send_to_shards(SHARD_CANCEL, unsettled)
            return cancelled
        for position, task in self._tasks.items():
            if self._ledger.rank_of(position) is None and not task.done():
                activity = self._activities.get(position)
                if activity is None:
                    task.cancel()
                else:  # settled now; its watcher waits for the activity's end
                    activity.cancel()
                    self._settle(position, dict(_CANCELLED))
                cancelled.append(self._children[position]["envelope"]["replay_key"])
        if self._paced:  # the children of slices not started yet never start
            for position in range(self._count):
                if position not in self._tasks and self._ledger.rank_of(position) is None:
                    self._settle(position, dict(_CANCELLED))
                    cancelled.append(self._children[position]["envelope"]["replay_key"])
        return cancelled

    # -- open ---------------------------------------------------------------------------

    @workflow.update(name="open")
    async def open(self, fence: Json) -> Json:
        """Returns the chunks still to record as ``[index, start, end]`` (a chunked
        open, or a retry of one a caller left partial)."""
        if fence.get("opener"):
            self._opener = fence["opener"]
        missing = [
            [i, chunk[0], chunk[1]]
            for i, chunk in enumerate(self._chunks)
            if i not in self._recorded
        ]
        return {"settled": len(self._settled), "missing": missing}

    @open.validator
    def _validate_open(self, fence: Json) -> None:
        """The shape fence (G-13) and each child's hash (G-02); a chunked open (or a
        group recorded in chunks) is fenced on the children's digest too, without naming
        the position (the caller names it from :data:`PAIRS_QUERY`). A refusal here
        leaves nothing in history."""
        children = fence.get("children") or ()
        offer = kit.Offer(self._key, fence["count"], fence["wake"], fence["disposition"], children)
        recorded = [
            kit.RecordedChild(p, c["envelope"]["replay_key"], c["hash"])
            for p, c in enumerate(self._children)
            if c is not None
        ]
        try:
            kit.check_reopen(offer, self._record(), recorded)
        except EffectHostError as exc:
            raise _refusal(exc) from None
        digest = fence.get("digest")
        if digest is None and self._chunks:
            digest = children_digest(children)
        if digest is not None and digest != self._children_digest():
            raise _refuse(
                "ReplayMismatch",
                f"group {self._key!r} is recorded with other children (replay keys or "
                "envelope hashes)",
                group_key=self._key,
            )

    def _children_digest(self) -> str:
        if self._digest is None:
            self._digest = children_digest(_pairs(self._children))
        return self._digest

    @workflow.update(name=OPEN_CHUNK_UPDATE)
    async def open_chunk(self, index: int, entries: list[Json]) -> None:
        """Record chunk ``index`` (a second copy is a no-op); the last one lets the run
        start its children."""
        if index in self._recorded:
            return
        start, end = self._chunks[index][0], self._chunks[index][1]
        self._children[start:end] = entries
        self._recorded.add(index)
        self._complete = len(self._recorded) == len(self._chunks)
        self._show_progress()

    @open_chunk.validator
    def _validate_open_chunk(self, index: int, entries: list[Json]) -> None:
        """A chunk must be the one the manifest fenced: its positions and digest."""
        if 0 <= index < len(self._chunks):
            start, end, digest = self._chunks[index]
            if len(entries) == end - start and children_digest(_pairs(entries)) == digest:
                return
        raise _refuse(
            "ReplayMismatch",
            f"chunk {index} of group {self._key!r} is not the chunk the group was opened with",
            group_key=self._key,
        )

    def _require_complete(self) -> None:
        """A group opened in chunks is recorded once every chunk is."""
        if not self._complete:
            raise _refuse(
                "UnknownGroup",
                f"group {self._key!r} is not recorded yet: its open has not completed",
                group_key=self._key,
            )

    def _record(self) -> kit.GroupRecord:
        """What this run knows of its group, as the kit's fences read it."""
        return kit.GroupRecord(
            self._key,
            self._count,
            self._wake,  # type: ignore[arg-type]
            self._declared,  # type: ignore[arg-type]
            self._effective,  # type: ignore[arg-type]
            closed=self._closed,
        )

    # -- read ---------------------------------------------------------------------------

    @workflow.query(name="read")
    def read(self, rank: int) -> Json:
        """Rank ``rank`` if recorded (queries add no history)."""
        return {
            "shape": [self._count, self._wake, self._declared],
            "closed": self._closed,
            "effective": self._effective,
            "settlement": self._settled[rank - 1] if 0 < rank <= len(self._settled) else None,
        }

    @workflow.query(dynamic=True)
    def read_by_name(self, name: str, args: Sequence[RawValue]) -> Any:
        """``read:<rank>`` (as :meth:`read`, argument-less), ``ranks:<after>`` (the
        batch after rank ``after``, :meth:`_batch`) and ``settled`` (every settlement as
        recorded). Unknown names fail the query; queries add no history."""
        if name.startswith(READ_QUERY):
            return self.read(_rank_of(name, READ_QUERY))
        if name.startswith(RANKS_QUERY):
            return self._batch(_rank_of(name, RANKS_QUERY))
        if name == SETTLED_QUERY:
            return list(self._settled)
        if name == CLAIMS_QUERY:
            buckets = {
                claim_bucket(c["envelope"]["replay_key"], self._key)
                for c in self._children
                if c is not None
            }
            return sorted([list(b) for b in buckets])
        if name.startswith(HAS_KEY_QUERY):
            key = name[len(HAS_KEY_QUERY) :]
            return any(c is not None and c["envelope"]["replay_key"] == key for c in self._children)
        if name.startswith(HOLD_QUERY):
            return self._hold(_rank_of(name, HOLD_QUERY))
        if name.startswith(PAIRS_QUERY):
            start = _rank_of(name, PAIRS_QUERY)
            page = self._children[start : start + PAIRS_PAGE]
            return [None if c is None else [c["envelope"]["replay_key"], c["hash"]] for c in page]
        raise ApplicationError(f"unknown query {name!r}", type="UnknownQuery")

    def _hold(self, position: int) -> bool:
        """R-13: whether a re-run attempt of the child at ``position`` must not start its
        tool yet: it holds a rank already (a close cancelled it; the cancel reaches it
        next), or the group is decided and no caller awaits a rank that does not exist."""
        if not self._complete or not 0 <= position < self._count:
            return False
        if self._ledger.rank_of(position) is not None:
            return True
        statuses = (_status(s["outcome"]) for s in self._settled)
        return not self._wanting and kit.decided(self._record(), statuses)

    async def _wait_for(self, ready: Any) -> None:
        """Wait for ``ready`` (a rank recorded or the group closed) as a caller awaiting
        a missing rank: while it waits, held losers may run (:meth:`_hold`)."""
        wanting = not ready()
        self._wanting += wanting
        try:
            await workflow.wait_condition(ready)
        finally:
            self._wanting -= wanting

    def _batch(self, after: int) -> Json:
        """The group's state and the settlements ranked after ``after`` that are
        recorded, up to :data:`BATCH_BYTES` of outcomes (at least one)."""
        batch: list[Json] = []
        size = 0
        for settlement in self._settled[max(after, 0) :]:
            size += len(json.dumps(settlement["outcome"])) + 256
            if batch and size > BATCH_BYTES:
                break
            batch.append(settlement)
        return {
            "shape": [self._count, self._wake, self._declared],
            "closed": self._closed,
            "effective": self._effective,
            "settlements": batch,
        }

    @workflow.query(name="status")
    def status(self) -> Json:
        return {
            "shape": [self._count, self._wake, self._declared],
            "closed": self._closed,
            "effective": self._effective,
            "opener": self._opener,
            "order": [s["position"] for s in self._settled],
            "unsettled": [
                {"position": p, "envelope": c["envelope"]}
                for p, c in enumerate(self._children)
                if c is not None and self._ledger.rank_of(p) is None
            ],
        }

    @workflow.update(name="await_rank")
    async def await_rank(self, rank: int) -> Json:
        return await self._await_rank(rank)

    async def _await_rank(self, rank: int) -> Json:
        await self._wait_for(lambda: len(self._settled) >= rank or self._closed)
        if len(self._settled) >= rank:
            return self._settled[rank - 1]
        raise _refusal(kit.group_closed(self._key))

    @await_rank.validator
    def _validate_await_rank(self, rank: int) -> None:
        """The caller fenced its handle with a query; here the group is read again:
        ``GroupClosed``, then the cursor (R-2)."""
        self._require_complete()
        record = self._record()
        claim = kit.HandleClaim(record.child_count, record.wake, record.declared, rank - 1)
        try:
            kit.check_await(self._key, claim, record)
        except EffectHostError as exc:
            raise _refusal(exc) from None

    @workflow.update(dynamic=True)
    async def await_rank_by_name(self, name: str, args: Sequence[RawValue]) -> Json:
        """``await_rank:<rank>``: :meth:`await_rank` with the rank in the name, so the
        update carries no argument the worker must decode; ``await_ranks:<after>``:
        :meth:`_await_batch`."""
        if name.startswith(AWAIT_RANKS_UPDATE):
            return await self._await_batch(_rank_of(name, AWAIT_RANKS_UPDATE))
        return await self._await_rank(_rank_of(name, AWAIT_UPDATE))

    @await_rank_by_name.validator
    def _validate_await_rank_by_name(self, name: str, args: Sequence[RawValue]) -> None:
        if name.startswith(AWAIT_RANKS_UPDATE):
            self._validate_await_rank(_rank_of(name, AWAIT_RANKS_UPDATE) + 1)
        elif name.startswith(AWAIT_UPDATE):
            self._validate_await_rank(_rank_of(name, AWAIT_UPDATE))
        else:
            raise _refuse("UnknownUpdate", f"unknown update {name!r}", group_key=self._key)

    async def _await_batch(self, after: int) -> Json:
        """``await_ranks:<after>``: once a rank after ``after`` is recorded, the batch
        then recorded (G-21: the first settlement wakes it); ``GroupClosed`` when the
        group closes first."""
        await self._wait_for(lambda: len(self._settled) > after or self._closed)
        if len(self._settled) > after:
            return self._batch(after)
        raise _refusal(kit.group_closed(self._key))

    @workflow.update(name="overwrite_outcome")
    async def overwrite_outcome(self, replay_key: str, outcome: Any) -> None:
        """Test hook (groups opened with option ``test_hooks`` only): replace the recorded
        outcome of the settled child ``replay_key`` as an attacker with write access to
        the records could (the conformance check of G-48)."""
        for settlement in self._settled:
            if settlement["replay_key"] == replay_key:
                settlement["outcome"] = outcome

    @overwrite_outcome.validator
    def _validate_overwrite_outcome(self, replay_key: str, outcome: Any) -> None:
        if not self._options.get("test_hooks"):
            raise _refuse(
                "TestHooksDisabled",
                f"group {self._key!r} was not opened with test hooks",
                group_key=self._key,
            )
        if not any(s["replay_key"] == replay_key for s in self._settled):
            raise _refuse(
                "UnknownGroup",
                f"no settled child {replay_key!r} in group {self._key!r}",
                group_key=self._key,
                replay_key=replay_key,
            )

    # -- close --------------------------------------------------------------------------

    def _close(self, target: str) -> None:
        self._effective = target
        if not self._closed:
            self._closed = True
            workflow.upsert_memo({MEMO_STATE: "closed"})
        if target == "cancel":
            self._cancel_unsettled()
        self._show_progress()

    def _close_target(self, disposition: str | None, shape: list[Any] | None) -> str | None:
        """R-2's order for a close: the handle's shape (G-20), then a closed group is a
        no-op (``None``; R-4), then the narrowing."""
        self._require_complete()
        claim = None if shape is None else kit.HandleClaim(shape[0], shape[1], shape[2])
        try:
            target = kit.check_close(self._key, claim, self._record(), disposition)
        except EffectHostError as exc:
            raise _refusal(exc) from None
        return None if target is None else target.value

    @workflow.update(name="close")
    async def close(self, disposition: str | None, shape: list[Any] | None = None) -> None:
        """Idempotent, narrows only (G-26); a close of a closed group is a no-op. Under
        CANCEL the cancel requests of every unsettled child go out in this workflow task
        and the update returns without waiting for the activities to stop (G-27, G-45).
        ``shape`` is the handle's (absent in histories recorded before it was sent)."""
        target = self._close_target(disposition, shape)
        if target is not None:
            self._close(target)

    @close.validator
    def _validate_close(self, disposition: str | None, shape: list[Any] | None = None) -> None:
        self._close_target(disposition, shape)

    @workflow.signal(name="close_signal")
    def close_signal(self, disposition: str | None) -> None:
        """Fallback when the run's update budget is spent; a widening is ignored, and so
        is a close of a closed group (R-4), and of a group not recorded yet."""
        if self._closed or not self._complete:
            return
        try:
            target = kit.narrow(self._key, self._effective, disposition).value
        except EffectHostError:
            target = self._effective
        self._close(target)

    # -- events and drain ---------------------------------------------------------------

    @workflow.update(name="deliver")
    async def deliver(self, name: str, payload: Any) -> int:
        """Settle every unsettled ``await_event`` child named ``name`` (G-51); in a
        sharded group, through the shards that hold them."""
        reached = 0
        targets: list[int] = []
        for position, child in enumerate(self._children):
            envelope = child["envelope"]
            if (
                envelope["kind"] == "await_event"
                and envelope["name"] == name
                and self._ledger.rank_of(position) is None
                and position not in self._events
            ):
                self._events[position] = payload
                reached += 1
                targets.append(position)
        if self._shard_starts and targets:
            self._send_to_shards(SHARD_EVENT, targets, payload)
        return reached

    @deliver.validator
    def _validate_deliver(self, name: str, payload: Any) -> None:
        self._require_complete()

    @workflow.update(name="drain_cancel")
    async def drain_cancel(self, opener: str | None) -> list[str]:
        """Apply a declared CANCEL for a caller that is gone (G-29): only when still
        unclosed and still owned by the opener the drain judged gone."""
        if (
            self._closed
            or not self._complete
            or self._effective != "cancel"
            or self._opener != opener
        ):
            return []
        return self._cancel_unsettled()


@workflow.defn(name=SHARD_WORKFLOW_NAME)
class EffectShardWorkflow:
    """A slice of a wide group's children, run as a child workflow of the group's run.

    Each child has its own watcher task (as in the group workflow); settlements go to the
    group in the order this run observes them, batched (one signal carries every
    settlement observed while the previous one was being sent, or, with the group's
    ``signal_interval``, within that interval after it: :meth:`_report`). The group
    assigns the ranks; a duplicate report (a child it already settled as cancelled) takes
    none there. Start argument: ``{"offset", "children": [envelope], "options"}``."""

    @workflow.init
    def __init__(self, spec: Json) -> None:
        self._offset: int = spec["offset"]
        self._children: list[Json] = list(spec["children"])
        self._options: Json = dict(spec.get("options") or {})
        self._events: dict[int, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._activities: dict[int, workflow.ActivityHandle[Json]] = {}
        self._outbox: list[list[Any]] = []
        self._cancelled: set[int] = set()
        self._finished = False
        self._ended = 0  # watchers ended (the next slice of children starts on one)
        self._started_at: datetime | None = None  # when a paced shard started its first slice

    @workflow.run
    async def run(self, spec: Json) -> int:
        parent = workflow.info().parent
        assert parent is not None, "a shard runs as a group's child workflow"
        group = workflow.get_external_workflow_handle(parent.workflow_id, run_id=parent.run_id)
        count = len(self._children)
        step = int(self._options.get("start_slice") or count)
        if step < count and workflow.patched(PACED_STARTS):
            self._started_at = workflow.now()
        else:
            step = count  # runs recorded before the slice start every child at once
        self._start(0, step)
        reporter = asyncio.create_task(self._report(group))
        for start in range(step, count, step):
            # The next slice goes out in a workflow task of its own (SHARD_START_SLICE).
            await _pace(lambda: self._ended + len(self._cancelled), _start_pace(self._options))
            self._start(start, start + step)
        await workflow.wait_condition(lambda: all(task.done() for task in self._tasks))
        self._finished = True
        await reporter
        return len(self._children)

    def _start(self, start: int, end: int) -> None:
        """Watch (and so start) the children at indexes ``start`` up to ``end``."""
        count = len(self._children)
        self._tasks += [
            asyncio.create_task(self._watch(index)) for index in range(start, min(end, count))
        ]

    async def _report(self, group: workflow.ExternalWorkflowHandle[Any]) -> None:
        """Send the outbox to the group, one signal at a time. With the group's
        ``signal_interval`` (recorded at open; absent in runs recorded before it) a
        report goes out at once when the previous one is at least that old, and
        otherwise waits for the interval's end, gathering what the shard observes
        meanwhile; the shard's last report goes out as soon as its children end."""
        interval = float(self._options.get("signal_interval") or 0)
        sent_at: datetime | None = None
        while True:
            await workflow.wait_condition(lambda: bool(self._outbox) or self._finished)
            if not self._outbox:
                return
            if interval and sent_at is not None and not self._finished:
                wait = interval - (workflow.now() - sent_at).total_seconds()
                if wait > 0:
                    try:
                        await workflow.wait_condition(
                            lambda: self._finished,
                            timeout=wait,
                            timeout_summary="gather settlements for the next report",
                        )
                    except asyncio.TimeoutError:  # noqa: UP041 (TimeoutError is Temporal's here)
                        pass
            batch, self._outbox = self._outbox, []
            sent_at = workflow.now()
            await group.signal(SHARD_SETTLED, batch)

    async def _watch(self, index: int) -> None:
        envelope = self._children[index]
        position = self._offset + index
        kind = envelope["kind"]
        outcome: Json
        try:
            if index in self._cancelled:  # cancelled before this run started it
                outcome = dict(_CANCELLED)
            elif kind == "sleep":
                await workflow.sleep(_left(envelope, self._started_at))
                outcome = {"status": "success", "value": None, "error": None}
            elif kind == "await_event":
                await workflow.wait_condition(lambda: index in self._events)
                outcome = {"status": "success", "value": self._events[index], "error": None}
            else:
                handle = workflow.start_activity(
                    CHILD_ACTIVITY,
                    envelope,
                    activity_id=f"child-{position}:{envelope['name']}",
                    summary=f"{envelope['name']} · position {position} · {envelope['replay_key']}",
                    cancellation_type=(
                        workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                    ),
                    **activity_options(self._options),
                )
                self._activities[index] = handle
                outcome = await handle
        except asyncio.CancelledError:
            outcome = dict(_CANCELLED)
        except ActivityError as exc:
            outcome = _failure(exc)
        self._outbox.append([position, outcome])
        self._ended += 1

    @workflow.signal(name=SHARD_CANCEL)
    def cancel(self, args: list[Any]) -> None:
        """Cancel the children at these positions that have not ended (the group has
        settled them as cancelled already)."""
        for position in args[0]:
            index = int(position) - self._offset
            self._cancelled.add(index)
            if not 0 <= index < len(self._tasks) or self._tasks[index].done():
                continue
            activity = self._activities.get(index)
            if activity is None:
                self._tasks[index].cancel()
            else:
                activity.cancel()

    @workflow.signal(name=SHARD_EVENT)
    def event(self, args: list[Any]) -> None:
        """An event for the ``await_event`` children at these positions."""
        positions, payload = args
        for position in positions:
            self._events.setdefault(int(position) - self._offset, payload)
