"""One JSON document per group: the kit's rules on the stored form of a key-value engine.

An engine that stores one value per key (a Redis string, a file, a document database's
document, an etcd or DynamoDB item) can hold a whole group in one JSON document and make
every read-modify-write of it one atomic step (a transaction, a compare-and-set, a lock).
:class:`GroupDocument` is that document and the kit's rules applied to it: the rank rule
(:class:`~effecthost.contract.kit.RankLedger`), the retire rule
(:func:`~effecthost.contract.kit.retires`), R-13's :func:`~effecthost.contract.kit.decided`
and the drain's decisions (:func:`~effecthost.contract.kit.drain_group`,
:func:`~effecthost.contract.kit.drain_children`). It does no I/O: the host reads the
document, calls these methods inside its atomic step and writes :attr:`GroupDocument.data`
back, deleting the replay-key claims in :attr:`GroupDocument.freed` in the same step.

The document (``data``, JSON-serialisable)::

    {"key", "wake", "declared", "effective", "owner", "closed",
     "children": [{"replay_key", "hash", "envelope", "due", "attempt", "runner", "outcome"}],
     "ranks": [position of rank 1, position of rank 2, ...]}

A retired group keeps ``children`` and ``ranks`` empty: the tombstone (R-4).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from ._kinds import sleep_seconds
from ._types import EffectGroup, EffectKind, LoserPolicy, Outcome, Settlement
from .kit import (
    DrainTally,
    GroupRecord,
    RankLedger,
    RecordedChild,
    Tombstone,
    decided,
    drain_children,
    drain_group,
    retires,
)

__all__ = ["GroupDocument"]


class GroupDocument:
    """A group as one JSON document (:attr:`data`) and the kit's rules on it.

    Attributes:
        data: the document, as read from and written to the engine.
        freed: the replay keys a retire by this object freed (R-11): the host deletes
            their claims in the same atomic step as it writes :attr:`data`.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.freed: list[str] = []

    @classmethod
    def new(cls, group: EffectGroup, owner: str, now: float) -> GroupDocument:
        """The document of a first open, owned by ``owner``; each ``sleep`` child's due
        time is ``now`` (epoch seconds) plus its duration, recorded once (G-51)."""
        children = [
            {
                "replay_key": child.replay_key,
                "hash": child.envelope_hash(),
                "envelope": child.model_dump(mode="json"),
                "due": now + sleep_seconds(child) if child.kind == EffectKind.SLEEP else None,
                "attempt": 0,
                "runner": None,
                "outcome": None,
            }
            for child in group.children
        ]
        loser = group.disposition.value
        return cls(
            {
                "key": group.key,
                "wake": group.wake.value,
                "declared": loser,
                "effective": loser,
                "owner": owner,
                "closed": False,
                "children": children,
                "ranks": [],
            }
        )

    @property
    def key(self) -> str:
        return str(self.data["key"])

    @property
    def children(self) -> list[dict[str, Any]]:
        return self.data["children"]  # type: ignore[no-any-return]

    @property
    def ranks(self) -> list[int]:
        """Positions in rank order (``settlement_order``, G-22)."""
        return list(self.data["ranks"])

    def known(self) -> GroupRecord | Tombstone:
        """What the kit's fences read (``find_group``): the shape, or a tombstone."""
        if not self.children:
            return Tombstone(self.key)
        fields = ("key", "wake", "declared", "effective", "closed")
        return GroupRecord(child_count=len(self.children), **{f: self.data[f] for f in fields})

    def recorded_children(self) -> list[RecordedChild]:
        """The children for the reopen fence (G-02)."""
        return [RecordedChild(p, c["replay_key"], c["hash"]) for p, c in enumerate(self.children)]

    def settlement(self, rank: int) -> Settlement | None:
        """Rank ``rank``, or ``None`` while it does not exist; ranks are dense, so rank n
        is entry n of ``ranks`` (G-16)."""
        if not 0 < rank <= len(self.data["ranks"]):
            return None
        position = self.data["ranks"][rank - 1]
        child = self.children[position]
        outcome = Outcome.model_validate(child["outcome"])
        return Settlement(
            rank=rank, position=position, replay_key=child["replay_key"], outcome=outcome
        )

    def unsettled(self) -> list[tuple[int, dict[str, Any]]]:
        """``(position, envelope)`` of each child without a rank; empty once retired."""
        return [(p, c["envelope"]) for p, c in enumerate(self.children) if c["outcome"] is None]

    def decided(self) -> bool:
        """R-13 (:func:`~effecthost.contract.kit.decided`) on an open group."""
        shape = self.known()
        ranked = (self.children[p]["outcome"]["status"] for p in self.data["ranks"])
        return isinstance(shape, GroupRecord) and not shape.closed and decided(shape, ranked)

    def settle(self, position: int, attempt: int | None, outcome: Outcome) -> bool:
        """The rank rule: refused (``False``, nothing changes) for a retired group, a
        stale ``attempt`` (not ``None`` and not the child's current one) or a position
        that already holds a rank; otherwise the child takes rank ``count + 1`` with
        ``outcome`` (G-15, G-17, G-35), and the group retires if that was the last
        rank of a closed group (G-36)."""
        if not self.children:
            return False
        child = self.children[position]
        ledger = RankLedger(len(self.children), self.data["ranks"])
        if attempt not in (None, child["attempt"]) or ledger.settle(position) is None:
            return False
        child["outcome"], self.data["ranks"] = outcome.model_dump(mode="json"), ledger.order
        self._retire_if_done()
        return True

    def close(self, disposition: LoserPolicy) -> None:
        """Record the close with ``disposition`` in force (the kit already narrowed it),
        and retire the group if every child holds a rank (G-36)."""
        self.data.update(effective=LoserPolicy(disposition).value, closed=True)
        self._retire_if_done()

    def _retire_if_done(self) -> None:
        """The retire rule, in the step of the write that made it true: a closed group
        whose every child ranked keeps only its tombstone (R-4), its replay keys freed."""
        children = self.children
        if children and retires(self.data["closed"], len(children), len(self.data["ranks"])):
            self.freed.extend(c["replay_key"] for c in children)
            self.data.update(children=[], ranks=[])

    def begin_attempt(self, position: int, runner: str) -> int:
        """Record that ``runner`` (an incarnation) starts child ``position`` again: its
        next attempt number, which fences off the settlement of any earlier run."""
        child = self.children[position]
        child.update(attempt=child["attempt"] + 1, runner=runner)
        return int(child["attempt"])

    def incarnations(self) -> set[str]:
        """The owner and every child's runner: whose liveness the host looks up."""
        runners = (c.get("runner") for c in self.children)
        return {self.data["owner"], *(r for r in runners if r is not None)}

    def runs(
        self, position: int, me: str, alive: Container[str], running: Callable[[int], bool]
    ) -> bool:
        """Whether a live incarnation runs the child: ``me`` when ``running(position)``
        (its task runs in this process), another while it is in ``alive`` (R-1: a reopen
        or a drain never starts a live incarnation's child again)."""
        runner = self.children[position].get("runner")
        if runner in (None, me):
            return running(position)
        return runner in alive

    def idle_positions(
        self, me: str, alive: Container[str], running: Callable[[int], bool]
    ) -> list[int]:
        """The unsettled children no live incarnation runs: what a reopen starts."""
        return [p for p, _ in self.unsettled() if not self.runs(p, me, alive, running)]

    def drain(
        self,
        me: str,
        alive: Container[str],
        running: Callable[[int], bool],
        *,
        wired: bool,
        start: Callable[[int], bool],
        tally: DrainTally,
    ) -> bool:
        """The drain's decisions on this group for incarnation ``me``
        (:func:`~effecthost.contract.kit.drain_group`, then
        :func:`~effecthost.contract.kit.drain_children`): ``start(position)`` starts a
        child (``False`` for a resolver miss), a cancel settles it ``cancelled``. Returns
        whether the document changed (the host then writes it)."""
        owner = self.data["owner"]
        mine = owner == me

        def runs(position: int) -> bool:
            return self.runs(position, me, alive, running)

        if not self.children or not drain_group(
            mine=mine, owner_alive=owner in alive, decided=self.decided()
        ):
            return False
        children = [
            (c["replay_key"], c["envelope"]["kind"], c["outcome"] is not None, runs(p))
            for p, c in enumerate(self.children)
        ]
        return drain_children(
            self.key,
            children,
            mine=mine,
            in_force=self.data["effective"],
            wired=wired,
            start=start,
            cancel=lambda p: self.settle(p, None, Outcome.cancelled()),
            tally=tally,
        )
