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
from collections.abc import AsyncIterator, Sequence
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
    GroupDrain,
    GroupExecutors,
    GroupRecord,
    LoserPolicy,
    Outcome,
    RankLedger,
    RecordedChild,
    Settlement,
    Tombstone,
    kit,
    sleep_seconds,
)
from effecthost.contract.kit import FirstOpen, Retry, TaskChildren

Record = dict[str, Any]
CANCELLED = Outcome.cancelled()


# [known]
def known(record: Record | None) -> GroupRecord | Tombstone | None:
    """What the kit's fences read: nothing, a tombstone, or the group's shape."""
    if record is None or not record["children"]:  # a retired group keeps only a tombstone
        return None if record is None else Tombstone(record["key"])
    fields = ("key", "wake", "declared", "effective", "closed")
    return GroupRecord(child_count=len(record["children"]), **{f: record[f] for f in fields})


def settle(record: Record, position: int, attempt: int | None, outcome: Outcome) -> bool:
    """The rank rule on the record: a stale attempt or a retired group is refused, the
    kit's ledger ranks the first settlement of a position ``count + 1`` (G-15, G-16)."""
    if not record["children"]:
        return False
    child = record["children"][position]
    ledger = RankLedger(len(record["children"]), record["ranks"])
    if attempt not in (None, child["attempt"]) or ledger.settle(position) is None:
        return False
    child["outcome"], record["ranks"] = outcome.model_dump(mode="json"), ledger.order
    return True


def decided(record: Record) -> bool:
    """The kit's R-13 rule on what the record holds."""
    shape = known(record)
    ranked = (record["children"][p]["outcome"]["status"] for p in record["ranks"])
    return isinstance(shape, GroupRecord) and not shape.closed and kit.decided(shape, ranked)


# [/known]


