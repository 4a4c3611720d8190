"""Broken file hosts: the guide's example host (``examples/file_host``) with one hook of its
engine glue written wrong, as a third party writing a host on the kit would err.

Each class subclasses :class:`~examples.file_host.host.FileHost` and changes one hook; its
docstring names the id it breaks and the mistake. The ``file`` harness runs it in a
deployment process of its own, as the example's factory does (``restart`` is a SIGKILL),
built by :func:`build`. Imported under pytest, this module also registers them in the
catalog (``catalog.file_mutant``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import examples.file_host.host as file_host  # noqa: E402
from examples.file_host.faults import FaultyFileHost  # noqa: E402
from examples.file_host.host import FileDrain, FileHost, known  # noqa: E402
from examples.file_host.store import Record  # noqa: E402

from effecthost.conformance import Deployment  # noqa: E402
from effecthost.contract import (  # noqa: E402
    EffectGroup,
    EffectKind,
    GroupDrain,
    GroupHandle,
    GroupRecord,
    LoserPolicy,
    Outcome,
    Settlement,
    Tombstone,
    UnknownGroup,
    WakePolicy,
    kit,
    normalize_json,
    sleep_seconds,
)
from effecthost.contract.kit import Retry, check_cursor, check_handle  # noqa: E402


def build(deployment: Deployment) -> FileHost:
    """The deployment process's builder: the mutant class named in the config."""
    cls = getattr(sys.modules[__name__], str(deployment.config["cls"]))
    host: FileHost = cls(deployment.work_dir / "records", deployment.resolver)
    return host


# -- reading ranks -----------------------------------------------------------------------------


class ReadRankOffByOneFileHost(FileHost):
    """G-16: ``read_rank`` indexes the rank list with the rank itself (ranks are counted
    from one, the list from zero), so rank 1 is served the second settlement, once there
    is one."""

    async def read_rank(self, key: str, rank: int) -> Settlement | None:
        record = self.store.read(key)
        if record is None or rank >= len(record["ranks"]):
            return None
        position = record["ranks"][rank]
        child = record["children"][position]
        outcome = Outcome.model_validate(child["outcome"])
        return Settlement(
            rank=rank, position=position, replay_key=child["replay_key"], outcome=outcome
        )


class LastCompletionWinsFileHost(FileHost):
    """G-15: a completion of a child already settled (a duplicate delivery) overwrites its
    recorded outcome; the ledger refuses it a second rank, so nothing looks wrong, but
    rank n now reads another value than it did. Its ``unsettled`` lists every child,
    leaving the refusal of a settled one to the settlement, so a second event delivery
    reaches it."""

    async def unsettled(self, key: str) -> list[tuple[int, Record]]:
        children = (self.store.read(key) or {"children": []})["children"]
        return [(p, c["envelope"]) for p, c in enumerate(children)]

    async def settle_child(
        self, key: str, position: int, attempt: int | None, outcome: Outcome
    ) -> bool:
        with self.store.locked():
            record = self.store.read(key)
            if record is not None and record["children"]:
                child = record["children"][position]
                if child["outcome"] is not None:
                    child["outcome"] = outcome.model_dump(mode="json")
                    self.store.write(record)
                    return False
        return await super().settle_child(key, position, attempt, outcome)


class FastPathServesClosedFileHost(FileHost):
    """R-4: an await whose rank is already recorded is served straight from the record
    after the handle's fence (a fast path skipping the lookup), so a closed group that has
    not retired still serves its settled ranks."""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        record = self.store.read(handle.group_key)
        found = known(record)
        if isinstance(found, GroupRecord):
            check_handle(handle.group_key, handle, found)
            rank = check_cursor(handle.group_key, handle.consumed, found.child_count)
            settlement = await self.read_rank(handle.group_key, rank)
            if settlement is not None:
                handle.consumed = rank
                return settlement
        return await super().await_next_settlement(handle)


