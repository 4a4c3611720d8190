"""A host for an engine with no effecthost code beneath it: a directory of JSON files.

One file per group holds everything recorded about it. Every read-modify-write holds an
exclusive ``flock`` on ``root/lock`` and replaces the file atomically (``os.replace``).
Each host object is an *incarnation* that holds a ``flock`` on ``root/owners/ID`` as long
as its process lives, so "the owner is gone" (R-1) is "its lock can be taken". Children
run as asyncio tasks of the host's process; what survives a restart is the directory.
The rules come from :class:`~effecthost.contract.kit.KitController`, which runs every open and
close under :meth:`FileHost.guard` (the store's lock); what is here is the engine glue.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

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
    normalize_json,
    sleep_seconds,
)
from effecthost.contract.kit import FirstOpen, KitController

from .store import FileStore, Record


# [known]
def known(record: Record | None) -> GroupRecord | Tombstone | None:
    """What the kit's fences read: nothing, a tombstone, or the group's shape."""
    if record is None or not record["children"]:  # a retired group keeps only a tombstone
        return None if record is None else Tombstone(record["key"])
    fields = ("key", "wake", "declared", "effective", "closed")
    return GroupRecord(child_count=len(record["children"]), **{f: record[f] for f in fields})


# [/known]


# [open]
class FileHost(KitController):
    """The contract's controller over a :class:`FileStore`."""

    def __init__(self, root: str | os.PathLike[str], resolver: GroupExecutors | None) -> None:
        self.store = FileStore(root)
        self.register_executors(resolver)
        self.owner = uuid.uuid4().hex
        self._owner_lock = self.store.claim_owner(self.owner)
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._cancelling: set[tuple[str, int]] = set()
        self._changed = asyncio.Event()
        self._parked: Counter[tuple[str, int]] = Counter()

    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        """Every open and close holds the store's lock (no hook below suspends in it)."""
        with self.store.locked():
            yield

    async def find_group(self, key: str) -> GroupRecord | Tombstone | None:
        return known(self.store.read(key))

    async def recorded_children(self, key: str) -> list[RecordedChild]:
        children = self.store.read(key)["children"]  # type: ignore[index]
        return [RecordedChild(p, c["replay_key"], c["hash"]) for p, c in enumerate(children)]

    async def replay_key_holder(self, replay_key: str) -> str | None:
        """A scan of every group: fine for an example, linear in the store (R-6)."""
        records = self.store.records()
        return next(
            (r["key"] for r in records for c in r["children"] if c["replay_key"] == replay_key),
            None,
        )

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
        self.store.write(record)
        return True  # under the guard nobody recorded the key meanwhile

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = self.store.read(group.key)
        assert record is not None
        record["owner"] = self.owner  # a reopen makes this incarnation the owner
        if restart:  # a decided group's losers stay down
            self._start_unsettled(record)
        self.store.write(record)

    async def restart_unsettled(self, key: str) -> None:
        """A caller awaits a rank that does not exist yet: the losers run on demand (R-13)."""
        with self.store.locked():
            record = self.store.read(key)
            if record is not None and record["owner"] == self.owner and not record["closed"]:
                self._start_unsettled(record)
                self.store.write(record)

    def _start_unsettled(self, record: Record) -> None:
        for position, child in enumerate(record["children"]):
            if child["outcome"] is None and (record["key"], position) not in self._tasks:
                self._start(record, position)  # a resolver miss stays unsettled (G-11)

    # [/open]

    # [children]
    def _start(self, record: Record, position: int, executor: Any = None) -> bool:
        """Start child ``position`` under a new attempt, in ``record`` (the caller writes
        it, under the lock); ``False`` when the resolver cannot run it. An event wait
        needs no task: ``deliver_event`` settles it."""
        child = record["children"][position]
        envelope = EffectEnvelope.model_validate(child["envelope"])
        if envelope.kind == EffectKind.AWAIT_EVENT:
            return True
        if envelope.kind == EffectKind.SLEEP:
            work = self._sleep_until(child["due"])  # the due time recorded at open (G-51)
        elif (executor := executor or self.resolve_child(envelope)) is None:
            return False
        else:
            work = executor.execute(ExecutionInput(envelope, attempt=child["attempt"] + 1))
        child["attempt"] += 1
        key = record["key"]
        task = asyncio.create_task(self._run(key, position, child["attempt"], work))
        self._tasks[key, position] = task
        task.add_done_callback(lambda _: self._tasks.pop((key, position), None))
        return True

    async def _sleep_until(self, due: float) -> Outcome:
        await asyncio.sleep(max(0.0, due - time.time()))
        return Outcome.success(None)

    async def _run(self, key: str, position: int, attempt: int, work: Any) -> None:
        try:
            outcome = await work
        except asyncio.CancelledError:
            if (key, position) not in self._cancelling:
                raise  # the process is going away: record nothing
            outcome = Outcome.cancelled()
        self._settle(key, position, attempt, outcome)

    def _settle(self, key: str, position: int, attempt: int | None, outcome: Outcome) -> bool:
        with self.store.locked():
            record = self.store.read(key)
            if record is None or not settle(record, position, attempt, outcome):
                return False
            self.store.write(record)
        self._notify()
        return True

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # [/children]

    # [consume]
    async def read_rank(self, key: str, rank: int) -> Settlement | None:
        record = self.store.read(key)
        if record is None or rank > len(record["ranks"]):
            return None
        position = record["ranks"][rank - 1]  # ranks are dense, so rank n is entry n (G-16)
        child = record["children"][position]
        outcome = Outcome.model_validate(child["outcome"])
        return Settlement(
            rank=rank, position=position, replay_key=child["replay_key"], outcome=outcome
        )

    async def wait_for_change(self, key: str, rank: int) -> None:
        """Until the next settlement or close in this process; a write by another
        process (a drain) is seen within a second."""
        self._parked[key, rank] += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)
        finally:
            self._parked[key, rank] -= 1

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """The waiter probe the conformance harness asks (G-19)."""
        return self._parked[group_key, rank] > 0

    async def settled_positions(self, key: str) -> list[int]:
        return list(self.store.read(key)["ranks"])  # type: ignore[index]

    async def open_group_keys(self) -> list[str]:
        return sorted(r["key"] for r in self.store.records() if not r["closed"])

    # [/consume]

    # [close]
    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        record = self.store.read(key)
        assert record is not None
        record.update(effective=disposition.value, closed=True)
        retire_if_done(record)
        self.store.write(record)
        self._notify()  # a parked waiter wakes with GroupClosed

    async def cancel_unsettled(self, key: str) -> None:
        """One cancel per unsettled child, not waiting for it to stop (G-27)."""
        record = self.store.read(key) or {"children": []}
        for position, child in enumerate(record["children"]):
            if child["outcome"] is not None:
                continue
            task = self._tasks.get((key, position))
            if task is None:
                self._settle(key, position, None, Outcome.cancelled())
            else:
                self._cancelling.add((key, position))
                task.cancel()

    # [/close]

    # [events]
    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self.require_wired(group_key)
        value = normalize_json(payload, what=f"event {name!r}", group_key=group_key)
        record = self.store.read(group_key)
        if record is None:
            raise kit.unknown_group(group_key)
        reached = 0
        for position, child in enumerate(record["children"]):
            envelope = child["envelope"]
            if envelope["kind"] == EffectKind.AWAIT_EVENT and envelope["name"] == name:
                reached += self._settle(group_key, position, None, Outcome.success(value))
        return reached

    # [/events]

    # [drain]
    def drain(self) -> GroupDrain:
        return FileDrain(self)


