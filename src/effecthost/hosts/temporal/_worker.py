"""The child activity, the one-call worker (G-46) and its runner with a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from effecthost import telemetry
from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    ExecutionInput,
    GroupExecutors,
    Outcome,
)
from effecthost.hosts import require
from effecthost.hosts._shutdown import DEFAULT_GRACE, Stopper
from effecthost.payloads import AesGcmSealer, KeyStore, PayloadPolicy, encode_outcome

require("temporal", "temporal", "temporalio")

from temporalio import activity  # noqa: E402
from temporalio.client import Client, WorkflowQueryFailedError  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.service import RPCError, RPCStatusCode  # noqa: E402
from temporalio.worker import Worker  # noqa: E402
from temporalio.worker.workflow_sandbox import (  # noqa: E402
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)

from ._claims import Claims  # noqa: E402
from ._codec import sealed_client  # noqa: E402
from ._shared import (  # noqa: E402
    CHILD_ACTIVITY,
    CLAIMS_QUERY,
    HOLD_QUERY,
    INLINE_OUTCOME_BYTES,
    RELEASE_CLAIMS_ACTIVITY,
    RETIRE_ACTIVITY,
    SHARD_ID_SEPARATOR,
    SHARD_WORKFLOW_NAME,
    error_details,
)
from ._tracing import traced_client  # noqa: E402
from ._workflow import EffectGroupWorkflow, EffectShardWorkflow  # noqa: E402

HOLD_POLL = 0.5
"""Seconds between a held child's questions to its group (R-13): bounds how late a
caller's await of a missing rank starts it."""

RANK_WAIT = 30.0
"""Seconds a traced child's span, ended, waits in this process for the rank its group's
workflow assigns (issue 23): the workflow task that assigns it names it here when it runs
in this process; when it runs in another worker the span is exported without a rank."""

HEARTBEAT_EVERY = 0.5
"""Seconds between heartbeats of a running child; a cancel reaches a child only
through a heartbeat, so this bounds how late a ``CANCEL`` close reaches a loser."""


class ChildActivities:
    """Runs ``tool_call`` children through the worker's registered resolver (G-09).

    With a :class:`~effecthost.payloads.PayloadPolicy` the activity returns the outcome's
    stored form (:func:`~effecthost.payloads.encode_outcome`): above the inline threshold
    the bytes go to the policy's store and history carries the reference (G-47); with a
    sealer the outcome is sealed for its slot (G-48). Without one it returns the plain
    outcome and refuses one over :data:`INLINE_OUTCOME_BYTES` as a ``PayloadTooLarge``
    failure.
    """

    def __init__(
        self,
        resolver: GroupExecutors | None,
        payloads: PayloadPolicy | None = None,
        client: Client | None = None,
    ) -> None:
        self._resolver = resolver
        self._payloads = payloads
        self._client = client

    @activity.defn(name=RETIRE_ACTIVITY)
    async def retire_payloads(self, group_key: str) -> None:
        """Delete the stored payloads of a retired group (idempotent)."""
        store = self._payloads.store if self._payloads is not None else None
        if store is not None:
            await store.delete_group(group_key)

    @activity.defn(name=RELEASE_CLAIMS_ACTIVITY)
    async def release_claims(self, group_key: str) -> int:
        """End the retiring group's replay-key claims (R-11; idempotent)."""
        if self._client is None:
            return 0
        group = self._client.get_workflow_handle(group_key)
        buckets = await group.query(CLAIMS_QUERY, result_type=list)
        return await Claims(self._client).release_group(group_key, buckets)

    @activity.defn(name=CHILD_ACTIVITY)
    async def run_child(self, envelope_doc: dict[str, Any]) -> dict[str, Any]:
        info = activity.info()
        envelope = EffectEnvelope.model_validate(envelope_doc)
        ids = _ids(envelope)
        executor = None
        if self._resolver is not None and envelope.kind == EffectKind.TOOL_CALL:
            executor = self._resolver.resolve(envelope)
        if executor is None:
            if info.attempt == 1:
                # Nothing on this deployment binds the child: the engine's own terminal
                # 404, never retried (G-14).
                raise ApplicationError(
                    f"no deployment binds {envelope.kind} {envelope.name!r} "
                    f"(child {envelope.replay_key!r})",
                    {**ids, "code": 404},
                    type="Unroutable",
                    non_retryable=True,
                )
            # It ran here before: a deployment change after the group was recorded. It
            # stays unfinished (retried with backoff) and the drain reports it (G-11).
            raise ApplicationError(
                f"the resolver returned None for child {envelope.replay_key!r}",
                ids,
                type="NoExecutor",
            )
        beat = asyncio.create_task(_heartbeat())
        try:
            if info.attempt > 1:
                await self._stay_down(info)
            # the group's workflow names the rank, in this process if its task runs here
            telemetry.rank_later(within=RANK_WAIT)
            outcome = await executor.execute(ExecutionInput(envelope, attempt=info.attempt))
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        group_key = info.workflow_id or ids.get("group_key") or envelope.replay_key
        return await self._record(group_key, envelope.replay_key, _position(info), outcome)

    async def _stay_down(self, info: activity.Info) -> None:
        """R-13: a re-run attempt (the one before was cut off, e.g. by a dead worker)
        starts its tool only once its group's workflow says so (:data:`HOLD_QUERY`):
        a loser of a decided group waits, heartbeating, until a caller awaits a rank that
        does not exist yet, or the close's cancel reaches it. A run recorded before the
        query existed answers ``UnknownQuery``: the attempt runs, as it did then. An
        engine that does not answer is asked again: running could start a loser twice."""
        if self._client is None:
            return
        group_key = info.workflow_id or ""
        if info.workflow_type == SHARD_WORKFLOW_NAME:
            group_key = group_key.rpartition(SHARD_ID_SEPARATOR)[0]
        group = self._client.get_workflow_handle(group_key)
        name = f"{HOLD_QUERY}{_position(info)}"
        while True:
            try:
                if not await group.query(name, result_type=bool):
                    return
            except WorkflowQueryFailedError:
                return
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    return
            await asyncio.sleep(HOLD_POLL)

    async def _record(
        self, group_key: str, replay_key: str, position: int, outcome: Outcome
    ) -> dict[str, Any]:
        """What history carries for ``outcome``: the stored form with a policy (the
        workflow id is the group key), the plain outcome without one."""
        policy = self._payloads
        if policy is None:
            doc = outcome.model_dump(mode="json")
        else:
            stored = await encode_outcome(policy, group_key, replay_key, outcome, position=position)
            doc = stored.model_dump(mode="json")
        size = len(json.dumps(doc))
        if size > INLINE_OUTCOME_BYTES:
            # No store (or a threshold above the limit): a typed refusal, never an
            # oversize history event.
            refusal = Outcome.failure(
                "PayloadTooLarge",
                f"outcome of {replay_key!r} is {size} bytes recorded, over the inline "
                f"limit of {INLINE_OUTCOME_BYTES}; configure a payload store",
            )
            if policy is None:
                return refusal.model_dump(mode="json")
            stored = await encode_outcome(policy, group_key, replay_key, refusal, position=position)
            doc = stored.model_dump(mode="json")
        return doc


