"""The host kit: every engine-independent rule of the spec, once, for host authors.

A host is engine glue (record a group, settle a child, read a rank, cancel, wake) around
these rules. Each function here is pure: it reads a small frozen record of what the host
knows about a key and either answers or raises the contract's typed error, so it runs the
same in an async controller, a SQL transaction's decide callback, a Temporal workflow
validator (deterministic, sandboxed) or a Restate exclusive handler. Nothing here does
I/O, reads a clock or keeps state between calls (:class:`RankLedger` excepted, which holds
only what its caller gives it). :class:`KitController` builds a controller on them, and
:class:`TaskChildren` adds the plumbing of a host whose children are tasks of its process.

What a host knows about a key is one of three things:

- ``None``: the key was never recorded (or the host cannot tell it from never);
- a :class:`Tombstone`: the group was closed and retired, its record deleted (R-4);
- a :class:`GroupRecord`: child count, wake, declared and in-force disposition, closed.

The order of refusals on every method is R-2's; see ``docs/contract.md`` ("Writing a
host: the kit") and ``docs/spec.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, Protocol, TypeVar

from ._controller import (
    DrainReport,
    EffectExecutor,
    WiredController,
    first_unresolvable,
    group_shape_error,
)
from ._errors import (
    CursorExhausted,
    DispositionWidened,
    EffectHostError,
    EngineUnavailable,
    GroupClosed,
    GroupShapeMismatch,
    HandleMismatch,
    NoExecutor,
    ReplayMismatch,
    UnknownGroup,
)
from ._kinds import is_host_kind, sleep_durations
from ._types import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
    WakePolicy,
    coerce_disposition,
    normalize_json,
    require_handle,
)

__all__ = [
    "NO_RESOLVER",
    "RESOLVER_MISS",
    "DrainChild",
    "DrainStep",
    "DrainTally",
    "FirstOpen",
    "GroupRecord",
    "HandleClaim",
    "HandleLike",
    "KitController",
    "Known",
    "Offer",
    "RankLedger",
    "RecordedChild",
    "Retry",
    "TaskChildren",
    "Tombstone",
    "check_await",
    "check_children",
    "check_close",
    "check_cursor",
    "check_handle",
    "check_reopen",
    "decided",
    "decided_kind",
    "drain_child",
    "drain_children",
    "drain_group",
    "first_unresolvable",
    "group_closed",
    "group_shape_error",
    "narrow",
    "next_rank",
    "no_executor",
    "replay_key_taken",
    "resolve_first_open",
    "retires",
    "unknown_group",
]

NO_RESOLVER = "no resolver is registered"
"""The ``NoExecutor`` reason of a drain on a host with no resolver at all (G-12)."""

RESOLVER_MISS = "the resolver returned None"
"""The ``NoExecutor`` reason of a child the registered resolver cannot run (G-11)."""


# -- what a host knows ---------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRecord:
    """What a host has recorded for an unretired group.

    ``wake``, ``declared`` and ``effective`` accept the enums or their string values (as
    an engine's state stores them); they are held as the enums. ``effective`` is the
    disposition in force (the declared one, or a narrower one a close recorded) and
    defaults to ``declared``. ``closed`` is true once a close succeeded (R-4).
    """

    key: str
    child_count: int
    wake: WakePolicy
    declared: LoserPolicy
    effective: LoserPolicy | None = None
    closed: bool = False

    def __post_init__(self) -> None:
        # Hosts build one record per read on the hot path: convert only stored strings.
        if type(self.wake) is not WakePolicy:
            object.__setattr__(self, "wake", WakePolicy(self.wake))
        if type(self.declared) is not LoserPolicy:
            object.__setattr__(self, "declared", LoserPolicy(self.declared))
        if self.effective is None:
            object.__setattr__(self, "effective", self.declared)
        elif type(self.effective) is not LoserPolicy:
            object.__setattr__(self, "effective", LoserPolicy(self.effective))

    @property
    def in_force(self) -> LoserPolicy:
        """The disposition in force (never ``None``)."""
        assert self.effective is not None
        return self.effective


@dataclass(frozen=True)
class Tombstone:
    """A closed and retired key: its record is gone, the key stays closed forever (R-4)."""

    key: str


Known = GroupRecord | Tombstone | None
"""What a host knows about a key: a record, a tombstone, or nothing."""


class HandleLike(Protocol):
    """What the fences read of a handle: a :class:`~effecthost.contract.GroupHandle`
    satisfies it, and so does a :class:`HandleClaim` rebuilt from an engine's request."""

    @property
    def child_count(self) -> int: ...
    @property
    def wake(self) -> WakePolicy | str: ...
    @property
    def disposition(self) -> LoserPolicy | str: ...
    @property
    def consumed(self) -> int: ...


@dataclass(frozen=True)
class HandleClaim:
    """A handle's claims as engine code receives them (strings on the wire); for code
    that holds no :class:`~effecthost.contract.GroupHandle`."""

    child_count: int
    wake: WakePolicy | str
    disposition: LoserPolicy | str
    consumed: int = 0


@dataclass(frozen=True)
class RecordedChild:
    """One recorded child of a group: its position, replay key and envelope hash."""

    position: int
    replay_key: str
    hash: str


@dataclass(frozen=True)
class Offer:
    """What an open asks for: the group's shape and each child's (replay key, hash) in
    position order. :meth:`of` builds it from an :class:`EffectGroup`; engine code that
    received the open as JSON builds it from the fields."""

    key: str
    child_count: int
    wake: WakePolicy
    disposition: LoserPolicy
    children: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "wake", WakePolicy(self.wake))
        object.__setattr__(self, "disposition", LoserPolicy(self.disposition))
        object.__setattr__(self, "children", tuple((str(k), str(h)) for k, h in self.children))

    @classmethod
    def of(cls, group: EffectGroup, hashes: Sequence[str] | None = None) -> Offer:
        """The offer of ``group``; ``hashes`` when the host already computed them."""
        digests = hashes if hashes is not None else [c.envelope_hash() for c in group.children]
        return cls(
            key=group.key,
            child_count=group.child_count,
            wake=group.wake,
            disposition=group.disposition,
            children=tuple((c.replay_key, d) for c, d in zip(group.children, digests, strict=True)),
        )


