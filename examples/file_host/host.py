"""A host for an engine with no effecthost code beneath it: a directory of JSON files.

One file per group holds everything recorded about it; a write replaces the file
atomically (``os.replace``) while holding an exclusive ``flock`` on ``root/lock``. Each
host object is an *incarnation* holding a ``flock`` on ``root/owners/ID`` for as long as
its process lives, so "the owner is gone" (R-1) is "its lock can be taken". Children run
as asyncio tasks of the host's process; what survives a restart is the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    ExecutionInput,
    GroupClosed,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    NoExecutor,
    Outcome,
    ReplayMismatch,
    Settlement,
    UnknownGroup,
    WiredController,
    coerce_disposition,
    group_shape_error,
    normalize_json,
    require_handle,
    sleep_durations,
    sleep_seconds,
)

Record = dict[str, Any]


# [store]
class FileStore:
    """The engine: group records as files, one lock for every read-modify-write."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / "groups").mkdir(parents=True, exist_ok=True)
        (self.root / "owners").mkdir(exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _path(self, key: str) -> Path:
        return self.root / "groups" / hashlib.sha256(key.encode()).hexdigest()

    def read(self, key: str) -> Record | None:
        with contextlib.suppress(FileNotFoundError):
            return json.loads(self._path(key).read_bytes())  # type: ignore[no-any-return]
        return None

    def write(self, record: Record) -> None:
        path = self._path(record["key"])
        temp = path.with_suffix(".tmp")
        with open(temp, "w") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)

    def records(self) -> list[Record]:
        return [json.loads(p.read_bytes()) for p in (self.root / "groups").iterdir()
                if p.suffix != ".tmp"]

    def claim_owner(self, owner: str) -> Any:
        """Hold ``owners/OWNER`` locked for the life of this process (R-1)."""
        handle = open(self.root / "owners" / owner, "a")
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle

    def owner_alive(self, owner: str) -> bool:
        with open(self.root / "owners" / owner, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(probe, fcntl.LOCK_UN)
            return False
# [/store]


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

    def supports_concurrent_effects(self) -> bool:
        return True

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self._require_wired(group.key)
        with self.store.locked():
            record = self.store.read(group.key)
            if record is not None and record["closed"]:
                raise GroupClosed(f"group {group.key!r} was closed", group_key=group.key)
            if record is None:
                record = self._first_open(group)
            else:
                self._fence_reopen(record, group)
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
                    f"child {child.replay_key!r} at position {position} of group "
                    f"{group.key!r}: the replay key is recorded for group "
                    f"{taken[child.replay_key]!r}",
                    group_key=group.key, replay_key=child.replay_key, position=position,
                )
        if (miss := self._first_unresolvable(group)) is not None:
            raise group_shape_error(group, *miss)  # nothing recorded (G-10)
        now = time.time()
        return {
            "key": group.key, "wake": group.wake.value, "declared": group.disposition.value,
            "effective": group.disposition.value, "closed": False, "ranks": [],
            "children": [
                {
                    "replay_key": child.replay_key, "hash": child.envelope_hash(),
                    "envelope": child.model_dump(mode="json"), "attempt": 0, "outcome": None,
                    "due": now + sleep_seconds(child) if child.kind == EffectKind.SLEEP else None,
                }
                for child in group.children
            ],
        }

    def _fence_reopen(self, record: Record, group: EffectGroup) -> None:
        shape = (len(record["children"]), record["wake"], record["declared"])
        if shape != (group.child_count, group.wake.value, group.disposition.value):
            raise GroupShapeMismatch(
                f"group {group.key!r} is recorded with another child count, wake or "
                "disposition", group_key=group.key,
            )
        for position, (child, envelope) in enumerate(zip(record["children"], group.children, strict=True)):
            if (child["replay_key"], child["hash"]) != (envelope.replay_key,
                                                        envelope.envelope_hash()):
                raise ReplayMismatch(
                    f"child at position {position} of group {group.key!r} is recorded with "
                    "another replay key or envelope hash",
                    group_key=group.key, replay_key=envelope.replay_key, position=position,
                )
# [/open]