# [open]
class RedisHost(TaskChildren):
    """The contract's controller over a Redis server; call :meth:`start` before use."""

    def __init__(
        self,
        client: redis.Redis,
        resolver: GroupExecutors | None,
        *,
        prefix: str = "effecthost",
        ttl: float = 10.0,
    ) -> None:
        self.redis, self.prefix, self.ttl = client, prefix, ttl
        self.register_executors(resolver)
        self.owner = uuid.uuid4().hex
        self._tx: contextvars.ContextVar[Pipeline | None] = contextvars.ContextVar("tx")
        self._heartbeat: asyncio.Task[None] | None = None
        self.init_children()

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{name}"

    async def start(self) -> RedisHost:
        """Claim this incarnation's liveness key before anything runs, and keep it fresh."""
        await self._beat()
        self._heartbeat = asyncio.create_task(self._beat_forever())
        return self

    async def _beat(self) -> None:
        await self.redis.set(self._key("o", self.owner), 1, px=int(self.ttl * 1000))

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 5)  # a heartbeat period, not an ordering
            with contextlib.suppress(RedisError):
                await self._beat()

    async def aclose(self) -> None:
        """Gone now rather than after the TTL: other incarnations may drain at once."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.redis.delete(self._key("o", self.owner))
        await self.redis.aclose()

    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        """WATCH the group; EXEC commits the step's writes, or it lost a race: Retry."""
        async with self.redis.pipeline() as tx:
            await tx.watch(self._key("g", key))
            token = self._tx.set(tx)
            try:
                yield
                await tx.execute()
            except WatchError:
                raise Retry from None
            finally:
                self._tx.reset(token)

    def _queue(self) -> Pipeline:
        """The step's transaction, in its queueing (MULTI) phase: no read goes through it."""
        tx = self._tx.get()
        if not tx.explicit_transaction:
            tx.multi()
        return tx

    async def _read(self, key: str) -> Record | None:
        raw = await self.redis.get(self._key("g", key))
        return None if raw is None else json.loads(raw)  # type: ignore[no-any-return]

    def _write(self, record: Record) -> None:
        """Queue the record, retiring it by the kit's retire rule in the same step as the
        write that made it true, a close or a settlement (G-36, R-11): its replay keys
        are freed and a tombstone keeps the key closed (R-4)."""
        tx, children = self._queue(), record["children"]
        if children and kit.retires(record["closed"], len(children), len(record["ranks"])):
            tx.delete(*(self._key("r", c["replay_key"]) for c in children))
            record.update(children=[], ranks=[])
        tx.set(self._key("g", record["key"]), json.dumps(record))

    async def find_group(self, key: str) -> GroupRecord | Tombstone | None:
        return known(await self._read(key))

    async def recorded_children(self, key: str) -> list[RecordedChild]:
        children = (await self._read(key))["children"]  # type: ignore[index]
        return [RecordedChild(p, c["replay_key"], c["hash"]) for p, c in enumerate(children)]

    async def replay_key_holders(self, replay_keys: Sequence[str]) -> dict[str, str]:
        """One MGET per open. The claims are WATCHed first, so a claim another open makes
        before this one's EXEC fails the EXEC and the kit runs the open again: that is
        ``record_group``'s re-check of R-6, made by Redis in the commit itself."""
        claims = [self._key("r", replay_key) for replay_key in replay_keys]
        await self._tx.get().watch(*claims)  # type: ignore[union-attr]
        held = await self.redis.mget(claims)
        return {k: h for k, h in zip(replay_keys, held, strict=True) if h is not None}

    async def record_group(self, opened: FirstOpen) -> bool:
        group, now = opened.group, time.time()
        children = [
            {
                "replay_key": child.replay_key,
                "hash": child.envelope_hash(),
                "envelope": child.model_dump(mode="json"),
                "due": now + sleep_seconds(child) if child.kind == EffectKind.SLEEP else None,
                "attempt": 0,
                "outcome": None,
            }
            for child in group.children
        ]
        loser = group.disposition.value
        record = dict(key=group.key, wake=group.wake.value, declared=loser, effective=loser)
        record |= {"owner": self.owner, "closed": False, "children": children, "ranks": []}
        for position, executor in enumerate(opened.executors):
            self._start(record, position, executor)
        self._write(record)
        self._queue().mset({self._key("r", c.replay_key): group.key for c in group.children})
        return True  # the key is WATCHed: a concurrent first open's record fails our EXEC

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = await self._read(group.key)
        assert record is not None
        record["owner"] = self.owner  # a reopen makes this incarnation the owner
        if restart:  # a decided group's losers stay down
            await self._start_unsettled(record)
        self._write(record)

    async def restart_unsettled(self, key: str) -> None:
        """A caller awaits a rank that does not exist yet: the losers run on demand (R-13)."""

        async def step() -> None:
            record = await self._read(key)
            if record is not None and record["owner"] == self.owner and not record["closed"]:
                await self._start_unsettled(record)
                self._write(record)

        await self.guarded(key, "restart", step)

    async def _start_unsettled(self, record: Record) -> None:
        alive = await self._alive(record)
        for position, child in enumerate(record["children"]):
            if child["outcome"] is None and not self._runs(record["key"], position, child, alive):
                self._start(record, position)  # a resolver miss stays unsettled (G-11)

    # [/open]

    # [children]
    async def _alive(self, record: Record) -> set[str]:
        """The incarnations named by ``record`` whose liveness key has not expired."""
        named = {record["owner"], *(c.get("runner") for c in record["children"])}
        others = sorted(o for o in named if o not in (None, self.owner))
        found = await self.redis.mget([self._key("o", o) for o in others]) if others else []
        return {self.owner, *(o for o, v in zip(others, found, strict=True) if v is not None)}

    def _runs(self, key: str, position: int, child: Record, alive: set[str]) -> bool:
        """Whether a live incarnation runs the child: this one if its task runs here, or
        the one that started it while its key lives (a reopen never starts a live
        owner's child again, R-1)."""
        runner = child.get("runner")
        if runner in (None, self.owner):
            return self.is_running(key, position)
        return runner in alive

    def _start(self, record: Record, position: int, executor: Any = None) -> bool:
        """Start child ``position`` under a new attempt recorded in ``record`` (the step
        writes it); the task starts once the step committed. ``False`` when the resolver
        cannot run it. An event wait needs no task: ``deliver_event`` settles it."""
        child = record["children"][position]
        envelope = EffectEnvelope.model_validate(child["envelope"])
        if envelope.kind == EffectKind.AWAIT_EVENT:
            return True
        if envelope.kind == EffectKind.TOOL_CALL:
            if (executor := executor or self.resolve_child(envelope)) is None:
                return False
        child.update(attempt=child["attempt"] + 1, runner=self.owner)  # who runs it
        key, attempt, due = record["key"], child["attempt"], child["due"]

        def run() -> None:
            work = (
                self.sleep_until(due)  # the due time recorded at open (G-51)
                if executor is None
                else executor.execute(ExecutionInput(envelope, attempt=attempt))
            )
            self.run_child(key, position, attempt, work)

        self.after_guard(run)
        return True

    async def settle_child(
        self, key: str, position: int, attempt: int | None, outcome: Outcome
    ) -> bool:
        async def step() -> bool:
            record = await self._read(key)
            if record is None or not settle(record, position, attempt, outcome):
                return False
            self._write(record)
            return True

        return await self.guarded(key, "settle", step)

    # [/children]

    # [consume]
    async def read_rank(self, key: str, rank: int) -> Settlement | None:
        record = await self._read(key)
        if record is None or rank > len(record["ranks"]):
            return None
        position = record["ranks"][rank - 1]  # ranks are dense, so rank n is entry n (G-16)
        child = record["children"][position]
        outcome = Outcome.model_validate(child["outcome"])
        return Settlement(
            rank=rank, position=position, replay_key=child["replay_key"], outcome=outcome
        )

    async def settled_positions(self, key: str) -> list[int]:
        return list((await self._read(key))["ranks"])  # type: ignore[index]

    async def records(self) -> list[Record]:
        """Every group recorded under the prefix, tombstones included: one SCAN, one MGET."""
        keys = [k async for k in self.redis.scan_iter(match=self._key("g", "*"), count=1000)]
        return [json.loads(raw) for raw in await self.redis.mget(keys) if raw] if keys else []

    async def open_group_keys(self) -> list[str]:
        return sorted(r["key"] for r in await self.records() if not r["closed"])

    # [/consume]

    # [close]
    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        record = await self._read(key)
        assert record is not None
        record.update(effective=disposition.value, closed=True)
        self._write(record)
        self.after_guard(self.notify)  # a parked waiter wakes with GroupClosed

    async def unsettled(self, key: str) -> list[tuple[int, Record]]:
        children = (await self._read(key) or {"children": []})["children"]
        return [(p, c["envelope"]) for p, c in enumerate(children) if c["outcome"] is None]

    # [/close]

    # [drain]
    def drain(self) -> GroupDrain:
        return RedisDrain(self)

    async def drain_step(self, key: str) -> kit.DrainTally:
        """The drain's decisions on one group, in one guarded step (a retried step starts
        its tally again)."""
        tally, record = kit.DrainTally(), await self._read(key)
        if record is None or not record["children"]:
            return tally  # retired
        mine, alive = record["owner"] == self.owner, await self._alive(record)
        if not kit.drain_group(
            mine=mine, owner_alive=record["owner"] in alive, decided=decided(record)
        ):
            return tally  # a live owner's group, or a decided one's losers
        children = [
            (
                c["replay_key"],
                c["envelope"]["kind"],
                c["outcome"] is not None,
                self._runs(key, p, c, alive),
            )
            for p, c in enumerate(record["children"])
        ]
        if kit.drain_children(
            key,
            children,
            mine=mine,
            in_force=record["effective"],
            wired=self.supports_effect_groups(),
            start=lambda p: self._start(record, p),
            cancel=lambda p: settle(record, p, None, CANCELLED),
            tally=tally,
        ):
            self._write(record)
        return tally


class RedisDrain(GroupDrain):
    """Finishes the children no live incarnation runs, by the disposition in force."""

    def __init__(self, host: RedisHost) -> None:
        self.host = host

    async def run_pass(self) -> DrainReport:
        host, tally = self.host, kit.DrainTally()
        for key in [r["key"] for r in await host.records()]:
            tally.add(await host.guarded(key, "drain", lambda k=key: host.drain_step(k)))
        host.notify()
        return tally.report()

    # [/drain]