# -- the refusals, built one way -------------------------------------------------------------


def group_closed(key: str) -> GroupClosed:
    """The refusal of an open or await of a closed key (R-4)."""
    return GroupClosed(f"group {key!r} was closed", group_key=key)


def unknown_group(key: str) -> UnknownGroup:
    """The refusal of a key the host never recorded (G-20)."""
    return UnknownGroup(f"no group is recorded under {key!r}", group_key=key)


def replay_key_taken(
    group_key: str, position: int, replay_key: str, holder: str | None
) -> ReplayMismatch:
    """The refusal of an open whose child reuses a replay key another group records
    (R-6); names both group keys (``holder`` is ``None`` when the store cannot say which
    group). The host records nothing."""
    other = "another group" if holder is None else f"group {holder!r}"
    where = f"child {replay_key!r} at position {position} of group {group_key!r}"
    return ReplayMismatch(
        f"{where}: the replay key is recorded for {other}",
        group_key=group_key,
        replay_key=replay_key,
        position=position,
    )


def no_executor(group_key: str, replay_key: str, position: int, why: str) -> NoExecutor:
    """A drain report entry for a child this host cannot run (G-11, G-12); ``why`` is
    :data:`NO_RESOLVER` or :data:`RESOLVER_MISS`. Never raised at a caller."""
    return NoExecutor(
        f"child {replay_key!r} at position {position} of group {group_key!r} "
        f"cannot run here: {why}",
        group_key=group_key,
        replay_key=replay_key,
        position=position,
    )


# -- the fences ------------------------------------------------------------------------------


def check_handle(key: str, handle: HandleLike, record: GroupRecord) -> None:
    """The handle's fence (G-20): its child count, wake and disposition must be the
    record's. The disposition compared is the declared one, not a narrower one a close
    recorded.

    Raises:
        HandleMismatch: any of the three disagrees; names the group only.
    """
    wake, disposition = handle.wake, handle.disposition
    if (
        type(wake) is WakePolicy
        and type(disposition) is LoserPolicy
        and handle.child_count == record.child_count
        and wake is record.wake
        and disposition is record.declared
    ):
        return  # the common case, without converting what already is the enum
    claimed = (handle.child_count, WakePolicy(wake), LoserPolicy(disposition))
    if claimed != (record.child_count, record.wake, record.declared):
        raise HandleMismatch(
            f"handle for {key!r} claims {claimed[0]} children, wake {claimed[1].value}, "
            f"disposition {claimed[2].value}; the group has {record.child_count}, "
            f"{record.wake.value}, {record.declared.value}",
            group_key=key,
        )


def check_await(key: str, handle: HandleLike, known: Known) -> GroupRecord:
    """R-2's order for ``await_next_settlement`` once the handle passed its own checks
    (``require_handle``) and the host is wired: ``UnknownGroup`` → ``GroupClosed`` →
    ``HandleMismatch`` → ``CursorExhausted``. Returns the record when rank
    ``handle.consumed + 1`` may be served; the host then reads or waits for it.

    A host that wakes a parked waiter re-reads and calls this again, so a close while
    it waited is ``GroupClosed`` (R-4).

    Raises:
        UnknownGroup: ``known`` is ``None``.
        GroupClosed: a tombstone, or a closed record.
        HandleMismatch: see :func:`check_handle`.
        CursorExhausted: ``handle.consumed`` equals the child count; never clamped.
    """
    if known is None:
        raise unknown_group(key)
    if isinstance(known, Tombstone) or known.closed:
        raise group_closed(key)
    check_handle(key, handle, known)
    check_cursor(key, handle.consumed, known.child_count)
    return known


def check_cursor(key: str, consumed: int, child_count: int) -> int:
    """The cursor's far side (G-20): the rank an await serves, ``consumed + 1``, once the
    handle passed its fence (so ``child_count`` is the record's).

    Raises:
        CursorExhausted: ``consumed`` equals the child count; never clamped.
    """
    rank = consumed + 1
    if rank < 1:  # an engine request naming no rank (a handle cannot: consumed >= 0)
        raise CursorExhausted(
            f"group {key!r} has {child_count} children; rank {rank} does not exist",
            group_key=key,
            rank=rank,
        )
    if rank > child_count:
        raise CursorExhausted(
            f"group {key!r} has {child_count} children and the handle has "
            f"consumed them all; rank {rank} does not exist",
            group_key=key,
            rank=rank,
        )
    return rank


