"""Read-only inspection of the group workflows of a Temporal namespace: the visibility
list, the ``status`` and ``settled`` queries, and a read of the history (for the tool
names of settled children and when activity children ended). None of these adds an event
to a history.

A deployment whose payloads are sealed with a codec (:func:`sealed_data_converter`)
cannot be read without its keys: the queries' answers are ciphertext here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from effecthost._inspect import (
    ChildRow,
    GroupRow,
    TierUnreachable,
    UnknownGroupKey,
    in_rank_order,
    open_group,
    running_child,
    settled_child,
)
from effecthost.hosts import require

from ._shared import MEMO_STATE, SETTLED_QUERY, WORKFLOW_NAME

_ENDED = (
    "activity_task_completed_event_attributes",
    "activity_task_failed_event_attributes",
    "activity_task_canceled_event_attributes",
    "activity_task_timed_out_event_attributes",
)


class TemporalInspector:
    """Open groups and their ranks in ``namespace`` at ``address``."""

    def __init__(self, client: Any) -> None:
        self._client = client

    @classmethod
    async def connect(
        cls, address: str, namespace: str = "default", *, timeout: float = 10.0
    ) -> TemporalInspector:
        (client_module,) = require("temporal", "temporal", "temporalio.client")
        try:
            client = await asyncio.wait_for(
                client_module.Client.connect(address, namespace=namespace), timeout
            )
        except (RuntimeError, OSError, TimeoutError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else str(exc).splitlines()[0]
            raise TierUnreachable(f"Temporal at {address}: cannot connect ({why})") from None
        return cls(client)

    async def aclose(self) -> None:
        """The client holds no resource to release."""

    async def _status(self, key: str) -> dict[str, Any]:
        status: dict[str, Any] = await self._client.get_workflow_handle(key).query("status")
        return status

    async def _open(self) -> dict[str, Any]:
        """Running group workflows no caller has closed → their visibility entries."""
        from temporalio.service import RPCError

        query = f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running'"
        found: dict[str, Any] = {}
        try:
            async for execution in self._client.list_workflows(query):
                if (await execution.memo()).get(MEMO_STATE) != "closed":
                    found[execution.id] = execution
        except RPCError as exc:
            raise TierUnreachable(f"Temporal visibility: {exc.message}") from None
        return found

    async def groups(self) -> list[GroupRow]:
        from temporalio.client import WorkflowQueryFailedError
        from temporalio.service import RPCError

        rows: list[GroupRow] = []
        for key, execution in sorted((await self._open()).items()):
            try:
                status = await self._status(key)
            except (RPCError, WorkflowQueryFailedError):
                # no worker answers queries for it now: list what visibility knows
                rows.append(open_group(key, _started(execution)))
                continue
            if status["closed"]:
                continue  # closed since the (eventually consistent) listing
            rows.append(_group(key, execution, status))
        return rows

    async def group(self, group_key: str) -> tuple[GroupRow, list[ChildRow]]:
        from temporalio.client import WorkflowQueryFailedError
        from temporalio.service import RPCError, RPCStatusCode

        handle = self._client.get_workflow_handle(group_key)
        try:
            execution = await handle.describe()
            if execution.workflow_type != WORKFLOW_NAME:
                raise UnknownGroupKey(group_key)
            status = await self._status(group_key)
            settled: list[dict[str, Any]] = await handle.query(SETTLED_QUERY)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise UnknownGroupKey(group_key) from None
            raise TierUnreachable(f"Temporal: {exc.message}") from None
        except WorkflowQueryFailedError:
            raise UnknownGroupKey(group_key) from None  # a finished run answers no query
        if status["closed"]:
            raise UnknownGroupKey(group_key)
        names, scheduled_at, ended = await self._from_history(handle)
        ranked = {s["position"]: (rank, s) for rank, s in enumerate(settled, start=1)}
        children: list[ChildRow] = []
        for position, name in enumerate(names):
            if position in ranked:
                rank, record = ranked[position]
                rk = record["replay_key"]
                children.append(
                    settled_child(
                        rank,
                        position,
                        rk,
                        name,
                        record["outcome"],
                        ended.get(rk),
                        scheduled_at.get(rk),
                    )
                )
        for entry in status["unsettled"]:
            rk = entry["envelope"]["replay_key"]
            children.append(
                running_child(
                    entry["position"], rk, entry["envelope"]["name"], scheduled_at.get(rk)
                )
            )
        return _group(group_key, execution, status), in_rank_order(children)

    async def _from_history(
        self, handle: Any
    ) -> tuple[list[str], dict[str, float], dict[str, float]]:
        """Each child's tool name (from the start input, in position order) and, per
        replay key, when its activity was scheduled and when it ended (matched through
        the scheduled activity's input). A retried activity's start event is written
        only when it ends, so the scheduling is the start a timeline can rely on."""
        converter = self._client.data_converter
        names: list[str] = []
        scheduled: dict[int, str] = {}
        scheduled_at: dict[str, float] = {}
        ended: dict[str, float] = {}
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_started_event_attributes"):
                payloads = event.workflow_execution_started_event_attributes.input.payloads
                (spec,) = await converter.decode(payloads, [dict])
                names = [c["envelope"]["name"] for c in spec["children"]]
            elif event.HasField("activity_task_scheduled_event_attributes"):
                payloads = event.activity_task_scheduled_event_attributes.input.payloads
                try:
                    (envelope,) = await converter.decode(payloads, [dict])
                except Exception:  # not a child activity (e.g. the payload retirement)
                    continue
                if isinstance(envelope, dict) and "replay_key" in envelope:
                    scheduled[event.event_id] = envelope["replay_key"]
                    at = event.event_time.ToMicroseconds() / 1e6
                    scheduled_at.setdefault(envelope["replay_key"], at)
            else:
                for field in _ENDED:
                    if event.HasField(field):
                        rk = scheduled.get(getattr(event, field).scheduled_event_id)
                        if rk is not None:
                            ended[rk] = event.event_time.ToMicroseconds() / 1e6
        return names, scheduled_at, ended


def _started(execution: Any) -> float | None:
    return execution.start_time.timestamp() if execution.start_time else None


def _group(key: str, execution: Any, status: dict[str, Any]) -> GroupRow:
    count, wake, _declared = status["shape"]
    return open_group(
        key,
        _started(execution),
        wake,
        status["effective"],
        len(status["order"]),
        int(count),
        status.get("opener"),
    )