# [children]
    def _dispatch(self, key: str, position: int) -> bool:
        """Start child ``position`` under a new attempt, or say why not (``False``: the
        resolver cannot run it; an event wait needs no task)."""
        with self.store.locked():
            record = self.store.read(key)
            assert record is not None
            child = record["children"][position]
            envelope = EffectEnvelope.model_validate(child["envelope"])
            if envelope.kind == EffectKind.AWAIT_EVENT:
                return True  # deliver_event settles it; nothing runs
            if envelope.kind == EffectKind.SLEEP:
                work = self._sleep_until(child["due"])
            elif (executor := self._resolver and self._resolver.resolve(envelope)) is None:
                return False
            else:
                work = executor.execute(ExecutionInput(envelope, attempt=child["attempt"] + 1))
            child["attempt"] += 1
            self.store.write(record)
        task = asyncio.get_running_loop().create_task(
            self._run(key, position, child["attempt"], work))
        self._tasks[key, position] = task
        task.add_done_callback(lambda _: self._tasks.pop((key, position), None))
        return True

    async def _sleep_until(self, due: float) -> Outcome:
        await asyncio.sleep(max(0.0, due - time.time()))  # the due time recorded at open
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
        """The rank ledger: the first settlement of a child wins and takes rank
        ``len(ranks) + 1`` (ranks are dense here: appended in the write that records the
        outcome, so rank n is ``ranks[n - 1]``, G-16); a stale attempt is fenced off."""
        with self.store.locked():
            record = self.store.read(key)
            if record is None or not record["children"]:
                return False  # retired meanwhile
            child = record["children"][position]
            if child["outcome"] is not None or attempt not in (None, child["attempt"]):
                return False
            child["outcome"] = outcome.model_dump(mode="json")
            record["ranks"].append(position)
            self._retire_if_done(record)
            self.store.write(record)
        self._notify()
        return True

    def _retire_if_done(self, record: Record) -> None:
        """A closed group whose every child settled retires whole, leaving a tombstone:
        its key stays closed (R-4) and its replay keys are free again (G-17, G-36)."""
        if record["closed"] and len(record["ranks"]) == len(record["children"]):
            record["children"], record["ranks"] = [], []

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
# [/children]


# [consume]
    def _recorded(self, handle: GroupHandle) -> Record:
        """The record ``handle`` names, fenced in R-2's order (G-20, R-4)."""
        record = self.store.read(handle.group_key)
        if record is None:
            raise UnknownGroup(f"no group is recorded under {handle.group_key!r}",
                               group_key=handle.group_key)
        if record["closed"]:
            raise GroupClosed(f"group {handle.group_key!r} was closed", group_key=handle.group_key)
        if (handle.child_count, handle.wake.value, handle.disposition.value) != (
            len(record["children"]), record["wake"], record["declared"]):
            raise HandleMismatch(f"handle for {handle.group_key!r} disagrees with the record",
                                 group_key=handle.group_key)
        return record

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        require_handle(handle)
        self._require_wired(handle.group_key)
        rank = handle.consumed + 1
        while True:
            changed = self._changed
            record = self._recorded(handle)
            if rank > handle.child_count:
                raise CursorExhausted(f"group {handle.group_key!r} has no rank {rank}",
                                      group_key=handle.group_key, rank=rank)
            if rank <= len(record["ranks"]):
                break
            self._parked[handle.group_key, rank] += 1
            try:  # a write from another process (a drain) is seen within a second
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
            finally:
                self._parked[handle.group_key, rank] -= 1
        position = record["ranks"][rank - 1]
        child = record["children"][position]
        settlement = Settlement(rank=rank, position=position, replay_key=child["replay_key"],
                                outcome=Outcome.model_validate(child["outcome"]))
        handle.consumed = rank
        return settlement

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """The waiter probe the conformance harness asks (G-19)."""
        return self._parked[group_key, rank] > 0

    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(group_key)
        record = self.store.read(group_key)
        if record is None or not record["children"]:
            raise UnknownGroup(f"no open group is recorded under {group_key!r}",
                               group_key=group_key)
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
            if record is not None and record["closed"]:
                return  # a close of a closed or retired group is a no-op
            self._recorded(handle)
            assert record is not None
            target = disposition or LoserPolicy(record["effective"])
            if record["effective"] == LoserPolicy.CANCEL and target != LoserPolicy.CANCEL:
                raise DispositionWidened(f"group {handle.group_key!r} declares CANCEL",
                                         group_key=handle.group_key)
            record["effective"], record["closed"] = target.value, True
            self._retire_if_done(record)
            self.store.write(record)
        if target == LoserPolicy.CANCEL:
            for position, child in enumerate(record["children"]):
                if child["outcome"] is None:
                    self._cancel(handle.group_key, position)
        self._notify()  # parked waiters wake with GroupClosed

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
            raise UnknownGroup(f"no group is recorded under {group_key!r}", group_key=group_key)
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
                if host._resolver is None:
                    missing.append(_no_executor(record, position, "no resolver is registered"))
                elif not mine and record["effective"] == LoserPolicy.CANCEL:
                    host._settle(record["key"], position, None, Outcome.cancelled())
                    cancelled.append(ids)
                elif child["envelope"]["kind"] == EffectKind.AWAIT_EVENT:
                    continue  # it waits for deliver_event, wherever the owner is
                elif host._dispatch(record["key"], position):
                    resumed.append(ids)
                else:
                    missing.append(_no_executor(record, position, "the resolver returned None"))
        return DrainReport(resumed=tuple(resumed), cancelled=tuple(cancelled),
                           no_executor=tuple(missing))


def _no_executor(record: Record, position: int, why: str) -> NoExecutor:
    replay_key = record["children"][position]["replay_key"]
    return NoExecutor(
        f"child {replay_key!r} at position {position} of group {record['key']!r} cannot run "
        f"here: {why}", group_key=record["key"], replay_key=replay_key, position=position,
    )
# [/drain]