def narrow(
    key: str, in_force: LoserPolicy | str, requested: LoserPolicy | str | None
) -> LoserPolicy:
    """The narrowing rule (G-26, R-3): the disposition a close records. ``None`` keeps
    the one in force; ``RUN_TO_COMPLETION`` may narrow to ``CANCEL``, never the reverse.

    Raises:
        DispositionWidened: ``CANCEL`` is in force and ``RUN_TO_COMPLETION`` asked.
    """
    current = LoserPolicy(in_force)
    target = current if requested is None else LoserPolicy(requested)
    if current is LoserPolicy.CANCEL and target is LoserPolicy.RUN_TO_COMPLETION:
        raise DispositionWidened(
            f"group {key!r} declares CANCEL; a close cannot widen it to RUN_TO_COMPLETION",
            group_key=key,
        )
    return target


def check_close(
    key: str, handle: HandleLike | None, known: Known, requested: LoserPolicy | str | None
) -> LoserPolicy | None:
    """R-2's order for ``close_effect_group`` once the handle passed its own checks and
    the disposition was coerced (``coerce_disposition``): the disposition to record, or
    ``None`` when the close is a no-op.

    A tombstone is a no-op whatever is asked (R-4: nothing is recorded, so nothing is
    widened). A closed record is a no-op once the handle passed its fence (G-20). With
    ``handle=None`` (an engine history recorded before handles were sent) the handle's
    fence is skipped.

    Raises:
        UnknownGroup: ``known`` is ``None``.
        HandleMismatch: see :func:`check_handle`.
        DispositionWidened: see :func:`narrow`.
    """
    if known is None:
        raise unknown_group(key)
    if isinstance(known, Tombstone):
        return None
    if handle is not None:
        check_handle(key, handle, known)
    if known.closed:
        return None
    return narrow(key, known.in_force, requested)


def check_reopen(offer: Offer, known: Known, recorded: Iterable[RecordedChild] = ()) -> bool:
    """R-2's order for ``open_effect_group`` on what the host knows of the key, after
    the wiring: ``GroupClosed`` → ``GroupShapeMismatch`` → ``ReplayMismatch``. Returns
    ``False`` for a first open (nothing recorded: the host then resolves every child,
    :func:`resolve_first_open`, and checks R-6 on its store) and ``True`` for a reopen
    that passed its fences (G-11: it refuses nothing for a resolver miss).

    ``recorded`` are the recorded children; a position missing from it (a group an older
    release recorded partly) is not compared.

    Raises:
        GroupClosed: a tombstone or a closed record (R-4).
        GroupShapeMismatch: another child count, wake or declared disposition (G-13);
            compared with the declared disposition, not a narrowed one.
        ReplayMismatch: a recorded child's replay key or envelope hash differs from the
            offered one at its position (G-02, R-7); names the position.
    """
    if known is None:
        return False
    if isinstance(known, Tombstone) or known.closed:
        raise group_closed(offer.key)
    if (known.child_count, known.wake, known.declared) != (
        offer.child_count,
        offer.wake,
        offer.disposition,
    ):
        raise GroupShapeMismatch(
            f"group {offer.key!r} is recorded with {known.child_count} children, wake "
            f"{known.wake.value}, disposition {known.declared.value}; reopened with "
            f"{offer.child_count}, {offer.wake.value}, {offer.disposition.value}",
            group_key=offer.key,
        )
    check_children(offer, recorded)
    return True


def check_children(offer: Offer, recorded: Iterable[RecordedChild]) -> None:
    """The per-child fence of a reopen alone (G-02, R-7): each recorded child's replay
    key and envelope hash against the offered one at its position; a position missing
    from ``recorded`` is not compared.

    Raises:
        ReplayMismatch: the first position that differs; names it.
    """
    by_position = {child.position: child for child in recorded}
    for position, (replay_key, digest) in enumerate(offer.children):
        child = by_position.get(position)
        if child is not None and (child.replay_key != replay_key or child.hash != digest):
            raise ReplayMismatch(
                f"child at position {position} of group {offer.key!r} is recorded as "
                f"{child.replay_key!r} with another envelope hash",
                group_key=offer.key,
                replay_key=replay_key,
                position=position,
            )


# -- resuming after a crash --------------------------------------------------------------------


def decided(record: GroupRecord, ranked: Iterable[str]) -> bool:
    """R-13: whether the losers of ``record`` stay down after a crash. ``ranked`` are the
    statuses (``"success"``, ``"error"``, ``"cancelled"``) of the ranks that exist, in any
    order; only the first success is looked for, so pass them lazily.

    A group with ``CANCEL`` in force is decided once its wake policy is met: ``FIRST`` when
    rank 1 exists, ``FIRST_SUCCESS`` when a success holds a rank. ``ALL`` never is (the host
    cannot tell ``all`` from ``allSettled``), nor is a ``RUN_TO_COMPLETION`` group. A reopen
    or a drain pass starts no unsettled child of a decided group again; only a caller that
    awaits a rank that does not exist yet has them started
    (:meth:`KitController.restart_unsettled`)."""
    if not decided_kind(record):
        return False
    if record.wake is WakePolicy.FIRST:
        return any(True for _ in ranked)
    return any(status == "success" for status in ranked)


def decided_kind(record: GroupRecord) -> bool:
    """Whether ``record`` can be :func:`decided` at all: ``CANCEL`` in force and a wake
    policy other than ``ALL``."""
    return record.in_force is LoserPolicy.CANCEL and record.wake is not WakePolicy.ALL


def retires(closed: bool, child_count: int, ranked: int) -> bool:
    """The retire rule (G-36, R-11): a group retires (its record goes, its replay keys are
    free again, its key keeps a tombstone, R-4) exactly when it is closed and every child
    holds a rank. Evaluate it in the same atomic step as the write that made it true:
    both the close and every settlement, so whichever lands last retires the group."""
    return closed and ranked == child_count