def _position(info: activity.Info) -> int:
    """The child's position: the workflow schedules child ``n`` as activity
    ``child-n:{tool}`` (``child-n`` in runs started before the tool was named), the
    position its settlement records (bound into a sealed outcome, R-10)."""
    prefix, _, rest = info.activity_id.partition("-")
    number = rest.partition(":")[0]
    if prefix != "child" or not number.isdigit():
        raise ApplicationError(
            f"activity {info.activity_id!r} is not a group child", type="NotAChild"
        )
    return int(number)


async def _heartbeat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY)


def _ids(envelope: EffectEnvelope) -> dict[str, Any]:
    membership = envelope.membership
    return error_details(
        group_key=membership.group_key if membership else None,
        replay_key=envelope.replay_key,
        position=membership.position if membership else None,
    )


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox runner the worker (and a replayer) uses: ``effecthost`` passes through."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("effecthost", "pydantic")
    )


def create_worker(
    client: Client,
    task_queue: str,
    resolver: GroupExecutors | None,
    *,
    sticky_queue_schedule_to_start_timeout: timedelta = timedelta(seconds=1),
    max_heartbeat_throttle_interval: timedelta = timedelta(seconds=1),
    interceptors: Sequence[Any] = (),
    payloads: PayloadPolicy | None = None,
    keys: KeyStore | None = None,
    **worker_options: Any,
) -> Worker:
    """One call: a worker with the group workflow and the child activity registered for
    ``task_queue``, resolving ``tool_call`` children through ``resolver`` (G-46).

    Crash settings: a short sticky-queue schedule-to-start timeout, so the next workflow
    task of a group leaves a dead worker's sticky queue quickly; and a short heartbeat
    throttle, so a cancel reaches a running child quickly.

    Payloads (G-47…G-50): ``payloads`` is how the child activity records outcomes (by
    reference above its threshold, sealed with its sealer); callers need a policy with the
    same store and keys. ``keys`` wires :class:`~._codec.SealingCodec` into the worker's
    client (every payload in history sealed) and, when ``payloads`` is not given, seals
    outcomes with ``AesGcmSealer(keys)`` (inline, no store).
    """
    client = traced_client(client)  # the caller's trace context reaches the children
    if keys is not None:
        client = sealed_client(client, keys)
        if payloads is None:
            payloads = PayloadPolicy(sealer=AesGcmSealer(keys))
    activities = ChildActivities(resolver, payloads, client)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[EffectGroupWorkflow, EffectShardWorkflow],
        activities=[
            activities.run_child,
            activities.retire_payloads,
            activities.release_claims,
        ],
        workflow_runner=workflow_runner(),
        sticky_queue_schedule_to_start_timeout=sticky_queue_schedule_to_start_timeout,
        max_heartbeat_throttle_interval=max_heartbeat_throttle_interval,
        interceptors=list(interceptors),
        **worker_options,
    )


async def run_worker(
    client: Client,
    task_queue: str,
    resolver: GroupExecutors | None,
    *,
    grace: float = DEFAULT_GRACE,
    on_ready: Callable[[], None] | None = None,
    **options: Any,
) -> None:
    """Run :func:`create_worker`'s worker until SIGTERM or SIGINT, then shut it down
    gracefully within ``grace`` seconds.

    The worker stops polling, lets running children finish for ``grace`` seconds
    (``graceful_shutdown_timeout``) and cancels the rest; Temporal retries a cancelled
    child's activity on another worker, so it settles once. What a cancel cannot stop
    holds the process at most :data:`~effecthost.hosts._shutdown.FORCE_AFTER` seconds
    longer; a second signal exits at once. ``options`` go to :func:`create_worker`.
    """
    worker = create_worker(
        client,
        task_queue,
        resolver,
        graceful_shutdown_timeout=timedelta(seconds=grace),
        **options,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    stopper = Stopper(stop.set, grace)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopper)
    try:
        async with worker:
            if on_ready is not None:
                on_ready()
            await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
