"""The child activity and the one-call worker (G-46)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    ExecutionInput,
    GroupExecutors,
    Outcome,
)
from effecthost.hosts import require

require("temporal", "temporal", "temporalio")

from temporalio import activity  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402
from temporalio.worker.workflow_sandbox import (  # noqa: E402
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)

from ._shared import CHILD_ACTIVITY, INLINE_OUTCOME_BYTES, error_details  # noqa: E402
from ._workflow import EffectGroupWorkflow  # noqa: E402

HEARTBEAT_EVERY = 0.5
"""Seconds between heartbeats of a running child; a cancel reaches a child only
through a heartbeat, so this bounds how late a ``CANCEL`` close reaches a loser."""


class ChildActivities:
    """Runs ``tool_call`` children through the worker's registered resolver (G-09)."""

    def __init__(self, resolver: GroupExecutors | None) -> None:
        self._resolver = resolver

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
            outcome = await executor.execute(ExecutionInput(envelope, attempt=info.attempt))
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        doc = outcome.model_dump(mode="json")
        size = len(json.dumps(doc))
        if size > INLINE_OUTCOME_BYTES:
            doc = Outcome.failure(
                "PayloadTooLarge",
                f"outcome of {envelope.replay_key!r} is {size} bytes, over the inline "
                f"limit of {INLINE_OUTCOME_BYTES}",
            ).model_dump(mode="json")
        return doc


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
    **worker_options: Any,
) -> Worker:
    """One call: a worker with the group workflow and the child activity registered for
    ``task_queue``, resolving ``tool_call`` children through ``resolver`` (G-46).

    Crash settings: a short sticky-queue schedule-to-start timeout, so the next workflow
    task of a group leaves a dead worker's sticky queue quickly; and a short heartbeat
    throttle, so a cancel reaches a running child quickly.
    """
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[EffectGroupWorkflow],
        activities=[ChildActivities(resolver).run_child],
        workflow_runner=workflow_runner(),
        sticky_queue_schedule_to_start_timeout=sticky_queue_schedule_to_start_timeout,
        max_heartbeat_throttle_interval=max_heartbeat_throttle_interval,
        interceptors=list(interceptors),
        **worker_options,
    )
