"""A host for a Redis server, written as an engine user would: redis-py and the kit.

One Redis string per group (``PREFIX:g:KEY``) holds everything recorded about it as JSON;
one string per claimed replay key (``PREFIX:r:REPLAY_KEY``) names the group holding it
(R-6). Every read-modify-write is an optimistic transaction: the kit's ``guard`` WATCHes
the group's key, the hooks read it and queue their writes after ``MULTI``, and an ``EXEC``
that finds the key changed raises :class:`~effecthost.contract.kit.Retry`, so the kit runs
the step again from its first read. Settlements and drain passes run through the same
guard (:meth:`~effecthost.contract.kit.KitController.guarded`), so each is one atomic
step and no lock exists that a killed process could keep.

Each host object is an *incarnation* that keeps ``PREFIX:o:OWNER`` alive with a TTL its
heartbeat refreshes: "the owner is gone" (R-1) is "its key expired", at most ``ttl``
seconds after its process died. Children run as asyncio tasks of the host's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

import redis.asyncio as redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, WatchError

from effecthost.contract import (
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    ExecutionInput,
    GroupDocument,
    GroupDrain,
    GroupExecutors,
    GroupRecord,
    LoserPolicy,
    Outcome,
    RecordedChild,
    Settlement,
    Tombstone,
    kit,
)
from effecthost.contract.kit import FirstOpen, Retry, TaskChildren

PREFIX = "effecthost"


class RedisHost(TaskChildren):
    """The contract's controller over a Redis server; ``await host.start()`` before use."""

    def __init__(self, client: redis.Redis, resolver: GroupExecutors | None, ttl: float) -> None:
        self.redis, self.ttl, self.owner = client, ttl, uuid.uuid4().hex
        self.register_executors(resolver)
        self._tx: contextvars.ContextVar[Pipeline] = contextvars.ContextVar("tx")
        self._heartbeat: asyncio.Task[None] | None = None
        self._starting: set[tuple[str, int, int]] = set()  # committed, task not yet made
        self.init_children()

    # [liveness]
    async def start(self) -> RedisHost:
        """Claim this incarnation's liveness key before anything runs, and keep it fresh."""
        await self._beat()
        self._heartbeat = asyncio.create_task(self._beat_forever())
        return self

    async def _beat(self) -> None:
        await self.redis.set(f"{PREFIX}:o:{self.owner}", 1, px=int(self.ttl * 1000))

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 5)  # a heartbeat period, not an ordering
            with contextlib.suppress(RedisError):
                await self._beat()

    async def aclose(self) -> None:
        """Gone now rather than after the TTL: other incarnations may drain at once."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.redis.delete(f"{PREFIX}:o:{self.owner}")
        await self.redis.aclose()

    async def _alive(self, doc: GroupDocument) -> set[str]:
        """The incarnations ``doc`` names whose liveness key has not expired (R-1)."""
        others = sorted(doc.incarnations() - {self.owner})
        found = await self.redis.mget([f"{PREFIX}:o:{o}" for o in others]) if others else []
        return {self.owner, *(o for o, v in zip(others, found, strict=True) if v is not None)}

    # [/liveness]

    # [guard]
    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        """WATCH the group; EXEC commits the step's writes, or it lost a race: Retry."""
        async with self.redis.pipeline() as tx:
            await tx.watch(f"{PREFIX}:g:{key}")
            token = self._tx.set(tx)
            try:
                yield
                await tx.execute()
            except WatchError:
                raise Retry from None
            finally:
                self._tx.reset(token)

    def _queue(self) -> Pipeline:
        """The step's transaction, in its queueing (MULTI) phase: reads go around it."""
        tx = self._tx.get()
        if not tx.explicit_transaction:
            tx.multi()  # type: ignore[no-untyped-call]
        return tx

    async def _read(self, key: str) -> GroupDocument | None:
        raw = await self.redis.get(f"{PREFIX}:g:{key}")
        return None if raw is None else GroupDocument(json.loads(raw))

    def _write(self, doc: GroupDocument) -> None:
        """Queue the document; a retire in this step frees its replay keys (R-11)."""
        tx = self._queue()
        if doc.freed:
            tx.delete(*(f"{PREFIX}:r:{replay_key}" for replay_key in doc.freed))
        tx.set(f"{PREFIX}:g:{doc.key}", json.dumps(doc.data))

    # [/guard]

    async def find_group(self, key: str) -> GroupRecord | Tombstone | None:
        doc = await self._read(key)
        return None if doc is None else doc.known()

    async def recorded_children(self, key: str) -> list[RecordedChild]:
        return (await self._read(key)).recorded_children()  # type: ignore[union-attr]

    # [claims]
    async def replay_key_holders(self, replay_keys: Sequence[str]) -> dict[str, str]:
        """One MGET per open. The claims are WATCHed first, so a claim another open makes
        before this one's EXEC fails the EXEC and the kit runs the open again: that is
        ``record_group``'s re-check of R-6, made by Redis in the commit itself."""
        claims = [f"{PREFIX}:r:{replay_key}" for replay_key in replay_keys]
        await self._tx.get().watch(*claims)
        held = await self.redis.mget(claims)
        return {k: str(h) for k, h in zip(replay_keys, held, strict=True) if h is not None}

    async def record_group(self, opened: FirstOpen) -> bool:
        group = opened.group
        doc = GroupDocument.new(group, self.owner, time.time())
        for position, executor in enumerate(opened.executors):
            self._start(doc, position, executor)
        self._write(doc)
        self._queue().mset({f"{PREFIX}:r:{c.replay_key}": group.key for c in group.children})
        return True  # the key is WATCHed: a concurrent first open's record fails our EXEC

    # [/claims]

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        doc = await self._read(group.key)
        assert doc is not None
        doc.data["owner"] = self.owner  # a reopen makes this incarnation the owner
        if restart:  # a decided group's losers stay down
            await self._start_idle(doc)
        self._write(doc)

    async def restart_unsettled(self, key: str) -> None:
        """A caller awaits a rank that does not exist yet: the losers run on demand (R-13)."""

        async def step() -> None:
            doc = await self._read(key)
            if doc is not None and doc.data["owner"] == self.owner and not doc.data["closed"]:
                await self._start_idle(doc)
                self._write(doc)

        await self.guarded(key, "restart", step)

    async def _start_idle(self, doc: GroupDocument) -> None:
        for position in doc.idle_positions(self.owner, await self._alive(doc), self._running(doc)):
            self._start(doc, position)  # a resolver miss stays unsettled (G-11)

    # [settle]
    def _start(self, doc: GroupDocument, position: int, executor: Any = None) -> bool:
        """Start child ``position`` under a new attempt recorded in ``doc``; its task
        starts once the step committed. ``False`` when the resolver cannot run it. An
        event wait needs no task: ``deliver_event`` settles it."""
        child = doc.children[position]
        envelope = EffectEnvelope.model_validate(child["envelope"])
        if envelope.kind == EffectKind.AWAIT_EVENT:
            return True
        sleep = envelope.kind == EffectKind.SLEEP
        if not sleep and (executor := executor or self.resolve_child(envelope)) is None:
            return False
        key, attempt, due = doc.key, doc.begin_attempt(position, self.owner), child["due"]
        self._starting.add((key, position, attempt))

        def run() -> None:
            work = (
                self.sleep_until(due)  # the due time recorded at open (G-51)
                if sleep
                else executor.execute(ExecutionInput(envelope, attempt=attempt))
            )
            self.run_child(key, position, attempt, work)
            self._starting.discard((key, position, attempt))

        self.after_guard(run)
        return True

    def _running(self, doc: GroupDocument) -> Callable[[int], bool]:
        """Whether this process runs a child of ``doc``, or committed to start it and
        will once its step's guard was left (R-1: a step meanwhile must not start it)."""
        key, started = doc.key, self._starting
        return lambda p: self.is_running(key, p) or (key, p, doc.children[p]["attempt"]) in started

    async def settle_child(
        self, key: str, position: int, attempt: int | None, outcome: Outcome
    ) -> bool:
        async def step() -> bool:
            doc = await self._read(key)
            if doc is None or not doc.settle(position, attempt, outcome):
                return False
            self._write(doc)
            return True

        return await self.guarded(key, "settle", step)

    # [/settle]

    async def read_rank(self, key: str, rank: int) -> Settlement | None:
        doc = await self._read(key)
        return None if doc is None else doc.settlement(rank)

    async def settled_positions(self, key: str) -> list[int]:
        return (await self._read(key)).ranks  # type: ignore[union-attr]

    async def documents(self) -> list[GroupDocument]:
        """Every group recorded, tombstones included: one SCAN, one MGET."""
        keys = [k async for k in self.redis.scan_iter(match=f"{PREFIX}:g:*", count=1000)]
        found = await self.redis.mget(keys) if keys else []
        return [GroupDocument(json.loads(raw)) for raw in found if raw is not None]

    async def open_group_keys(self) -> list[str]:
        return sorted(doc.key for doc in await self.documents() if not doc.data["closed"])

    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        doc = await self._read(key)
        assert doc is not None
        doc.close(disposition)
        self._write(doc)
        self.after_guard(self.notify)  # a parked waiter wakes with GroupClosed

    async def unsettled(self, key: str) -> list[tuple[int, dict[str, Any]]]:
        doc = await self._read(key)
        return [] if doc is None else doc.unsettled()

    def drain(self) -> GroupDrain:
        return RedisDrain(self)

    async def drain_step(self, key: str) -> kit.DrainTally:
        """The drain's decisions on one group, in one guarded step; a step that runs
        again starts a fresh tally."""
        tally, doc = kit.DrainTally(), await self._read(key)
        if doc is None:
            return tally
        alive, start = await self._alive(doc), partial(self._start, doc)
        wired = self.supports_effect_groups()
        if doc.drain(self.owner, alive, self._running(doc), wired=wired, start=start, tally=tally):
            self._write(doc)
        return tally


class RedisDrain(GroupDrain):
    """Finishes the children no live incarnation runs, by the disposition in force."""

    def __init__(self, host: RedisHost) -> None:
        self.host = host

    async def run_pass(self) -> DrainReport:
        host, keys = self.host, [doc.key for doc in await self.host.documents()]
        tallies = [await host.guarded(k, "drain", partial(host.drain_step, k)) for k in keys]
        host.notify()
        return DrainReport(
            resumed=tuple(ids for t in tallies for ids in t.resumed),
            cancelled=tuple(ids for t in tallies for ids in t.cancelled),
            no_executor=tuple(e for t in tallies for e in t.no_executor),
        )