# -- the drain's decisions ---------------------------------------------------------------------


class DrainStep(Enum):
    """What a drain pass does with one child (R-1, G-11, G-12, G-29, R-13)."""

    LEAVE = "leave"
    """Settled, running somewhere live, or an event wait its owner keeps."""
    START = "start"
    """Start it (again) under this incarnation; a resolver miss is reported, not started."""
    CANCEL = "cancel"
    """Settle it ``cancelled`` (its owner is gone and ``CANCEL`` is in force)."""
    NO_RESOLVER = "no_resolver"
    """Report it as :data:`NO_RESOLVER`; never cancel it (G-12)."""


def drain_group(*, mine: bool, owner_alive: bool, decided: bool) -> bool:
    """Whether a drain pass touches a group at all: never a live owner's group of another
    incarnation (R-1), never the losers of this incarnation's :func:`decided` group
    (R-13: they run only when its caller awaits them)."""
    if not mine and owner_alive:
        return False
    return not (mine and decided)


def drain_child(
    *, mine: bool, in_force: LoserPolicy | str, kind: str, settled: bool, running: bool, wired: bool
) -> DrainStep:
    """The drain's decision for one child of a group :func:`drain_group` lets it touch.
    ``running`` is true when a live incarnation (this one or another) runs it; ``wired``
    when a resolver is registered."""
    if settled or running:
        return DrainStep.LEAVE
    if not wired:
        return DrainStep.NO_RESOLVER
    if not mine and LoserPolicy(in_force) is LoserPolicy.CANCEL:
        return DrainStep.CANCEL  # the disposition in force, not the declared one (G-29)
    if kind == EffectKind.AWAIT_EVENT:
        return DrainStep.LEAVE  # it waits for deliver_event, whoever owns it
    return DrainStep.START


class DrainChild(NamedTuple):
    """What a drain reads of one child (a plain 4-tuple in this order works too): its
    replay key and kind, whether it holds a rank, whether a live incarnation runs it."""

    replay_key: str
    kind: str
    settled: bool
    running: bool


@dataclass
class DrainTally:
    """What a drain pass did so far; :meth:`report` is its :class:`DrainReport`."""

    resumed: list[tuple[str, str]] = field(default_factory=list)
    cancelled: list[tuple[str, str]] = field(default_factory=list)
    no_executor: list[NoExecutor] = field(default_factory=list)

    def report(self) -> DrainReport:
        return DrainReport(
            resumed=tuple(self.resumed),
            cancelled=tuple(self.cancelled),
            no_executor=tuple(self.no_executor),
        )


def drain_children(
    key: str,
    children: Iterable[tuple[str, str, bool, bool]],
    *,
    mine: bool,
    in_force: LoserPolicy | str,
    wired: bool,
    start: Callable[[int], bool],
    cancel: Callable[[int], object],
    tally: DrainTally,
) -> bool:
    """Apply :func:`drain_child` to each child of one group, in the engine's lock or
    transaction on it: ``start(position)`` starts a child and returns ``False`` for a
    resolver miss, ``cancel(position)`` settles it ``cancelled`` through the rank rule.
    Adds what it did to ``tally``; returns whether anything was started or cancelled
    (whether the caller must write the group)."""
    touched = False
    for position, (replay_key, kind, settled, running) in enumerate(children):
        ids = (key, replay_key)
        step = drain_child(
            mine=mine, in_force=in_force, kind=kind, settled=settled, running=running, wired=wired
        )
        if step is DrainStep.NO_RESOLVER:
            tally.no_executor.append(no_executor(*ids, position, NO_RESOLVER))
        elif step is DrainStep.CANCEL:
            cancel(position)
            tally.cancelled.append(ids)
            touched = True
        elif step is DrainStep.START:
            if start(position):
                tally.resumed.append(ids)
                touched = True
            else:
                tally.no_executor.append(no_executor(*ids, position, RESOLVER_MISS))
    return touched


# -- first open ------------------------------------------------------------------------------

T = TypeVar("T")
Skip = Callable[[int, EffectEnvelope], bool]


def resolve_first_open(
    group: EffectGroup,
    resolve: Callable[[EffectEnvelope], T | None],
    *,
    skip: Skip | None = None,
) -> list[T | None]:
    """A first open resolves every child before recording anything (G-10): the
    executors in position order, ``None`` where ``skip`` excluded the child (e.g. the
    kinds the host runs itself). Call it after the fences and R-6 (``GroupShapeError``
    is the last refusal of an open, R-2).

    Raises:
        GroupShapeError: the first child ``resolve`` answers ``None`` for; names its
            position and replay key. The host records nothing.
    """
    found: list[T | None] = []
    for position, child in enumerate(group.children):
        if skip is not None and skip(position, child):
            found.append(None)
            continue
        executor = resolve(child)
        if executor is None:
            raise group_shape_error(group, position, child)
        found.append(executor)
    return found


# -- the rank ledger -------------------------------------------------------------------------


