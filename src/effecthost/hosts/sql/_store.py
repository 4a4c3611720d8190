"""The substrate seam of the SQL tier: one store (:class:`SqlStore`), two dialects.

The table layout and every read and one-statement write live here once; a dialect
(SQLite, PostgreSQL) supplies its column types, its SQL words and its connections, and
the writes that decide, each one short transaction (a plpgsql function on PostgreSQL, a
Python transaction on SQLite). The host (:mod:`._host`) holds every decision that is the
same on both substrates.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from effecthost._inspect import RUNNING, outcome_status
from effecthost._inspect import ChildRow as InspectedChild
from effecthost._inspect import GroupRow as InspectedGroup
from effecthost.contract import StoreRefused
from effecthost.payloads import PayloadRef, PayloadStore
from effecthost.payloads._store import _check, _make_ref, _missing

SCHEMA_VERSION = 5
"""The schema this code reads and writes. Another version in the database is refused.

Version 2 added the payload table ``eh_payloads`` (G-47); version 3 added the group's owner
and its owner-lease expiry to ``eh_groups`` (R-1); version 4 added ``eh_groups.watched``
(G-21: PostgreSQL notifies only for a group a waiter watches); version 5 added
``eh_groups.trace_context`` (the trace context of the caller's group span, so a drain pass
in another process runs its children in the caller's trace). A database recording an
earlier version is refused like any other version (nothing is migrated)."""


class SchemaVersionError(StoreRefused):
    """The database holds a schema version this code does not know (a newer release or a
    foreign layout). Raised at start-up; nothing is migrated silently.

    Attributes:
        found: the version recorded in the database.
        expected: :data:`SCHEMA_VERSION`.
        where: the database it concerns (a file, a schema; never a DSN), or ``None``.
    """

    def __init__(
        self, found: int, expected: int = SCHEMA_VERSION, *, where: str | None = None
    ) -> None:
        prefix = "" if where is None else f"{where}: "
        if found < expected:
            advice = (
                "drain it with the release that wrote it, or upgrade it in place as the SQL "
                "host's docs show (section 'Upgrading a version-4 database in place')"
            )
        else:
            advice = "upgrade effecthost or use another database"
        super().__init__(
            f"{prefix}the database records effecthost SQL schema version {found}; this release "
            f"reads version {expected} only and does not migrate: {advice}"
        )
        self.found = found
        self.expected = expected
        self.where = where


@dataclass
class Sent:
    """When a lease statement went out: the local monotonic time a store records just
    before it sends the claim, insert or renewal (after any wait for a connection or a
    lock), so a self-fencing deadline is measured from there and not from before the
    wait (G-33, seed D11)."""

    at: float | None = None

    def mark(self) -> None:
        self.at = time.monotonic()


def _mark(sent: Sent | None) -> None:
    if sent is not None:
        sent.mark()


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One row of the groups table."""

    group_key: str
    wake: str
    disposition: str
    effective: str
    child_count: int
    counter: int
    state: str  # open | closed
    created_at: float
    closed_at: float | None = None


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """A child row to insert at open."""

    replay_key: str
    position: int
    kind: str
    name: str
    envelope: str  # canonical JSON of the envelope
    envelope_hash: str
    claim: bool  # inserted already leased to the opener
    sleep_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ChildRow:
    """One row of the children table (the fields the host reads)."""

    replay_key: str
    group_key: str
    position: int
    kind: str
    name: str
    envelope: str
    envelope_hash: str
    state: str  # pending | claimed | settled
    lease_owner: str | None
    fence: int
    lease_expired: bool
    attempt: int
    cancel_requested: bool
    due_at: float | None
    seq: int | None
    effective: str = ""  # the group's disposition in force (drain reads)
    group_state: str = ""
    group_owner: str | None = None  # the incarnation that last opened the group
    owner_live: bool = False  # the group is open and its owner's claim is unexpired
    trace_context: str | None = None  # the group's, as recorded at its last open (drain reads)


@dataclass(frozen=True, slots=True)
class Expected:
    """A close's expectation of an open group (its handle's shape) and the disposition
    the close records on such a group. An open group's disposition in force is the
    declared one: only a close narrows it, and a close also closes the group."""

    child_count: int
    wake: str
    declared: str
    target: str


@dataclass(frozen=True, slots=True)
class Finalize:
    """One child of a batched finalize: its fence (with the batch's lease owner) and its
    outcome."""

    replay_key: str
    envelope_hash: str
    fence: int
    outcome: str


@dataclass(frozen=True, slots=True)
class Claim:
    """A lease won on a child: the fence token the finalize must match."""

    replay_key: str
    fence: int
    attempt: int
    cancel_requested: bool
    lease_expires: float


@dataclass(frozen=True, slots=True)
class Renewal:
    """A lease this owner still holds after a renewal."""

    replay_key: str
    fence: int
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class RankRead:
    """The group row and, when recorded, the child holding sequence ``seq``."""

    group: GroupRow
    position: int | None
    replay_key: str | None
    outcome: str | bytes | None  # bytes: a SQLite row that is not UTF-8


@dataclass(frozen=True, slots=True)
class Opened:
    """What :meth:`Store.open_group` found or did."""

    created: bool  # this call recorded the group and all its children
    group: GroupRow | None  # None: not recorded (then ``tombstone`` is set)
    tombstone: str | None = None  # the disposition a retired group was closed with
    children: tuple[ChildRow, ...] = ()  # the recorded children of a group found recorded


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """The arguments of :meth:`Store.open_group` (of :meth:`Store.create_group`: no
    children, no owner when none is given), handed to a dialect whole."""

    group_key: str
    wake: str
    disposition: str
    child_count: int
    specs: list[ChildSpec]
    owner: str | None
    ttl: float
    before_create: Callable[[], None] = _nothing
    reopen: Callable[[GroupRow, tuple[ChildRow, ...]], None] | None = None
    sent: Sent | None = None
    trace_context: str | None = None

    @property
    def group_values(self) -> tuple[str, str, str, int, str | None, float]:
        """The group row's values, in the order the statements that record it take them."""
        return self.group_key, self.wake, self.disposition, self.child_count, self.owner, self.ttl

    @property
    def create_values(self) -> tuple[Any, ...]:
        """The values :data:`CREATE_GROUP` takes, in its order."""
        key, wake, disposition, count, owner, ttl = self.group_values
        return key, wake, disposition, disposition, count, owner, owner, ttl, self.trace_context


Decide = Callable[[GroupRow | None, str | None], str | None]
"""A close's decision on the group row (``None``: not recorded) and its tombstone: the
disposition to close with, ``None`` for nothing to write; it raises to refuse."""

Closed = tuple[GroupRow | None, bool, bool]
"""What :meth:`Store.close_group` returns: ``(row, recorded, retired)``."""


class ReplayKeyTaken(Exception):
    """An open met a replay key recorded for another group (R-6); it wrote nothing.

    Attributes:
        replay_key: the child's replay key; position: its position in the new group;
        holder: the group key that records it (``None`` when it vanished meanwhile).
    """

    def __init__(self, replay_key: str, position: int, holder: str | None) -> None:
        super().__init__(replay_key, position, holder)
        self.replay_key = replay_key
        self.position = position
        self.holder = holder


@dataclass(frozen=True, slots=True)
class OpenGroup:
    """An open group as ``open_groups`` lists it (G-30)."""

    group_key: str
    age_seconds: float
    child_count: int
    settled: int
    wake: str
    effective: str


def inspected_child(
    seq: int | None,
    position: int,
    replay_key: str,
    name: str,
    state: str,
    outcome: str | None,
    settled_at: float | None,
) -> InspectedChild:
    """One ``eh_children`` row as ``effecthost inspect`` shows it."""
    if state == "settled" and outcome is not None:
        status, sealed = outcome_status(outcome)
    else:
        status, sealed = RUNNING, None
    return InspectedChild(
        None if seq is None else _integer(seq),
        _integer(position),
        replay_key,
        name,
        status,
        settled_at if state == "settled" else None,
        sealed,
    )


def _integer(value: Any) -> Any:
    """``value`` as an integer, or as stored when it is not one (inspection shows a
    tampered value as unreadable rather than failing)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return value


class Store(ABC):
    """One substrate. Every method is one transaction (or a read)."""

    wakes_across_processes: bool = False
    """True when another process's commit wakes this process without polling."""

    change_poll: float | None = None
    """For a store whose other processes cannot notify: how often (seconds) a host with a
    parked waiter compares :meth:`commit_marker` to learn of their commits."""

    input_errors: tuple[type[BaseException], ...] = (UnicodeEncodeError, OverflowError)
    """Errors of the driver that mean the database refused a value it was given (a NUL
    byte, an unencodable string, an out-of-range number, a key too long to index), as
    opposed to an unreachable database. The host turns them into a typed refusal."""

    driver_errors: tuple[type[BaseException], ...] = (OSError,)
    """Errors of the driver that mean the database could not do the operation (down,
    restarting, the connection dropped, locked past the busy timeout). Checked after
    :attr:`input_errors`. The host retries them and never lets one reach a caller: an
    await waits, other calls raise ``EngineUnavailable`` past the host's bound (R-12)."""

    open_at_finalize: set[str] = frozenset()  # type: ignore[assignment]
    """Replay keys whose finalize (by :meth:`finalize` or :meth:`finalize_many`) committed
    while the group row read ``open`` under its lock, for a store that reports it (the
    caller removes what it reads). A close can only commit after such a finalize and then
    retires the group itself, so the finalizer need not check for retirement. A store
    that does not report it leaves this empty: the finalizer always checks."""

    @abstractmethod
    async def start(self) -> None:
        """Connect and create or check the schema.

        Raises:
            SchemaVersionError: the database records another schema version.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Close every connection; writes nothing."""

    @abstractmethod
    async def now(self) -> float:
        """The database clock, seconds since the epoch. Leases and timers use only it."""

    @abstractmethod
    async def get_group(self, group_key: str) -> GroupRow | None: ...

    @abstractmethod
    async def retired(self, group_key: str) -> str | None:
        """The disposition in force when the group retired, or ``None``."""

    async def create_group(
        self,
        group_key: str,
        wake: str,
        disposition: str,
        child_count: int,
        owner: str | None = None,
        ttl: float = 0.0,
    ) -> tuple[bool, GroupRow]:
        """Insert the group row alone in its own committed transaction, owned by
        ``owner`` for ``ttl`` seconds of the database clock when given (R-1). Returns
        ``(created, row)``; ``created`` is false when the key was already recorded. A
        building block for tests and tools: the host opens through :meth:`open_group`."""
        return await self._create(
            OpenRequest(group_key, wake, disposition, child_count, [], owner, ttl)
        )

    @abstractmethod
    async def _create(self, r: OpenRequest) -> tuple[bool, GroupRow]:
        """:meth:`create_group` (``r`` has no children)."""

    @abstractmethod
    async def own(
        self, group_key: str, owner: str, ttl: float, trace_context: str | None = None
    ) -> bool:
        """Make ``owner`` the owner of an open group for ``ttl`` seconds (a reopen, R-1),
        recording ``trace_context`` (the reopening caller's) when given. False when the
        group is not recorded open."""

    @abstractmethod
    async def insert_children(
        self, group_key: str, specs: list[ChildSpec], owner: str, ttl: float
    ) -> list[str]:
        """Insert missing child rows (one transaction, children only); rows with
        ``claim`` are inserted leased to ``owner`` with fence 1. Returns the replay keys
        inserted (an existing row is left as it is). The host uses it only to complete a
        group an older release recorded without all its children."""

    @abstractmethod
    async def children(self, group_key: str) -> list[ChildRow]: ...

    @abstractmethod
    async def claim(
        self, replay_key: str, owner: str, ttl: float, sent: Sent | None = None
    ) -> Claim | None:
        """Conditional takeover: lease an unsettled child whose lease is absent or expired
        on the database clock, bumping the fence (G-33). ``None`` when a live lease (or a
        settlement) is in the way. ``sent`` is marked just before the statement goes out."""

    @abstractmethod
    async def renew(
        self, owner: str, ttl: float, keys: list[str], groups: list[str], sent: Sent | None = None
    ) -> tuple[list[Renewal], list[str]]:
        """Extend the unexpired leases ``owner`` holds on the children ``keys`` (those
        with a live driver) and its unexpired ownership of the open ``groups`` (R-1), in
        one transaction, child rows by key, then group rows by key (G-32). Returns the
        child leases and the groups still held. ``sent`` is marked just before the
        statement goes out."""

    @abstractmethod
    async def release(self, owner: str, replay_key: str, fence: int) -> None:
        """Give up a lease ``owner`` holds at ``fence`` without settling the child, so
        another driver may claim it at once (a driver that ends without an outcome)."""

    @abstractmethod
    async def finalize(
        self, replay_key: str, envelope_hash: str, owner: str, fence: int, outcome: str
    ) -> int | None:
        """The fenced finalize of G-31, one transaction: the fenced UPDATE of the child row
        on all five fence columns; rowcount 0 → roll back, no counter bump, ``None``;
        rowcount 1 → ``counter = counter + 1 … RETURNING`` on the group row, written as
        the child's sequence; commit. Returns the sequence."""

    @abstractmethod
    async def finalize_many(self, owner: str, items: list[Finalize]) -> list[int | None]:
        """Several children of **one** group finalized in one transaction (the batched
        finalize): each child through its own fenced UPDATE, in the order given (child
        rows first); then, only when at least one matched, one ``counter = counter + m``
        on the group row for the ``m`` that matched, their sequences handed out in the
        order their fenced updates succeeded; commit. Returns each item's sequence, or
        ``None`` for an item whose fenced update matched nothing (it bumped nothing)."""

    @abstractmethod
    async def settle_free(
        self, replay_key: str, owner: str, outcome: str, orphan: bool = False
    ) -> int | None:
        """Claim an unleased (or expired) child and finalize it, in one transaction: how
        timers fire, events are delivered and free children are cancelled. With
        ``orphan`` (a drain applying a declared ``CANCEL``) nothing is written when,
        under the group row's lock taken after the child's, the group is open and
        another owner's claim on it is live (R-1: the caller came back meanwhile)."""

    @abstractmethod
    async def read_rank(self, group_key: str, seq: int) -> RankRead | None:
        """The group row and the child holding sequence ``seq`` (a point lookup on
        ``UNIQUE(group_key, seq)``), or ``None`` when the group is not recorded."""

    @abstractmethod
    async def read_ranks(
        self, group_key: str, seq: int, limit: int, local: Collection[str] | None = None
    ) -> tuple[GroupRow, list[tuple[int, int, str, str | bytes]]] | None:
        """The group row and the recorded children holding sequences ``seq …
        seq + limit - 1`` as ``(seq, position, replay_key, outcome)`` in sequence order (a
        range scan on ``UNIQUE(group_key, seq)``), or ``None`` when the group is not
        recorded. How a waiter reads ahead the ranks already committed.

        ``local`` (a waiter's read): the replay keys the waiter's own host drives, whose
        finalizes wake it in-process. A store that notifies other processes first marks
        the group watched, in a statement of its own before the read, when a child of it
        is unsettled and not in ``local``; from then on its finalizes and closes notify."""

    @abstractmethod
    async def settlement_order(self, group_key: str) -> list[int]: ...

    @abstractmethod
    async def close(self, group_key: str, effective: str) -> bool:
        """Close (idempotent): under ``cancel`` mark every unsettled child
        ``cancel_requested`` (child rows first), then the group row. False when the group
        is not recorded."""

    @abstractmethod
    async def retire(self, group_key: str) -> bool:
        """Delete a closed group whose children are all settled, with its children, in
        one transaction, leaving a tombstone (G-36). False when it cannot retire yet."""

    async def lookup(self, group_key: str) -> tuple[GroupRow | None, str | None]:
        """The group row, or (when none) the disposition its tombstone records: what
        :meth:`get_group` then :meth:`retired` return, in one read where the store can."""
        group = await self.get_group(group_key)
        if group is not None:
            return group, None
        return None, await self.retired(group_key)

    async def retire_closed(self, group_key: str) -> bool:
        """:meth:`retire` when the group row reads ``closed`` (nothing otherwise): one
        round trip where the store can. True when the group retired."""
        group = await self.get_group(group_key)
        return group is not None and group.state == "closed" and await self.retire(group_key)

    async def open_group(
        self,
        group_key: str,
        wake: str,
        disposition: str,
        child_count: int,
        specs: list[ChildSpec],
        owner: str,
        ttl: float,
        before_create: Callable[[], None],
        *,
        reopen: Callable[[GroupRow, tuple[ChildRow, ...]], None] | None = None,
        sent: Sent | None = None,
        trace_context: str | None = None,
    ) -> Opened:
        """Open as one operation (R-7, G-10, R-6, R-1). Look the group up: when its row
        is recorded open, call ``reopen`` with it and its children (the reopen's fences:
        when it raises, nothing is written and the error propagates), make ``owner`` the
        group's owner for ``ttl`` seconds of the database clock (R-1: a reopen takes the
        group over) and return it with its children; when it is recorded closed, or its
        tombstone is, return that and write nothing. Else refuse a child whose replay key
        another group holds (:class:`ReplayKeyTaken`), call ``before_create`` (the first
        open's resolution: when it raises, the error propagates) and record the group
        row, owned by ``owner`` for ``ttl`` seconds, and every child row in **one**
        transaction, group row first; rows with ``claim`` are leased to ``owner`` (fence
        1). ``sent`` is marked just before the statement that records the leases goes
        out (their self-fencing deadline counts from there). When another open recorded
        the group first, it is handled as a reopen. A refusal writes nothing.

        Only new rows are written by a first open, so inserting the group row before its
        children cannot close a lock cycle with the statements that lock existing rows
        (renewal, finalize, close, retirement: child rows by key, then group rows): none
        of them can see, so none waits on, a row an uncommitted open inserted. An open
        waits only on another writer of the same key (the same group key, or a replay
        key another group is inserting or updating), and two opens insert their children
        in replay-key order after their group rows, so they cannot wait on each other in
        a cycle either. Taking over a reopened group updates its group row alone.

        ``trace_context`` (the caller's group span, from
        :func:`effecthost.telemetry.group_context`; ``None`` when telemetry is off) is
        recorded on the group row by a first open, and by a reopen that takes it over.

        Raises:
            ReplayKeyTaken: a replay key is recorded for another group.
        """
        return await self._open(
            OpenRequest(
                group_key,
                wake,
                disposition,
                child_count,
                specs,
                owner,
                ttl,
                before_create,
                reopen,
                sent,
                trace_context,
            )
        )

    @abstractmethod
    async def _open(self, r: OpenRequest) -> Opened:
        """:meth:`open_group`, as asked."""

    async def close_group(
        self, group_key: str, decide: Decide, expect: Expected | None = None
    ) -> Closed:
        """Look the group up and call ``decide`` with its row (or ``None``) and its
        tombstone; ``decide`` raises to refuse (nothing written) or returns the
        disposition to close with, or ``None`` for nothing to write. Then
        :meth:`close_retire`. Returns ``(row, recorded, retired)``; a store may do it in
        one transaction.

        ``expect`` is what the caller expects ``decide`` to answer for the group recorded
        open: a store may write first, in the same transaction as its read, when the row
        it reads is open with the expected shape (then ``decide`` answers ``expect.target``
        on it), and otherwise write nothing and answer from ``decide``."""
        record, tombstone = await self.lookup(group_key)
        return await self._close_as_decided(group_key, record, decide(record, tombstone))

    async def _close_as_decided(
        self, group_key: str, record: GroupRow | None, target: str | None
    ) -> Closed:
        """The close ``decide`` chose: none when the group is not recorded or it chose none."""
        if record is None or target is None:
            return record, False, False
        return (record, *await self.close_retire(group_key, target))

    async def close_retire(self, group_key: str, effective: str) -> tuple[bool, bool]:
        """:meth:`close`, then :meth:`retire` when every child has settled; a store may
        do both in one transaction (child rows locked first, then the group row).
        Returns ``(recorded, retired)``."""
        if not await self.close(group_key, effective):
            return False, False
        return True, await self.retire(group_key)

    @abstractmethod
    async def open_groups(self) -> list[OpenGroup]: ...

    @abstractmethod
    async def unfinished(self) -> list[ChildRow]:
        """Every unsettled child of a recorded group, with the group's disposition."""

    @abstractmethod
    async def next_due(self) -> float | None:
        """The earliest due time of an unsettled ``sleep`` child nobody holds."""

    @abstractmethod
    async def due_sleeps(self) -> list[ChildRow]:
        """Unsettled, unleased (or expired) ``sleep`` children whose due time passed."""

    @abstractmethod
    async def max_lease_expiry(self, owner: str) -> float | None:
        """The latest lease expiry ``owner`` holds, on a child or as the owner of an open
        group (restart tooling and tests)."""

    # -- the payload table (G-47): bytes by reference, deleted with the group ----------------

    @abstractmethod
    async def payload_put(
        self, group_key: str, name: str, replay_key: str, data: bytes, digest: str
    ) -> None:
        """Insert one payload row (its own committed transaction)."""

    @abstractmethod
    async def payload_get(self, group_key: str, name: str) -> bytes | None:
        """The bytes of payload ``name`` of ``group_key``, or ``None``."""

    @abstractmethod
    async def payload_delete_group(self, group_key: str) -> None:
        """Delete every payload row of ``group_key`` (idempotent). :meth:`retire` deletes
        them too, in the retirement transaction."""

    def payload_store(self) -> PayloadStore:
        """This database's payload table as a :class:`~effecthost.payloads.PayloadStore`
        (usable once the store is started)."""
        return TablePayloadStore(self)

    def commit_marker(self) -> int | None:
        """A value that changes whenever another connection commits to the database (read
        without waiting), or ``None`` when the store cannot tell (see :attr:`change_poll`)."""
        return None

    async def listen(self, callback: object) -> None:  # noqa: B027 - optional
        """Deliver cross-process wake-ups to ``callback(kind, group_key)``."""


TABLES = [
    """CREATE TABLE IF NOT EXISTS eh_groups (
        group_key   {text} PRIMARY KEY,
        wake        {text} NOT NULL,
        disposition {text} NOT NULL,
        effective   {text} NOT NULL,
        child_count {int} NOT NULL,
        counter     {big} NOT NULL DEFAULT 0,
        state       {text} NOT NULL DEFAULT 'open',
        created_at  {real} NOT NULL,
        closed_at   {real},
        owner         {text},
        owner_expires {real},
        watched       {bool} NOT NULL DEFAULT {false},
        trace_context {text}
    )""",
    """CREATE TABLE IF NOT EXISTS eh_children (
        replay_key       {text} PRIMARY KEY,
        group_key        {text} NOT NULL,
        position         {int} NOT NULL,
        kind             {text} NOT NULL,
        name             {text} NOT NULL,
        envelope         {text} NOT NULL,
        envelope_hash    {text} NOT NULL,
        state            {text} NOT NULL,
        lease_owner      {text},
        fence            {big} NOT NULL DEFAULT 0,
        lease_expires    {real},
        attempt          {int} NOT NULL DEFAULT 0,
        cancel_requested {bool} NOT NULL DEFAULT {false},
        due_at           {real},
        seq              {big},
        outcome          {text},
        settled_at       {real},
        UNIQUE (group_key, seq),
        UNIQUE (group_key, position)
    )""",
    """CREATE INDEX IF NOT EXISTS eh_children_unfinished
        ON eh_children (lease_expires) WHERE state <> 'settled'""",
    """CREATE INDEX IF NOT EXISTS eh_children_owner
        ON eh_children (lease_owner) WHERE state = 'claimed'""",
    """CREATE INDEX IF NOT EXISTS eh_children_timers
        ON eh_children (due_at) WHERE state <> 'settled' AND kind = 'sleep'""",
    """CREATE TABLE IF NOT EXISTS eh_retired (
        group_key  {text} PRIMARY KEY,
        effective  {text} NOT NULL,
        retired_at {real} NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS eh_payloads (
        group_key  {text} NOT NULL,
        name       {text} NOT NULL,
        replay_key {text} NOT NULL,
        data       {blob} NOT NULL,
        digest     {text} NOT NULL,
        created_at {real} NOT NULL,
        PRIMARY KEY (group_key, name)
    )""",
]
"""The tables of :data:`SCHEMA_VERSION`, one layout for both dialects; each names its
column types (:func:`tables`)."""


def tables(**types: str) -> list[str]:
    """:data:`TABLES` in one dialect's column types (``text``, ``int``, ``big``, ``real``,
    ``bool``, ``false``, ``blob``)."""
    return [statement.format(**types) for statement in TABLES]


GROUP_COLUMNS = (
    "group_key, wake, disposition, effective, child_count, counter, state, created_at, closed_at"
)
G_COLUMNS = ", ".join("g." + col for col in GROUP_COLUMNS.split(", "))
CHILD_COLUMNS = (
    "c.replay_key, c.group_key, c.position, c.kind, c.name, c.envelope, c.envelope_hash, "
    "c.state, c.lease_owner, c.fence, (c.lease_owner IS NULL OR c.lease_expires < {now}), "
    "c.attempt, c.cancel_requested, c.due_at, c.seq"
)
LOOKUP = (
    f"SELECT {G_COLUMNS}, r.effective FROM (SELECT CAST(? AS TEXT) AS k) q "
    "LEFT JOIN eh_groups g ON g.group_key = q.k "
    "LEFT JOIN eh_retired r ON r.group_key = q.k"
)
CHILDREN = f"SELECT {CHILD_COLUMNS} FROM eh_children c WHERE c.group_key = ? ORDER BY c.position"
GET_GROUP = f"SELECT {GROUP_COLUMNS} FROM eh_groups WHERE group_key = ?"
OWN = (
    "UPDATE eh_groups SET owner = ?, owner_expires = {now} + ?, "
    "trace_context = coalesce(?, trace_context) WHERE group_key = ? AND state = 'open'"
)
CREATE_GROUP = (
    "INSERT INTO eh_groups (group_key, wake, disposition, effective, child_count, created_at, "
    "owner, owner_expires, trace_context) VALUES (?, ?, ?, ?, ?, {now}, ?, "
    "CASE WHEN CAST(? AS TEXT) IS NOT NULL THEN {now} + ? END, ?) "
    f"ON CONFLICT (group_key) DO NOTHING RETURNING {GROUP_COLUMNS}"
)
_RANK = (
    f"SELECT {G_COLUMNS}, c.position, c.replay_key, {{outcome}} FROM eh_groups g "
    "LEFT JOIN eh_children c ON c.group_key = g.group_key AND c.seq = ? WHERE g.group_key = ?"
)
_RANKS = (
    f"SELECT {G_COLUMNS}, c.seq, c.position, c.replay_key, {{outcome}} FROM eh_groups g "
    "LEFT JOIN eh_children c ON c.group_key = g.group_key AND c.seq >= ? "
    "AND c.seq < ? WHERE g.group_key = ? ORDER BY c.seq"
)
"""Rank reads; ``{outcome}`` is how the dialect selects a child's outcome."""
_INSPECT_GROUP = (
    "SELECT group_key, {now} - created_at, wake, effective, counter, child_count, owner "
    "FROM eh_groups WHERE state = 'open'"
)


def group_row(row: Any) -> GroupRow:
    """A :class:`GroupRow` from the first nine columns of ``row`` (:data:`GROUP_COLUMNS`)."""
    return GroupRow(*row[:9])


def looked_up(row: Any) -> tuple[GroupRow | None, str | None]:
    """The group row, or its tombstone's disposition, from a row of :data:`LOOKUP`."""
    if row[0] is not None:
        return group_row(row), None
    return None, None if row[9] is None else str(row[9])


def child_row(row: Any) -> ChildRow:
    """A :class:`ChildRow` from :data:`CHILD_COLUMNS`, then, when selected, the group's
    disposition in force, state, owner, whether that owner's claim is live and its trace
    context."""
    extra = (row[15], row[16], row[17], bool(row[18]), row[19]) if len(row) > 15 else ()
    return ChildRow(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        bool(row[10]),
        row[11],
        bool(row[12]),
        row[13],
        row[14],
        *extra,
    )


class SqlStore(Store):
    """What both dialects do alike, written once: the SQL below is written with ``?``
    placeholders, ``{now}`` for the database clock and ``{outcome}`` for a child's outcome, and a dialect turns it into its own
    (:meth:`_prepare`) and runs it through its own connections (:meth:`_fetch`,
    :meth:`_fetchrow`, :meth:`_execute`, :meth:`_snapshot`). What truly differs (the
    transactions of writes that decide, notification or ``data_version`` polling) stays in
    each dialect."""

    @abstractmethod
    def _prepare(self, sql: str) -> str:
        """``sql`` in this dialect (placeholders, the clock), cached by the dialect."""

    @abstractmethod
    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        """The rows of a read."""

    @abstractmethod
    async def _fetchrow(self, sql: str, *args: Any) -> Any | None:
        """The first row of a read, or ``None``."""

    @abstractmethod
    async def _execute(self, sql: str, *args: Any) -> int:
        """One write statement in its own transaction; the number of rows it changed."""

    @abstractmethod
    async def _snapshot(self, *reads: tuple[str, tuple[Any, ...]]) -> list[list[Any]]:
        """The rows of several reads, from one snapshot where the dialect has one."""

    def _outcome(self, value: Any) -> str | bytes:
        """An outcome as read (a dialect may read it as bytes first)."""
        return value  # type: ignore[no-any-return]

    async def _fetchval(self, sql: str, *args: Any) -> Any:
        row = await self._fetchrow(sql, *args)
        return None if row is None else row[0]

    async def now(self) -> float:
        return float(await self._fetchval("SELECT {now}"))

    async def get_group(self, group_key: str) -> GroupRow | None:
        row = await self._fetchrow(GET_GROUP, group_key)
        return None if row is None else group_row(row)

    async def retired(self, group_key: str) -> str | None:
        value = await self._fetchval(
            "SELECT effective FROM eh_retired WHERE group_key = ?", group_key
        )
        return None if value is None else str(value)

    async def lookup(self, group_key: str) -> tuple[GroupRow | None, str | None]:
        return looked_up(await self._fetchrow(LOOKUP, group_key))

    async def children(self, group_key: str) -> list[ChildRow]:
        return [child_row(r) for r in await self._fetch(CHILDREN, group_key)]

    async def read_rank(self, group_key: str, seq: int) -> RankRead | None:
        row = await self._fetchrow(_RANK, seq, group_key)
        if row is None:
            return None
        outcome = None if row[11] is None else self._outcome(row[11])
        return RankRead(group_row(row), row[9], row[10], outcome)

    async def read_ranks(
        self, group_key: str, seq: int, limit: int, local: Collection[str] | None = None
    ) -> tuple[GroupRow, list[tuple[int, int, str, str | bytes]]] | None:
        rows = await self._fetch(_RANKS, seq, seq + limit, group_key)
        if not rows:
            return None
        found = [
            (int(r[9]), r[10], r[11], self._outcome(r[12]))
            for r in rows
            if r[9] is not None and r[12] is not None
        ]
        return group_row(rows[0]), found

    async def settlement_order(self, group_key: str) -> list[int]:
        rows = await self._fetch(
            "SELECT position FROM eh_children WHERE group_key = ? AND seq IS NOT NULL ORDER BY seq",
            group_key,
        )
        return [int(r[0]) for r in rows]

    async def open_groups(self) -> list[OpenGroup]:
        rows = await self._fetch(
            "SELECT group_key, {now} - created_at, child_count, counter, wake, effective "
            "FROM eh_groups WHERE state = 'open' ORDER BY group_key"
        )
        return [OpenGroup(*r) for r in rows]

    async def inspect_groups(self) -> list[InspectedGroup]:
        """Open groups as ``effecthost inspect`` lists them (a read)."""
        rows = await self._fetch(f"{_INSPECT_GROUP} ORDER BY group_key")
        return [InspectedGroup(*r) for r in rows]

    async def inspect_group(
        self, group_key: str
    ) -> tuple[InspectedGroup, list[InspectedChild]] | None:
        """An open group and its children (one snapshot where the dialect has one);
        ``None`` when no such group is open."""
        groups, children = await self._snapshot(
            (f"{_INSPECT_GROUP} AND group_key = ?", (group_key,)),
            (
                "SELECT seq, position, replay_key, name, state, outcome, settled_at "
                "FROM eh_children WHERE group_key = ? ORDER BY position",
                (group_key,),
            ),
        )
        if not groups:
            return None
        return InspectedGroup(*groups[0]), [inspected_child(*r) for r in children]

    async def unfinished(self) -> list[ChildRow]:
        rows = await self._fetch(
            f"SELECT {CHILD_COLUMNS}, g.effective, g.state, g.owner, "
            "(g.state = 'open' AND g.owner_expires >= {now}), g.trace_context "
            "FROM eh_children c "
            "JOIN eh_groups g ON g.group_key = c.group_key "
            "WHERE c.state <> 'settled' ORDER BY c.group_key, c.position"
        )
        return [child_row(r) for r in rows]

    async def next_due(self) -> float | None:
        value = await self._fetchval(
            "SELECT min(due_at) FROM eh_children WHERE state <> 'settled' AND kind = 'sleep' "
            "AND (lease_owner IS NULL OR lease_expires < {now})"
        )
        return None if value is None else float(value)

    async def due_sleeps(self) -> list[ChildRow]:
        rows = await self._fetch(
            f"SELECT {CHILD_COLUMNS} FROM eh_children c WHERE c.state <> 'settled' "
            "AND c.kind = 'sleep' AND c.due_at <= {now} "
            "AND (c.lease_owner IS NULL OR c.lease_expires < {now}) ORDER BY c.due_at"
        )
        return [child_row(r) for r in rows]

    async def max_lease_expiry(self, owner: str) -> float | None:
        value = await self._fetchval(
            "SELECT max(x) FROM (SELECT max(lease_expires) AS x FROM eh_children "
            "WHERE lease_owner = ? AND state = 'claimed' UNION ALL "
            "SELECT max(owner_expires) FROM eh_groups WHERE owner = ? AND state = 'open') m",
            owner,
            owner,
        )
        return None if value is None else float(value)

    async def own(
        self, group_key: str, owner: str, ttl: float, trace_context: str | None = None
    ) -> bool:
        return await self._execute(OWN, owner, ttl, trace_context, group_key) == 1

    async def release(self, owner: str, replay_key: str, fence: int) -> None:
        await self._execute(
            "UPDATE eh_children SET lease_owner = NULL, lease_expires = NULL, "
            "state = 'pending' WHERE replay_key = ? AND lease_owner = ? AND fence = ? "
            "AND state = 'claimed'",
            replay_key,
            owner,
            fence,
        )

    async def records_sealed(self) -> bool:
        """Whether any recorded outcome is sealed (a drain without the payload settings
        must not add plaintext to such a database)."""
        from ._preflight import SEALED_LIKE, sealed_outcomes  # it imports this module

        rows = await self._fetch(
            "SELECT outcome FROM eh_children WHERE outcome LIKE ? LIMIT 20", SEALED_LIKE
        )
        return sealed_outcomes([r[0] for r in rows])

    @abstractmethod
    async def recorded_sealing(self) -> bool | None:
        """Whether this deployment is sealed, as recorded in ``eh_sealing``; ``None`` in
        a database of an earlier release (no record yet)."""

    async def deployment_sealed(self) -> bool:
        """Whether this deployment is sealed: as recorded, or, in a database of an
        earlier release, whether it holds a sealed outcome."""
        recorded = await self.recorded_sealing()
        return await self.records_sealed() if recorded is None else recorded

    async def payload_put(
        self, group_key: str, name: str, replay_key: str, data: bytes, digest: str
    ) -> None:
        await self._execute(
            "INSERT INTO eh_payloads (group_key, name, replay_key, data, digest, created_at) "
            "VALUES (?, ?, ?, ?, ?, {now})",
            group_key,
            name,
            replay_key,
            data,
            digest,
        )

    async def payload_get(self, group_key: str, name: str) -> bytes | None:
        value = await self._fetchval(
            "SELECT data FROM eh_payloads WHERE group_key = ? AND name = ?", group_key, name
        )
        return None if value is None else bytes(value)

    async def payload_delete_group(self, group_key: str) -> None:
        await self._execute("DELETE FROM eh_payloads WHERE group_key = ?", group_key)


class TablePayloadStore(PayloadStore):
    """The ``eh_payloads`` table of a SQL store as a payload store: one row per payload
    (group key, name, replay key, bytes, sha256 digest), in the same database as the rank
    records, deleted by the group's retirement transaction. It stores what it is given (an
    envelope when the policy seals), never interprets it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def put(self, group_key: str, replay_key: str, data: bytes) -> PayloadRef:
        ref = _make_ref(group_key, replay_key, bytes(data))
        await self.store.payload_put(group_key, ref.name, replay_key, bytes(data), ref.digest)
        return ref

    async def get(self, ref: PayloadRef) -> bytes:
        """Raises:
        PayloadMissing: no row under ``ref`` (the group retired, or never written), or
            not the bytes it names.
        """
        data = await self.store.payload_get(ref.group_key, ref.name)
        if data is None:
            raise _missing(ref, "is not in the payload table")
        return _check(ref, data)

    async def delete_group(self, group_key: str) -> None:
        await self.store.payload_delete_group(group_key)