class StaleFindGroupFileHost(FileHost):
    """R-4: ``find_group`` keeps what it read in a per-process cache, refreshed when this
    host records or resumes a group but not when it records a close, so a closed group
    still looks open: it is served and reopened."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._cache: dict[str, GroupRecord | Tombstone | None] = {}

    async def find_group(self, key: str) -> GroupRecord | Tombstone | None:
        if key not in self._cache:
            self._cache[key] = await super().find_group(key)
        return self._cache[key]

    async def record_group(self, opened: Any) -> bool:
        done = await super().record_group(opened)
        self._cache.pop(opened.group.key, None)
        return done

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        await super().resume_group(group, restart=restart)
        self._cache.pop(group.key, None)


# -- open, reopen, restart ---------------------------------------------------------------------


class UnguardedOpenFileHost(FileHost):
    """R-7: the store's lock is held only inside each write (the guard is a no-op), and
    the replay-key scan runs in a worker thread so the loop stays free; two concurrent
    first opens both find no record, both record the group and start its children."""

    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        yield

    async def replay_key_holders(self, replay_keys: Any) -> dict[str, str]:
        holders = {}
        for replay_key in replay_keys:  # one scan per key, each in a worker thread
            records = await asyncio.to_thread(self.store.records)
            for r in records:
                if any(c["replay_key"] == replay_key for c in r["children"]):
                    holders[replay_key] = r["key"]
        return holders

    async def record_group(self, opened: Any) -> bool:
        with self.store.locked():
            return await super().record_group(opened)


class ResumeRerunsSettledFileHost(FileHost):
    """G-15: a reopen starts every child this process does not run, settled ones
    included (their second settlement is refused by the ledger, so the ranks look right),
    so a child whose settlement was recorded before a restart runs again."""

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = self.store.read(group.key)
        assert record is not None
        record["owner"] = self.owner
        for position in range(len(record["children"])):
            if not self.is_running(group.key, position):
                self._start(record, position)
        self.store.write(record)


class ReopenKeepsTheOldOwnerFileHost(FileHost):
    """R-1: a reopen dispatches the unsettled children but leaves the group recorded under
    the incarnation that first opened it; after a restart that owner is dead, so a drain
    pass takes the reopened group for an orphan and applies its ``CANCEL`` to the live
    caller's event wait."""

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = self.store.read(group.key)
        assert record is not None
        for position, child in enumerate(record["children"]):
            if child["outcome"] is None and not self._runs(group.key, position, child):
                self._start(record, position)
        self.store.write(record)


class SleepDueFromDispatchFileHost(FileHost):
    """G-51: a ``sleep`` child's due time is set each time it is started, so a sleep
    resumed after a restart sleeps its whole duration again."""

    def _start(self, record: Record, position: int, executor: Any = None) -> bool:
        child = record["children"][position]
        if child["envelope"]["kind"] == EffectKind.SLEEP:
            envelope = child["envelope"]
            seconds = sleep_seconds(_envelope(envelope))
            child["due"] = time.time() + seconds
        return super()._start(record, position, executor)


def _envelope(wire: dict[str, Any]) -> Any:
    from effecthost.contract import EffectEnvelope

    return EffectEnvelope.model_validate(wire)


class ListsOwnGroupsFileHost(FileHost):
    """G-30: ``open_group_keys`` lists the open groups this incarnation owns, so after a
    restart a group nobody reopened yet is not counted."""

    async def open_group_keys(self) -> list[str]:
        return sorted(
            r["key"] for r in self.store.records() if not r["closed"] and r["owner"] == self.owner
        )


# -- close --------------------------------------------------------------------------------------


class CancelsEveryTaskFileHost(FileHost):
    """G-27: a ``CANCEL`` close cancels every child task the process runs, not only the
    closed group's, so another group's running children are cancelled with it."""

    async def cancel_unsettled(self, key: str) -> None:
        await super().cancel_unsettled(key)
        for task_key, task in list(self.running.items()):
            self.cancelling.add(task_key)
            task.cancel()


class CloseForgetsNarrowingFileHost(FileHost):
    """G-29 (G-26): a close marks the group closed but leaves the declared disposition as
    the one in force; the close's own cancel is sent, but a loser still winding down when
    the process dies is resumed by the drain as a ``RUN_TO_COMPLETION`` child."""

    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        record = self.store.read(key)
        assert record is not None
        effective = record["effective"]
        await super().record_close(key, disposition)
        record = self.store.read(key)
        assert record is not None
        if record["children"]:
            record["effective"] = effective
            self.store.write(record)


class _DeclaredDrain(FileDrain):
    async def run_pass(self) -> Any:
        host = self.host
        with host.store.locked():
            for record in host.store.records():
                if record["closed"] and record["effective"] != record["declared"]:
                    record["effective"] = record["declared"]
                    host.store.write(record)
        return await super().run_pass()


