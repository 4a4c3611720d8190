"""A host for an engine with no effecthost code beneath it: a directory of JSON files.

One file per group holds everything recorded about it. Every read-modify-write holds an
exclusive ``flock`` on ``root/lock`` and replaces the file atomically (``os.replace``).
Each host object is an *incarnation* that holds a ``flock`` on ``root/owners/ID`` as long
as its process lives, so "the owner is gone" (R-1) is "its lock can be taken". Children
run as asyncio tasks of the host's process; what survives a restart is the directory.
The rules come from ``effecthost.contract.kit``; what is here is the engine glue.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from typing import Any

from effecthost.contract import (
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    ExecutionInput,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    GroupRecord,
    LoserPolicy,
    Offer,
    Outcome,
    RankLedger,
    RecordedChild,
    ReplayMismatch,
    Settlement,
    Tombstone,
    WiredController,
    coerce_disposition,
    group_shape_error,
    kit,
    normalize_json,
    require_handle,
    sleep_durations,
    sleep_seconds,
)

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
class FileHost(WiredController):
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

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self._require_wired(group.key)
        with self.store.locked():
            record = self.store.read(group.key)
            recorded = [
                RecordedChild(position, child["replay_key"], child["hash"])
                for position, child in enumerate(record["children"] if record else [])
            ]
            if not kit.check_reopen(Offer.of(group), known(record), recorded):
                record = self._first_open(group)
            assert record is not None
            record["owner"] = self.owner  # a reopen makes this incarnation the owner
            self.store.write(record)
        for position, child in enumerate(record["children"]):
            if child["outcome"] is None and (group.key, position) not in self._tasks:
                self._dispatch(group.key, position)
        return group.handle()

    def _first_open(self, group: EffectGroup) -> Record:
        sleep_durations(group)  # a malformed sleep refuses the open (G-10)
        taken = {c["replay_key"]: r["key"] for r in self.store.records() for c in r["children"]}
        for position, child in enumerate(group.children):
            if child.replay_key in taken:  # replay keys are unique in the store
                raise ReplayMismatch(
                    f"replay key {child.replay_key!r} is recorded for {taken[child.replay_key]!r}",
                    group_key=group.key,
                    replay_key=child.replay_key,
                    position=position,
                )
        if (miss := self._first_unresolvable(group)) is not None:
            raise group_shape_error(group, *miss)  # the last refusal; nothing recorded (G-10)
        now = time.time()
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
        return record | {"closed": False, "children": children, "ranks": []}

    # [/open]

    # [children]
    def _dispatch(self, key: str, position: int) -> bool:
        """Start child ``position`` under a new attempt; ``False`` when the resolver
        cannot run it. An event wait needs no task: ``deliver_event`` settles it."""
        with self.store.locked():
            record = self.store.read(key)
            assert record is not None
            child = record["children"][position]
            envelope = EffectEnvelope.model_validate(child["envelope"])
            if envelope.kind == EffectKind.AWAIT_EVENT:
                return True
            if envelope.kind == EffectKind.SLEEP:
                work = self._sleep_until(child["due"])  # the due time recorded at open (G-51)
            elif (executor := self._resolver and self._resolver.resolve(envelope)) is None:
                return False
            else:
                work = executor.execute(ExecutionInput(envelope, attempt=child["attempt"] + 1))
            child["attempt"] += 1
            self.store.write(record)
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
        """Record a child's outcome and its rank in one write. A stale attempt is fenced
        off first; the kit's ledger gives the first settlement of a position rank
        ``count + 1`` and refuses a second. Ranks are dense (appended in the write that
        records the outcome), so rank n is ``ranks[n - 1]`` (G-16)."""
        with self.store.locked():
            record = self.store.read(key)
            if record is None or not record["children"]:
                return False  # retired meanwhile
            child = record["children"][position]
            ledger = RankLedger(len(record["children"]), record["ranks"])
            if attempt not in (None, child["attempt"]) or ledger.settle(position) is None:
                return False
            child["outcome"], record["ranks"] = outcome.model_dump(mode="json"), ledger.order
            self._retire_if_done(record, ledger)
            self.store.write(record)
        self._notify()
        return True

    def _retire_if_done(self, record: Record, ledger: RankLedger) -> None:
        """A closed group whose every child ranked retires whole into a tombstone: the
        key stays closed (R-4), its replay keys are free again (G-17, G-36)."""
        if record["closed"] and ledger.complete:
            record.update(children=[], ranks=[])

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # [/children]

    # [consume]
    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        require_handle(handle)
        self._require_wired(handle.group_key)
        rank = handle.consumed + 1
        while True:
            changed = self._changed
            record = self.store.read(handle.group_key)
            kit.check_await(handle.group_key, handle, known(record))  # R-2's order
            assert record is not None
            if rank <= len(record["ranks"]):
                break
            self._parked[handle.group_key, rank] += 1
            try:  # a write by another process (a drain) is seen within a second
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
            finally:
                self._parked[handle.group_key, rank] -= 1
        position = record["ranks"][rank - 1]
        child = record["children"][position]
        outcome = Outcome.model_validate(child["outcome"])
        handle.consumed = rank
        return Settlement(
            rank=rank, position=position, replay_key=child["replay_key"], outcome=outcome
        )

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """The waiter probe the conformance harness asks (G-19)."""
        return self._parked[group_key, rank] > 0

    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(group_key)
        record = self.store.read(group_key)
        if record is None or not record["children"]:
            raise kit.unknown_group(group_key)
        return list(record["ranks"])

    async def open_group_keys(self) -> list[str]:
        return sorted(r["key"] for r in self.store.records() if not r["closed"])

    # [/consume]

    # [close]
    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        disposition = coerce_disposition(require_handle(handle).group_key, disposition)
        self._require_wired(handle.group_key)
        with self.store.locked():
            record = self.store.read(handle.group_key)
            target = kit.check_close(handle.group_key, handle, known(record), disposition)
            if target is None or record is None:
                return  # a close of a closed or retired group is a no-op
            record.update(effective=target.value, closed=True)
            self._retire_if_done(record, RankLedger(len(record["children"]), record["ranks"]))
            self.store.write(record)
        if target is LoserPolicy.CANCEL:
            for position, child in enumerate(record["children"]):
                if child["outcome"] is None:
                    self._cancel(handle.group_key, position)
        self._notify()  # a parked waiter wakes with GroupClosed

    def _cancel(self, key: str, position: int) -> None:
        """One cancel per unsettled child, not waiting for it to stop (G-27)."""
        task = self._tasks.get((key, position))
        if task is None:
            self._settle(key, position, None, Outcome.cancelled())
        else:
            self._cancelling.add((key, position))
            task.cancel()

    # [/close]

    # [events]
    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self._require_wired(group_key)
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
        for record in host.store.records():
            mine = record.get("owner") == host.owner
            if not mine and host.store.owner_alive(record["owner"]):
                continue  # a live owner's group is never touched
            for position, child in enumerate(record["children"]):
                ids = (record["key"], child["replay_key"])
                if child["outcome"] is not None or (record["key"], position) in host._tasks:
                    continue
                if host._resolver is None:  # report, never cancel (G-12)
                    missing.append(kit.no_executor(*ids, position, kit.NO_RESOLVER))
                elif not mine and record["effective"] == LoserPolicy.CANCEL:
                    host._settle(record["key"], position, None, Outcome.cancelled())
                    cancelled.append(ids)  # the declared CANCEL stays in force (G-29)
                elif child["envelope"]["kind"] == EffectKind.AWAIT_EVENT:
                    continue  # it waits for deliver_event, whoever owns it
                elif host._dispatch(record["key"], position):
                    resumed.append(ids)
                else:
                    missing.append(kit.no_executor(*ids, position, kit.RESOLVER_MISS))
        return DrainReport(
            resumed=tuple(resumed), cancelled=tuple(cancelled), no_executor=tuple(missing)
        )

    # [/drain]