class RankLedger:
    """The rank rule for a host that holds a group's settlements in one place (a
    workflow's state, an exclusive handler's, a process's memory): the first settlement
    of each position wins and takes rank ``count + 1``; a later one of the same position
    (a duplicate delivery, a retry, a cancel racing a completion) is refused and takes
    no rank (G-15, G-17, G-35). Deterministic: no clock, no randomness.

    ``settled`` seeds the ledger with positions already ranked, in rank order.
    """

    def __init__(self, child_count: int, settled: Iterable[int] = ()) -> None:
        self.child_count = child_count
        self._order: list[int] = []
        self._ranks: dict[int, int] = {}
        for position in settled:
            self.settle(position)

    def settle(self, position: int) -> int | None:
        """Record the settlement of ``position``: its rank, or ``None`` when the position
        already holds one (nothing changes).

        Raises:
            ValueError: ``position`` is outside the group (a host bug, never input).
        """
        if not 0 <= position < self.child_count:
            raise ValueError(f"position {position} outside a group of {self.child_count}")
        if position in self._ranks:
            return None
        rank = len(self._order) + 1
        self._order.append(position)
        self._ranks[position] = rank
        return rank

    def position_at(self, rank: int) -> int | None:
        """The position holding ``rank``, or ``None`` while it does not exist."""
        return self._order[rank - 1] if 0 < rank <= len(self._order) else None

    def rank_of(self, position: int) -> int | None:
        return self._ranks.get(position)

    @property
    def count(self) -> int:
        """How many ranks exist."""
        return len(self._order)

    @property
    def order(self) -> list[int]:
        """Positions in rank order (``settlement_order``, G-22)."""
        return list(self._order)

    @property
    def complete(self) -> bool:
        """Every child holds a rank: a closed group may retire (G-36)."""
        return len(self._order) == self.child_count

    def unsettled(self) -> list[int]:
        """Positions without a rank, in position order (what a ``CANCEL`` close cancels)."""
        return [p for p in range(self.child_count) if p not in self._ranks]


def next_rank(count: int, already_ranked: bool) -> int | None:
    """The rank rule on a host that keeps only a counter and a per-child mark: the
    next rank (``count + 1``), or ``None`` when the child already holds one."""
    return None if already_ranked else count + 1


_DEFERRED: contextvars.ContextVar[list[Callable[[], object]] | None] = contextvars.ContextVar(
    "effecthost_kit_deferred", default=None
)


class Retry(Exception):
    """An optimistic guard's conflict: raised by :meth:`KitController.guard` (on entry or
    on exit, e.g. a Redis ``EXEC`` that returned nothing, a compare-and-set that lost) or
    by a hook inside it, it tells the kit that what the step read is stale. The kit drops
    what the step deferred with :meth:`KitController.after_guard` and runs the whole step
    again from its first read, up to :attr:`KitController.guard_attempts` times; then the
    call raises :class:`~effecthost.contract.EngineUnavailable`."""


# -- a base for hosts whose engine lets the rules run in the controller ------------------------


@dataclass(frozen=True)
class FirstOpen:
    """What :meth:`KitController.record_group` receives: the group, and its executors
    in position order (``None`` for the kinds the host runs itself, G-51), every one
    resolved before anything is recorded (G-10)."""

    group: EffectGroup
    executors: tuple[EffectExecutor | None, ...]