class DrainReadsDeclaredFileHost(FileHost):
    """G-29: the drain applies the disposition the group declared at open, not the one in
    force, so a group a close narrowed to ``CANCEL`` has its surviving loser resumed after
    a crash."""

    def drain(self) -> GroupDrain:
        return _DeclaredDrain(self)


# -- the drain -----------------------------------------------------------------------------------


class _LeakyDrain(FileDrain):
    async def run_pass(self) -> Any:
        report = await super().run_pass()
        leaky = []
        for error in report.no_executor:
            record = self.host.store.read(str(error.group_key))
            assert record is not None and error.position is not None
            envelope = record["children"][error.position]["envelope"]
            why = f"{kit.NO_RESOLVER}; input {envelope['input']!r}"
            leaky.append(
                kit.no_executor(str(error.group_key), str(error.replay_key), error.position, why)
            )
        return type(report)(
            resumed=report.resumed, cancelled=report.cancelled, no_executor=tuple(leaky)
        )


class LeakyNoExecutorFileHost(FileHost):
    """G-12 (errors carry ids only): a drain's ``NoExecutor`` entry quotes the child's
    input, to help an operator see what could not run."""

    def drain(self) -> GroupDrain:
        return _LeakyDrain(self)


# -- events ---------------------------------------------------------------------------------------


