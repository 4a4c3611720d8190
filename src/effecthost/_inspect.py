"""What ``effecthost inspect`` shows, one row model for every tier.

Each tier reads its own records read-only and returns :class:`GroupRow` and
:class:`ChildRow`; rendering (a table or JSON) is shared, so the columns are the same on
SQLite, PostgreSQL, Restate and Temporal. A field a tier does not record is ``None`` and
shows as ``-``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

RUNNING = "running"
"""Status of a child without a rank."""

HIDDEN = "settled"
"""Status of a settled child whose outcome is sealed or stored by reference: inspection
reads no keys and no payload store, so it knows only that the child settled."""


class UnknownGroupKey(Exception):
    """``--group KEY`` names no open group of the tier."""

    def __init__(self, group_key: str) -> None:
        super().__init__(group_key)
        self.group_key = group_key


class TierUnreachable(Exception):
    """The engine or database did not answer (its message names no secret)."""


@dataclass(frozen=True)
class GroupRow:
    """An open group."""

    key: str
    age_seconds: float | None
    wake: str | None
    disposition: str | None
    settled: int | None
    total: int | None
    owner: str | None
    opened_at: float | None = None
    """Epoch seconds the group was opened, where the tier tells (the timeline's origin)."""


@dataclass(frozen=True)
class ChildRow:
    """One child of a group: its rank once settled, in rank order then position order."""

    rank: int | None
    position: int
    replay_key: str
    tool: str
    status: str
    settled_at: float | None
    sealed: bool | None
    started_at: float | None = None
    """Epoch seconds the child began, where the tier records it (SQL does not: its
    children are recorded at the group's open)."""


def outcome_status(recorded: Any) -> tuple[str, bool | None]:
    """The status and whether sealed of a recorded outcome: a plain outcome document or
    a stored outcome (``form`` inline, sealed or ref), as a document or its JSON text."""
    if isinstance(recorded, (str, bytes)):
        try:
            recorded = json.loads(recorded)
        except ValueError:
            return HIDDEN, None
    if not isinstance(recorded, dict):
        return HIDDEN, None
    form = recorded.get("form")
    if form == "inline" and isinstance(recorded.get("outcome"), dict):
        return str(recorded["outcome"].get("status", HIDDEN)), False
    if form in ("sealed", "ref"):
        return HIDDEN, bool(recorded.get("sealed"))
    if "status" in recorded:
        return str(recorded["status"]), False
    return HIDDEN, None


def in_rank_order(children: Sequence[ChildRow]) -> list[ChildRow]:
    """Ranked children by rank, then the running ones by position."""
    return sorted(children, key=lambda c: (c.rank is None, c.rank or 0, c.position))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def groups_table(groups: Sequence[GroupRow]) -> str:
    header = ("KEY", "AGE", "WAKE", "DISPOSITION", "SETTLED", "OWNER")
    rows = [
        (
            g.key,
            "-" if g.age_seconds is None else f"{g.age_seconds:.0f}s",
            _cell(g.wake),
            _cell(g.disposition),
            f"{_cell(g.settled)}/{_cell(g.total)}",
            _cell(g.owner),
        )
        for g in groups
    ]
    return _table(header, rows)


def ranks_table(children: Sequence[ChildRow]) -> str:
    header = ("RANK", "POSITION", "REPLAY KEY", "TOOL", "STATUS", "SETTLED AT", "SEALED")
    rows = [
        (
            _cell(c.rank),
            str(c.position),
            c.replay_key,
            c.tool,
            c.status,
            _when(c.settled_at),
            _cell(c.sealed),
        )
        for c in children
    ]
    return _table(header, rows)


def groups_json(groups: Sequence[GroupRow]) -> str:
    return json.dumps({"groups": [asdict(g) for g in groups]}, indent=2)


def group_json(group: GroupRow, children: Sequence[ChildRow]) -> str:
    return json.dumps({"group": asdict(group), "children": [asdict(c) for c in children]}, indent=2)


def age(created_at: float | None, now: float | None = None) -> float | None:
    """Seconds since ``created_at`` (epoch seconds), never negative."""
    if created_at is None:
        return None
    return max(0.0, (time.time() if now is None else now) - created_at)
