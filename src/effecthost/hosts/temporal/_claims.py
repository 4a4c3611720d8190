"""Replay-key claims (R-6, R-11): a replay key is held by one live group at a time.

Workflow ids are the engine's only strongly consistent index across workflows, so a claim
is a workflow whose id is derived from the key: started with conflict policy ``FAIL``
(a conflict is the refusal) and a start delay of a century, so no workflow task is ever
scheduled and no worker runs it; its memo names the group holding it (read back with
``describe``, which reads the workflow's state, not visibility).

A group's keys of the form ``{its own key}:{n}`` (what the combinators give a group's
children: ``{group key}:{position}``) are claimed per prefix, so a combinator's open
starts one claim whatever its width; any other key has a claim of its own (R-6 is per
key: ``p:1`` and ``p:2`` in two groups are both open). A per-key claim of a key ``p:n``
also asks the holder of the prefix claim of ``p``, if live, whether it holds that key
(:data:`HAS_KEY_QUERY`), so a hand-built key equal to a live combinator group's child key
is refused naming that group. The one order not caught: a key ``p:n`` claimed per key
first, then a group ``p`` opened with it (its prefix claim looks up no per-key claim).
A claim is held while
its group is live: recorded and not retired (its workflow runs, closed or not, R-11).
A retiring group ends its claims (:meth:`Claims.release_group`, run by the worker's
claim-release activity). A claim whose group retired holds nothing anyway: the next
claim of its id terminates it (by run id, so a newer claim is never touched) and takes
its place. A claim whose group was
never recorded (its opener died between the claim and the group's start) holds for
:data:`STALE_CLAIM` after it was started, then is taken over likewise.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from effecthost.hosts import require

require("temporal", "temporal", "temporalio")

from temporalio.client import (  # noqa: E402
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy  # noqa: E402
from temporalio.converter import DataConverter  # noqa: E402
from temporalio.exceptions import WorkflowAlreadyStartedError  # noqa: E402
from temporalio.service import RPCError, RPCStatusCode  # noqa: E402

from ._shared import HAS_KEY_QUERY, claim_bucket, key_prefix  # noqa: E402

CLAIM_WORKFLOW = "effecthost.ReplayKeyClaim"
"""Workflow type of a claim (never run: no worker registers it)."""

CLAIM_QUEUE = "effecthost.replay-key-claims"
"""Task queue of the claims (no worker polls it)."""

CLAIM_DELAY = timedelta(days=36500)
"""A claim's start delay: its first workflow task would be scheduled a century later."""

STALE_CLAIM = timedelta(minutes=10)
"""How long a claim whose group was never recorded holds (its opener may still be
starting the group: an open retries for at most its ``outage_bound``, far less)."""

MEMO_HOLDER = "group_key"

CLAIM_CONCURRENCY = 64
"""Claims one open starts at a time (a group of keys without a common prefix has as many
claims as children)."""


def claim_id(bucket: tuple[str, str]) -> str:
    """The claim's workflow id: a digest, so no replay key is shown in the engine's
    listings and any key fits the id limit."""
    kind, value = bucket
    digest = hashlib.sha256(value.encode()).hexdigest()[:40]
    return f"effecthost.replay-{'keys' if kind == 'prefix' else 'key'}:{digest}"


@dataclass(frozen=True)
class Claimed:
    """The outcome of claiming a group's keys: the claims this call started (released
    when the open is refused) and, when refused, the first child whose key another live
    group holds, and that group."""

    fresh: list[tuple[str, str]]
    position: int | None = None
    replay_key: str | None = None
    holder: str | None = None