class EventIgnoresNameFileHost(FileHost):
    """R-5: ``deliver_event`` settles every ``await_event`` child of the group, whatever
    name it waits for."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self.require_wired(group_key)
        value = normalize_json(payload, what=f"event {name!r}", group_key=group_key)
        record = self.store.read(group_key)
        if record is None:
            raise kit.unknown_group(group_key)
        reached = 0
        for position, child in enumerate(record["children"]):
            if child["envelope"]["kind"] == EffectKind.AWAIT_EVENT:
                reached += await self.settle(group_key, position, None, Outcome.success(value))
        return reached


class ClosedGroupRefusesEventsFileHost(FileHost):
    """R-5 (R-4's edge): ``deliver_event`` refuses a closed group with ``GroupClosed``, so
    the pending event wait of a closed ``RUN_TO_COMPLETION`` group never settles and the
    group never retires."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        record = self.store.read(group_key)
        if record is not None and record["closed"]:
            raise kit.group_closed(group_key)
        return await super().deliver_event(group_key, name, payload)


class RetiredEventIsUnknownFileHost(FileHost):
    """R-5: ``deliver_event`` to a retired key is ``UnknownGroup`` (its record holds no
    children), where a late delivery must return 0."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        record = self.store.read(group_key)
        if record is not None and not record["children"]:
            raise kit.unknown_group(group_key)
        return await super().deliver_event(group_key, name, payload)


class LeakyEventRefusalFileHost(FileHost):
    """R-5 (errors carry ids only): the ``UnknownGroup`` of an event for an unrecorded
    key quotes the event's payload, to help find the typo."""

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        if self.supports_effect_groups() and self.store.read(group_key) is None:
            raise UnknownGroup(
                f"event {name!r} with payload {payload!r}: no group {group_key!r}",
                group_key=group_key,
            )
        return await super().deliver_event(group_key, name, payload)


# -- registration -------------------------------------------------------------------------------

FILE_MUTANTS: dict[str, tuple[type[FileHost], str, str | None]] = {
    cls.__name__: (cls, breaks, select)
    for cls, breaks, select in [
        (ReadRankOffByOneFileHost, "G-16", "G-16"),
        (LastCompletionWinsFileHost, "G-15", "G-15"),
        (FastPathServesClosedFileHost, "R-4", "G-26 or G-17"),
        (StaleFindGroupFileHost, "R-4", "G-26 or G-17"),
        (UnguardedOpenFileHost, "R-7", "G-10 and G-13"),
        (ResumeRerunsSettledFileHost, "G-15", "G-15"),
        (ReopenKeepsTheOldOwnerFileHost, "R-1", "G-52"),
        (SleepDueFromDispatchFileHost, "G-51", "recorded_due_time"),
        (ListsOwnGroupsFileHost, "G-30", "G-30"),
        (CancelsEveryTaskFileHost, "G-27", "G-27"),
        (CloseForgetsNarrowingFileHost, "G-29", "G-29"),
        (DrainReadsDeclaredFileHost, "G-29", "G-29"),
        (LeakyNoExecutorFileHost, "G-12", "G-12"),
        (EventIgnoresNameFileHost, "R-5", "G-51"),
        (ClosedGroupRefusesEventsFileHost, "R-5", "G-51"),
        (RetiredEventIsUnknownFileHost, "R-5", "G-51"),
        (LeakyEventRefusalFileHost, "R-5", "G-51"),
    ]
}


# -- retirement waits for every child (R-11) ---------------------------------------------------


class ClosedGroupFreesItsKeysFileHost(FileHost):
    """R-11: the replay-key lookup skips closed groups, so a closed group whose loser
    still runs no longer holds its keys and a new group reusing one opens."""

    async def replay_key_holders(self, replay_keys: Any) -> dict[str, str]:
        holders = await super().replay_key_holders(replay_keys)
        closed = {h for h in holders.values() if (self.store.read(h) or {}).get("closed")}
        return {k: h for k, h in holders.items() if h not in closed}


FILE_MUTANTS[ClosedGroupFreesItsKeysFileHost.__name__] = (
    ClosedGroupFreesItsKeysFileHost,
    "R-11",
    "claimed_until_it_retires",
)


class NeverRetiresFileHost(FileHost):
    """G-36: retirement switched off: a closed group whose every child ranked keeps its
    record, so its replay keys are never free again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        file_host.retire_if_done = lambda record: None  # this deployment process only


FILE_MUTANTS[NeverRetiresFileHost.__name__] = (
    NeverRetiresFileHost,
    "G-36",
    "claimed_until_it_retires or meeting_the_last_settlement",
)


class RetiredKeysStayClaimedFileHost(FileHost):
    """R-11: retirement drops the group's children but keeps their replay keys on the
    tombstone, and the replay-key lookup still counts them: a retired group's keys are
    refused for ever."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        retire = file_host.retire_if_done

        def keeping(record: Record) -> None:
            keys = [c["replay_key"] for c in record["children"]]
            retire(record)
            if not record["children"]:
                record["kept"] = keys

        file_host.retire_if_done = keeping  # this deployment process only

    async def replay_key_holders(self, replay_keys: Any) -> dict[str, str]:
        holders = await super().replay_key_holders(replay_keys)
        for record in self.store.records():
            for key in record.get("kept", []):
                if key in replay_keys:
                    holders.setdefault(key, record["key"])
        return holders


FILE_MUTANTS[RetiredKeysStayClaimedFileHost.__name__] = (
    RetiredKeysStayClaimedFileHost,
    "R-11",
    "until_it_retires",
)


class EveryOtherOwnerIsGoneFileHost(FileHost):
    """R-1: the liveness test sees only its own incarnation, as if every other process
    were gone, so a second live process's drain takes a live owner's group for an orphan
    (its children become ``NoExecutor`` entries, or are cancelled)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store.owner_alive = lambda owner: owner == self.owner  # type: ignore[method-assign]


FILE_MUTANTS[EveryOtherOwnerIsGoneFileHost.__name__] = (
    EveryOtherOwnerIsGoneFileHost,
    "R-1",
    "another_process",
)


def _register() -> None:
    if "pytest" not in sys.modules:  # the deployment process: nothing to register
        return
    from catalog import file_mutant

    for name, (cls, breaks, select) in FILE_MUTANTS.items():
        file_mutant(name, breaks, cls.__doc__ or "", select=select)


_register()


# -- the losers of a decided CANCEL group stay down ---------------------------------------


class ResumeIgnoresDecidedFileHost(FileHost):
    """R-13: ``resume_group`` restarts the unsettled children whatever ``restart`` says
    (a hook written before the ruling), so a restarted ``race`` caller's reopen starts
    every loser again, to be cut by its close a moment later."""

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        await super().resume_group(group, restart=True)


def _register_r13() -> None:
    if "pytest" not in sys.modules:
        return
    from catalog import file_mutant

    cls = ResumeIgnoresDecidedFileHost
    file_mutant(cls.__name__, "R-13", cls.__doc__ or "", select="losers_of_a_decided")


_register_r13()


# -- transient faults, and R-13 beyond the race ----------------------------------------


class GivesUpOnAFailedSettlementFileHost(FaultyFileHost):
    """R-12: a settlement whose write fails is dropped, not retried (a pool exhausted for a
    moment loses the outcome), so the caller waits for ever on a child that finished."""

    async def settle(self, key: str, position: int, attempt: int | None, outcome: Outcome) -> bool:
        try:
            ranked = await self.settle_child(key, position, attempt, outcome)
        except Exception:
            return False
        if ranked:
            self.notify()
        return ranked


class TakesALostRaceForDoneFileHost(FaultyFileHost):
    """R-12: a step whose optimistic guard reports a conflict is taken for one that ran (its
    result read as nothing), so an open that lost a race refuses with a host bug and a close
    that lost one returns having closed nothing."""

    async def guarded(self, key: str, operation: str, step: Any) -> Any:
        try:
            async with self.guard(key):
                return await step()
        except Retry:
            return None


class KeepsALostStepsWritesFileHost(FaultyFileHost):
    """R-12: the guard reports a lost race only after the step wrote, and keeps what it
    wrote (a transaction that commits before checking what it watched), so the retried
    close finds the group already closed and is a no-op: its ``CANCEL`` never reaches the
    losers."""

    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        with self.store.locked():
            yield
        if self._strikes("guard"):
            raise Retry(f"conflict on {key!r} after the write")


class AnyDecidedByItsFirstRankFileHost(FileHost):
    """R-13: an ``any`` is taken for decided once rank 1 exists, a failure included (the
    race's rule), so after a crash its reopen holds the losers down although no success
    holds a rank."""

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = self.store.read(group.key)
        if group.wake is WakePolicy.FIRST_SUCCESS and record and record["ranks"]:
            restart = False
        await super().resume_group(group, restart=restart)


class AnyDecidedByRankOneOnlyFileHost(FileHost):
    """R-13: an ``any`` is judged by rank 1 alone, so one whose success came after a
    failure is taken for undecided and its reopen starts the losers again."""

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = self.store.read(group.key)
        if group.wake is WakePolicy.FIRST_SUCCESS and record and record["ranks"]:
            first = record["children"][record["ranks"][0]]["outcome"]["status"]
            restart = first != "success"
        await super().resume_group(group, restart=restart)


def _race_decided(record: Record) -> bool:
    """A race with rank 1 is decided, whatever its disposition (the mutant's rule)."""
    return not record["closed"] and record["wake"] == "first" and bool(record["ranks"])


class HoldsRunToCompletionRaceLosersFileHost(FileHost):
    """R-13 (G-28): a ``race`` is taken for decided once rank 1 exists whatever its
    disposition, so after a crash the reopen and the drain hold its ``RUN_TO_COMPLETION``
    losers down and they never finish."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        file_host.decided = _race_decided  # the drain's rule, in this deployment process

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        record = self.store.read(group.key)
        await super().resume_group(group, restart=restart and not _race_decided(record or {}))


class ProbeAlwaysParkedFileHost(FileHost):
    """G-19: the waiter probe answers yes whatever waits, so the cancelled-await check
    would cancel an await that never parked."""

    async def awaiting(self, group_key: str, rank: int) -> bool:
        return True


class IgnoresAnUnknownDispositionFileHost(FileHost):
    """G-26: a close whose disposition is no ``LoserPolicy`` value is taken as ``None``
    (keep the one in force) instead of being refused, so a typo closes the group."""

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        values = {m.value for m in LoserPolicy}
        if isinstance(disposition, str) and disposition not in values:
            disposition = None
        await super().close_effect_group(handle, disposition)


def _register_faults() -> None:
    if "pytest" not in sys.modules:
        return
    from catalog import file_mutant

    for cls, breaks, select, faults in (
        (GivesUpOnAFailedSettlementFileHost, "R-12", "settlement_write_that_fails", True),
        (TakesALostRaceForDoneFileHost, "R-12", "an_open_that_loses", True),
        (KeepsALostStepsWritesFileHost, "R-12", "a_close_that_loses", True),
        (AnyDecidedByItsFirstRankFileHost, "R-13", "resumes_an_undecided", False),
        (AnyDecidedByRankOneOnlyFileHost, "R-13", "decided_any", False),
        (HoldsRunToCompletionRaceLosersFileHost, "R-13", "run_on_after_a_crash", False),
        (ProbeAlwaysParkedFileHost, "G-19", "waiter_probe_reports", False),
        (IgnoresAnUnknownDispositionFileHost, "G-26", "reads_the_disposition", False),
    ):
        file_mutant(cls.__name__, breaks, cls.__doc__ or "", select=select, faults=faults)


_register_faults()