class KitController(WiredController):
    """A controller whose group methods are the kit's rules over a few engine hooks,
    the way a SQLAlchemy dialect overrides a few hooks of ``DefaultDialect``.

    It implements ``open_effect_group``, ``await_next_settlement``,
    ``close_effect_group`` and ``settlement_order`` with R-2's order of refusals; a
    subclass implements the hooks below (public names; each says when it is called and
    what it must guarantee) and the methods the kit cannot know: ``deliver_event``,
    ``open_group_keys``, ``drain``, and running the children it records.

    Each open and close checks, then acts, inside :meth:`guard`: a host with several
    writers to one group (processes sharing a directory or a database) makes the guard a
    lock or a transaction on the key, and the check and the write become one step (R-7,
    R-4). Awaits only read and take no guard. An optimistic engine's guard raises
    :class:`Retry` on a conflict and the kit runs the step again (see :meth:`guard`).
    """

    guard_attempts = 50
    """How many times an open or close runs its step before a run of :class:`Retry`
    conflicts becomes :class:`~effecthost.contract.EngineUnavailable`."""

    def after_guard(self, action: Callable[[], object]) -> None:
        """Run ``action`` once the current step's guard was left without :class:`Retry`
        (a commit that held); drop it when the step is run again. Start children this way
        from :meth:`record_group` and :meth:`resume_group` under an optimistic guard, so a
        step that lost its race starts nothing. Outside a step it runs at once."""
        deferred = _DEFERRED.get()
        if deferred is None:
            action()
        else:
            deferred.append(action)

    async def guarded(self, key: str, operation: str, step: Callable[[], Awaitable[T]]) -> T:
        """``step`` inside :meth:`guard`, run again on :class:`Retry`; the actions it
        deferred (:meth:`after_guard`) run once it held. Every open and close runs this
        way; a host runs its own atomic steps on a key through it too (a settlement, a
        drain pass's write), so one optimistic guard and one retry contract serve all of
        them. ``operation`` names the step in the :class:`EngineUnavailable` raised after
        :attr:`guard_attempts` conflicts, with how long it tried (R-12)."""
        began = time.monotonic()
        for _attempt in range(self.guard_attempts):
            deferred: list[Callable[[], object]] = []
            token = _DEFERRED.set(deferred)
            try:
                async with self.guard(key):
                    result = await step()
            except Retry:
                continue
            finally:
                _DEFERRED.reset(token)
            for action in deferred:
                action()
            return result
        raise EngineUnavailable(
            f"group {key!r}: {operation} lost {self.guard_attempts} optimistic races in a row",
            group_key=key,
            operation=operation,
            tried_for=time.monotonic() - began,
        )

    # -- hooks -------------------------------------------------------------------------

    def guard(self, key: str) -> AbstractAsyncContextManager[object]:
        """The lock or transaction an open or close of ``key`` runs in: the base calls
        :meth:`find_group`, :meth:`recorded_children`, :meth:`replay_key_holder`,
        :meth:`record_group`, :meth:`resume_group` and :meth:`record_close` inside it,
        and :meth:`cancel_unsettled` after leaving it (a cancel may settle a child, which
        takes the host's own lock). The default guards nothing, enough for a host with
        one writer (one process) whose hooks do not yield to the loop between the read
        and the write. A guard that blocks the thread (``flock``) needs hooks that never
        suspend while it is held; children started inside it must not settle before it
        is left (an asyncio task first runs after the base returns).

        The retry contract, for an optimistic engine (Redis ``WATCH``/``MULTI``, a
        compare-and-set, a serializable transaction): the guard may raise :class:`Retry`
        on entry, on exit (the commit failed) or let a hook raise it; the kit then runs
        the step again from :meth:`find_group`, with nothing kept from the failed run.
        The hooks must therefore buffer their writes in the guard's transaction and defer
        every side effect that is not one (starting a child, waking a waiter) with
        :meth:`after_guard`. A guard must never hold a lock a killed process keeps."""
        return contextlib.nullcontext()

    async def find_group(self, key: str) -> Known:
        """What the host knows of ``key``: a :class:`GroupRecord`, a :class:`Tombstone`
        (closed and retired; kept forever, R-4), or ``None`` (never recorded). Called
        first by every group method after the wiring check, and again after each
        :meth:`wait_for_change`. Must not write."""
        raise NotImplementedError

    async def recorded_children(self, key: str) -> Sequence[RecordedChild]:
        """The recorded children of an unretired group (for the reopen fence, G-02).
        Called only when :meth:`find_group` returned a record."""
        raise NotImplementedError

    async def replay_key_holder(self, replay_key: str) -> str | None:
        """The key of the unretired group that records ``replay_key``, or ``None``
        (R-6: replay keys are unique in the host's store). Called by the default
        :meth:`replay_key_holders` for each child; a host implements one of the two."""
        raise NotImplementedError

    async def replay_key_holders(self, replay_keys: Sequence[str]) -> Mapping[str, str]:
        """The batch form of :meth:`replay_key_holder`, called once per first open with
        every child's replay key, before anything is recorded: the holder of each key an
        unretired group records (a closed group holds its keys until it retires, R-11);
        keys nobody holds may be left out. Override it to ask the engine once (one
        ``MGET``, one ``WHERE replay_key IN (...)``)."""
        holders = {}
        for replay_key in replay_keys:
            holder = await self.replay_key_holder(replay_key)
            if holder is not None:
                holders[replay_key] = holder
        return holders

    def resolve_child(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        """A fresh executor for a ``tool_call`` child from the registered resolver
        (G-09); ``None`` when it cannot run here. Called for every tool call of a first
        open; override only to route differently, never to invent an outcome."""
        return None if self._resolver is None else self._resolver.resolve(envelope)

    async def record_group(self, opened: FirstOpen) -> bool:
        """Record the group and all its children atomically, the group owned by this
        incarnation, then start its children with ``opened.executors``; return once
        recorded (G-08), not once a child settles. Return ``False`` and record nothing
        when the key was recorded meanwhile (a concurrent first open, R-7): the base
        then fences this open as a reopen. Called after every check of the open passed.

        Raises:
            ReplayMismatch: a replay key was taken meanwhile (R-6); nothing recorded.
        """
        raise NotImplementedError

    async def resume_group(self, group: EffectGroup, *, restart: bool = True) -> None:
        """A reopen passed its fences: make this incarnation the owner (R-1) and, when
        ``restart``, dispatch the unsettled children nobody runs, resolving only those; a
        child the resolver cannot run stays unsettled (G-11). ``restart`` is false when
        the group is :func:`decided` (R-13): its losers stay down, and a drain pass of
        the owner must not start them either; :meth:`restart_unsettled` does, when a
        caller awaits a rank that does not exist yet. The default does nothing (an
        engine that runs its children itself)."""

    async def restart_unsettled(self, key: str) -> None:
        """A caller awaits a rank of ``key`` that does not exist yet, in a group with
        ``CANCEL`` in force and a wake policy other than ``ALL`` (R-13): dispatch the
        unsettled children nobody runs, as :meth:`resume_group` with ``restart`` does;
        a no-op when they all run. Called once per such await, outside the guard. The
        default does nothing (an engine that runs its children itself)."""

    async def read_rank(self, key: str, rank: int) -> Settlement | None:
        """Rank ``rank`` of ``key`` if it exists: the child holding the ``rank``-th
        smallest settlement sequence (G-16), as recorded (G-15). Must not wait."""
        raise NotImplementedError

    async def wait_for_change(self, key: str, rank: int) -> None:
        """Return once rank ``rank`` may exist or the group may have closed; spurious
        returns are allowed (the base reads again), lost wake-ups are not: a change
        that landed after the base's last read must end the wait (a bounded poll is
        enough). Cancelling it must change nothing (G-19)."""
        raise NotImplementedError

    async def record_close(self, key: str, disposition: LoserPolicy) -> None:
        """Mark the group closed with ``disposition`` in force (the kit already applied
        the narrowing), keep its key closed forever (R-4), wake its waiters, and retire
        it once every child has settled (G-36). Must be a no-op on a group closed
        meanwhile."""
        raise NotImplementedError

    async def cancel_unsettled(self, key: str) -> None:
        """Issue one idempotent cancel per unsettled child and return without waiting
        for them to stop (G-27); each cancelled child still settles and takes a rank.
        Called after :meth:`record_close` with ``CANCEL``."""
        raise NotImplementedError

    async def settled_positions(self, key: str) -> Sequence[int]:
        """Positions in rank order so far (``settlement_order``, G-22)."""
        raise NotImplementedError

    # -- the rules ---------------------------------------------------------------------

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self.require_wired(group.key)
        sleep_durations(group)  # a malformed sleep is refused before anything (G-10)
        offer = Offer.of(group)

        async def step() -> bool:
            known = await self.find_group(group.key)
            recorded = (
                await self.recorded_children(group.key) if isinstance(known, GroupRecord) else ()
            )
            if check_reopen(offer, known, recorded):
                assert isinstance(known, GroupRecord)
                hold = decided_kind(known) and decided(
                    known, await self._statuses(group.key, known.wake)
                )
                await self.resume_group(group, restart=not hold)
                return True
            holders = await self.replay_key_holders([c.replay_key for c in group.children])
            for position, child in enumerate(group.children):
                holder = holders.get(child.replay_key)
                if holder is not None and holder != group.key:
                    raise replay_key_taken(group.key, position, child.replay_key, holder)
            executors = resolve_first_open(
                group, self.resolve_child, skip=lambda _p, child: is_host_kind(child)
            )
            return await self.record_group(FirstOpen(group, tuple(executors)))

        for _attempt in range(2):  # a lost race to record the key is a reopen
            if await self.guarded(group.key, "open", step):
                return group.handle()
        raise RuntimeError(f"group {group.key!r}: record_group refused twice with no record")

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        key = require_handle(handle).group_key
        self.require_wired(key)
        rank = handle.consumed + 1
        missed = False
        while True:
            record = check_await(key, handle, await self.find_group(key))
            settlement = await self.read_rank(key, rank)
            if settlement is not None:
                handle.consumed = rank
                return settlement
            if not missed and rank > 1 and decided_kind(record):
                await self.restart_unsettled(key)  # the losers run on demand
            missed = True
            await self.wait_for_change(key, rank)

    async def _statuses(self, key: str, wake: WakePolicy) -> list[str]:
        """The statuses of the ranks that exist, up to what :func:`decided` needs: rank 1
        under ``FIRST``, the first success under ``FIRST_SUCCESS``."""
        statuses: list[str] = []
        while (settlement := await self.read_rank(key, len(statuses) + 1)) is not None:
            statuses.append(settlement.outcome.status)
            if wake is WakePolicy.FIRST or statuses[-1] == "success":
                break
        return statuses

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        disposition = coerce_disposition(require_handle(handle).group_key, disposition)
        key = handle.group_key
        self.require_wired(key)

        async def step() -> LoserPolicy | None:
            target = check_close(key, handle, await self.find_group(key), disposition)
            if target is not None:
                await self.record_close(key, target)
            return target

        target = await self.guarded(key, "close", step)
        if target is LoserPolicy.CANCEL:
            await self.cancel_unsettled(key)

    async def settlement_order(self, group_key: str) -> list[int]:
        self.require_wired(group_key)
        if not isinstance(await self.find_group(group_key), GroupRecord):
            raise unknown_group(group_key)
        positions = list(await self.settled_positions(group_key))
        # A group that retired between the two reads has no order left to read (G-22);
        # retirement is final, so a group still recorded after the read was before it.
        if not isinstance(await self.find_group(group_key), GroupRecord):
            raise unknown_group(group_key)
        return positions


# -- children as tasks of this process, waiters and events --------------------------------------

_log = logging.getLogger("effecthost.kit")


async def _cancelled() -> Outcome:
    return Outcome.cancelled()


class TaskChildren(KitController):
    """The plumbing a host whose children run as asyncio tasks of its own process shares
    with every other such host: starting and cancelling a child, settling it through the
    host's one atomic write, waking the waiters, and the event and cancel methods. A
    subclass calls :meth:`init_children` in ``__init__`` and implements
    :meth:`settle_child` and :meth:`unsettled` on top of
    :class:`KitController`'s hooks.

    A settlement write that fails (the engine is down, a pool is exhausted) is retried
    with a growing pause, :attr:`settle_attempts` times; if it still fails, the child is
    left unsettled and not running, so this owner's next drain pass starts it again. It is
    never dropped silently, so an ``all_`` awaiting it never hangs on a lost write.
    """

    poll_seconds = 1.0
    """How long a waiter parks before it reads again: bounds how late a write by another
    process (a drain, a second incarnation) is seen."""

    settle_attempts = 8

    def init_children(self) -> None:
        self.running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.cancelling: set[tuple[str, int]] = set()
        self._changed = asyncio.Event()
        self._parked: Counter[tuple[str, int]] = Counter()

    # -- hooks -------------------------------------------------------------------------

    async def settle_child(
        self, key: str, position: int, attempt: int | None, outcome: Outcome
    ) -> bool:
        """The one atomic step that settles a child: unless ``attempt`` is stale (not
        ``None`` and not the child's current attempt) or the group retired, record the
        outcome and give the child its rank by the rank rule (:class:`RankLedger`:
        ``count + 1``, none for a second settlement of a position), and retire the group
        when :func:`retires` (closed, every child ranked). Return whether it took a rank.
        Raise if the write failed; the kit retries it."""
        raise NotImplementedError

    async def unsettled(self, key: str) -> Sequence[tuple[int, Mapping[str, Any]]]:
        """The children of ``key`` without a rank, as (position, envelope) pairs in
        position order, the envelope as recorded (its JSON form); empty for a retired
        group. What a ``CANCEL`` close cancels and an event settles (R-5)."""
        raise NotImplementedError

    # -- the plumbing ------------------------------------------------------------------

    def is_running(self, key: str, position: int) -> bool:
        """Whether this process runs the child."""
        return (key, position) in self.running

    def run_child(self, key: str, position: int, attempt: int, work: Awaitable[Outcome]) -> None:
        """Run ``work`` as the child's ``attempt``-th run; its outcome (``cancelled`` if
        :meth:`cancel_child` stopped it) is settled through :meth:`settle`. Cancelled
        otherwise (the process is going away), it records nothing. A task cancelled before
        its first step never enters its body: a cancel of it settles ``cancelled`` through
        a task of its own."""
        entered = False

        async def run() -> None:
            nonlocal entered
            entered = True
            try:
                outcome = await work
            except asyncio.CancelledError:
                if (key, position) not in self.cancelling:
                    raise
                outcome = Outcome.cancelled()
            with contextlib.suppress(Exception):  # logged; a drain pass starts it again
                await self.settle(key, position, attempt, outcome)

        task = asyncio.create_task(run())
        self.running[key, position] = task

        def done(_: object) -> None:
            if self.running.get((key, position)) is task:
                del self.running[key, position]
            cancelled = (key, position) in self.cancelling
            self.cancelling.discard((key, position))
            if not entered:
                if inspect.iscoroutine(work):
                    work.close()
                if cancelled:
                    self.run_child(key, position, attempt, _cancelled())

        task.add_done_callback(done)

    async def idle(self) -> None:
        """Return once no child runs in this process (each settled or gave up): what a
        one-shot ``effecthost drain --host`` waits for before it closes the host."""
        while self.running:  # asyncio.wait: cancelling the wait cancels no child
            await asyncio.wait(list(self.running.values()))

    def cancel_child(self, key: str, position: int) -> bool:
        """Cancel the child's task here; ``False`` when this process does not run it."""
        task = self.running.get((key, position))
        if task is None:
            return False
        self.cancelling.add((key, position))
        task.cancel()
        return True

    async def settle(self, key: str, position: int, attempt: int | None, outcome: Outcome) -> bool:
        """:meth:`settle_child`, retried while the write fails; wakes the waiters when it
        took a rank."""
        pause = 0.05
        for tries in range(1, self.settle_attempts + 1):
            try:
                ranked = await self.settle_child(key, position, attempt, outcome)
                break
            except Exception:
                if tries == self.settle_attempts:
                    _log.exception("group %r position %d: settlement not recorded", key, position)
                    raise
                await asyncio.sleep(pause)  # a backoff, not an ordering
                pause = min(pause * 2, 2.0)
        if ranked:
            self.notify()
        return ranked

    def notify(self) -> None:
        """Wake every parked waiter of this process (they read again)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for_change(self, key: str, rank: int) -> None:
        self._parked[key, rank] += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.poll_seconds)
        finally:
            self._parked[key, rank] -= 1

    @staticmethod
    async def sleep_until(due: float) -> Outcome:
        """A ``sleep`` child's work: ``success(null)`` at ``due`` (epoch seconds), the due
        time recorded at open, so a restart does not sleep it again in full (G-51)."""
        await asyncio.sleep(max(0.0, due - time.time()))
        return Outcome.success(None)

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """The waiter probe (G-19): a caller is parked on rank ``rank`` of the group."""
        return self._parked[group_key, rank] > 0

    async def cancel_unsettled(self, key: str) -> None:
        """One cancel per unsettled child (G-27): its task's if it runs here, else a
        ``cancelled`` settlement; never waits for a task to stop."""
        for position, _envelope in await self.unsettled(key):
            if not self.cancel_child(key, position):
                await self.settle(key, position, None, Outcome.cancelled())

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        """R-5: settle the group's unsettled waits for ``name``; 0 for a retired group.

        Raises:
            EngineUnavailable: a wait's settlement write still failed after
                :attr:`settle_attempts` tries (R-12); the waits settled before it stay
                settled, so delivering again is safe.
        """
        self.require_wired(group_key)
        value = normalize_json(payload, what=f"event {name!r}", group_key=group_key)
        if await self.find_group(group_key) is None:
            raise unknown_group(group_key)
        began = time.monotonic()
        reached = 0
        for position, envelope in await self.unsettled(group_key):
            if envelope["kind"] == EffectKind.AWAIT_EVENT and envelope["name"] == name:
                try:
                    settled = await self.settle(group_key, position, None, Outcome.success(value))
                except EffectHostError:
                    raise
                except Exception as exc:  # the engine's own error never leaves
                    raise EngineUnavailable(
                        f"group {group_key!r}: event {name!r} not delivered, its settlement "
                        f"write failed {self.settle_attempts} times",
                        group_key=group_key,
                        operation="deliver_event",
                        tried_for=time.monotonic() - began,
                    ) from exc
                reached += settled
        return reached