class Claims:
    """Claims through ``client``'s service connection, without its codec: the memo holds
    a group key, which is plaintext as a workflow id anyway."""

    def __init__(self, client: Client) -> None:
        self._of = client
        self._plain: Client | None = None

    @property
    def _client(self) -> Client:
        if self._plain is None:
            self._plain = Client(
                self._of.service_client,
                namespace=self._of.namespace,
                data_converter=DataConverter.default,
            )
        return self._plain

    async def claim(self, group_key: str, replay_keys: Sequence[str]) -> Claimed:
        """Claim every key of ``replay_keys`` for ``group_key``. Refused (``holder`` set)
        when another live group holds one; the claims this call started are then still
        held: the caller releases them (:meth:`release`)."""
        first: dict[str, tuple[int, str]] = {}
        for position, replay_key in enumerate(replay_keys):
            first.setdefault(claim_id(claim_bucket(replay_key, group_key)), (position, replay_key))
        gate = asyncio.Semaphore(CLAIM_CONCURRENCY)

        async def one(cid: str) -> tuple[str | None, str | None]:
            async with gate:
                run, holder = await self._claim_one(cid, group_key)
                if holder is None:
                    holder = await self._prefix_holder(first[cid][1], group_key)
                return run, holder

        answers = await asyncio.gather(*(one(cid) for cid in first))
        fresh = [(cid, run) for cid, (run, _) in zip(first, answers, strict=True) if run]
        for cid, (_, holder) in zip(first, answers, strict=True):
            if holder is not None:
                position, replay_key = first[cid]
                return Claimed(fresh, position, replay_key, holder)
        return Claimed(fresh)

    async def release_group(self, group_key: str, buckets: Sequence[Sequence[str]]) -> int:
        """End the claims of the retiring group ``group_key`` (R-11): each claim of
        ``buckets`` still running under its name, terminated by run id (a later claim by
        another group is never touched). Returns how many ended."""
        gate = asyncio.Semaphore(CLAIM_CONCURRENCY)

        async def one(cid: str) -> int:
            async with gate:
                held = await self._describe(cid)
                if held is None or held.status != WorkflowExecutionStatus.RUNNING:
                    return 0
                if (await held.memo()).get(MEMO_HOLDER) != group_key:
                    return 0
                await self._terminate(cid, held.run_id)
                return 1

        ids = {claim_id((str(kind), str(value))) for kind, value in buckets}
        return sum(await asyncio.gather(*(one(cid) for cid in ids)))

    async def release(self, fresh: Sequence[tuple[str, str]]) -> None:
        """Terminate the claims an open started and no longer needs (by run id)."""
        await asyncio.gather(*(self._terminate(cid, run) for cid, run in fresh))

    async def _claim_one(self, cid: str, group_key: str) -> tuple[str | None, str | None]:
        """``(run id, None)``: started; ``(None, None)``: ``group_key`` holds it already
        (a reopen, a concurrent first open: R-7); ``(None, holder)``: refused."""
        while True:
            try:
                handle = await self._client.start_workflow(
                    CLAIM_WORKFLOW,
                    group_key,
                    id=cid,
                    task_queue=CLAIM_QUEUE,
                    id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                    start_delay=CLAIM_DELAY,
                    memo={MEMO_HOLDER: group_key},
                )
                return handle.result_run_id, None
            except WorkflowAlreadyStartedError:
                pass
            held = await self._describe(cid)
            if held is None or held.status != WorkflowExecutionStatus.RUNNING:
                continue  # released meanwhile: start again
            holder = (await held.memo()).get(MEMO_HOLDER)
            if holder == group_key:
                return None, None
            if isinstance(holder, str) and await self._holds(holder, held):
                return None, holder
            await self._terminate(cid, held.run_id)  # a dead claim: take its place

    async def _prefix_holder(self, replay_key: str, group_key: str) -> str | None:
        """The live group other than ``group_key`` holding ``replay_key`` through its
        prefix claim (a key ``p:n``, the prefix claim of ``p``), if any."""
        prefix = key_prefix(replay_key)
        if prefix is None or prefix == group_key:
            return None
        held = await self._describe(claim_id(("prefix", prefix)))
        if held is None or held.status != WorkflowExecutionStatus.RUNNING:
            return None
        holder = (await held.memo()).get(MEMO_HOLDER)
        if not isinstance(holder, str) or holder == group_key:
            return None
        if not await self._holds(holder, held):
            return None
        try:
            has = await self._of.get_workflow_handle(holder).query(
                f"{HAS_KEY_QUERY}{replay_key}", result_type=bool
            )
        except (WorkflowQueryFailedError, RPCError):
            # Not recorded yet, or a run of a release without the query: the prefix
            # claim holds every key of its prefix, as it did then.
            return holder
        return holder if has else None

    async def _holds(self, holder: str, claim: WorkflowExecutionDescription) -> bool:
        """Whether the claim ``claim`` of group ``holder`` still holds: the group is
        live, or not recorded yet and the claim younger than :data:`STALE_CLAIM`."""
        group = await self._describe(holder)
        if group is not None:
            return group.status == WorkflowExecutionStatus.RUNNING
        started = claim.start_time
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return datetime.now(UTC) - started < STALE_CLAIM

    async def _describe(self, workflow_id: str) -> WorkflowExecutionDescription | None:
        try:
            return await self._client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise

    async def _terminate(self, cid: str, run_id: str | None) -> None:
        try:
            await self._client.get_workflow_handle(cid, run_id=run_id).terminate(
                reason="replay-key claim released"
            )
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