class FileDrain(GroupDrain):
    """Finishes the children no live incarnation runs, by the disposition in force."""

    def __init__(self, host: FileHost) -> None:
        self.host = host

    async def run_pass(self) -> DrainReport:
        host, resumed, cancelled, missing = self.host, [], [], []
        for key in [r["key"] for r in host.store.records()]:
            with host.store.locked():
                record = host.store.read(key)
                assert record is not None
                mine, before = record["owner"] == host.owner, len(resumed + cancelled)
                if not mine and host.store.owner_alive(record["owner"]):
                    continue  # a live owner's group is never touched
                if mine and decided(record):
                    continue  # its losers stay down until its caller awaits them
                for position, child in enumerate(record["children"]):
                    ids = (key, child["replay_key"])
                    if child["outcome"] is not None or (key, position) in host._tasks:
                        continue
                    if host._resolver is None:  # report, never cancel (G-12)
                        missing.append(kit.no_executor(*ids, position, kit.NO_RESOLVER))
                    elif not mine and record["effective"] == LoserPolicy.CANCEL:
                        settle(record, position, None, Outcome.cancelled())
                        cancelled.append(ids)  # the declared CANCEL stays in force (G-29)
                    elif child["envelope"]["kind"] == EffectKind.AWAIT_EVENT:
                        continue  # it waits for deliver_event, whoever owns it
                    elif host._start(record, position):
                        resumed.append(ids)
                    else:
                        missing.append(kit.no_executor(*ids, position, kit.RESOLVER_MISS))
                if len(resumed + cancelled) > before:
                    host.store.write(record)
        host._notify()
        return DrainReport(
            resumed=tuple(resumed), cancelled=tuple(cancelled), no_executor=tuple(missing)
        )

    # [/drain]


# [ledger]
def settle(record: Record, position: int, attempt: int | None, outcome: Outcome) -> bool:
    """Record a child's outcome and its rank in ``record``, in one write. A stale attempt
    is fenced off first; the kit's ledger gives the first settlement of a position rank
    ``count + 1`` and refuses a second. Ranks are appended with the outcome, so they are
    dense (G-16)."""
    if not record["children"]:
        return False  # retired meanwhile
    child = record["children"][position]
    ledger = RankLedger(len(record["children"]), record["ranks"])
    if attempt not in (None, child["attempt"]) or ledger.settle(position) is None:
        return False
    child["outcome"], record["ranks"] = outcome.model_dump(mode="json"), ledger.order
    retire_if_done(record)
    return True


def decided(record: Record) -> bool:
    """The kit's R-13 rule on what the file records: an open group with ``CANCEL`` in
    force and its wake policy met."""
    shape = known(record)
    ranked = (record["children"][p]["outcome"]["status"] for p in record["ranks"])
    return isinstance(shape, GroupRecord) and not shape.closed and kit.decided(shape, ranked)


def retire_if_done(record: Record) -> None:
    """A closed group whose every child ranked retires whole into a tombstone: the key
    stays closed (R-4), its replay keys are free again (G-17, G-36)."""
    if record["closed"] and RankLedger(len(record["children"]), record["ranks"]).complete:
        record.update(children=[], ranks=[])


# [/ledger]
