"""What ``effecthost inspect`` shows, one row model for every tier.

Each tier reads its own records read-only and returns :class:`GroupRow` and
:class:`ChildRow`; rendering (a table or JSON) is shared, so the columns are the same on
SQLite, PostgreSQL, Restate and Temporal. A field a tier does not record is ``None`` and
shows as ``-``.
"""

from __future__ import annotations

import json
import math
import re
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
    replay_key: str | None
    tool: str | None
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


def settled_child(
    rank: int,
    position: int,
    replay_key: str | None,
    tool: str | None,
    recorded: Any,
    settled_at: float | None = None,
    started_at: float | None = None,
) -> ChildRow:
    """The row of a ranked child from its recorded outcome (see :func:`outcome_status`)."""
    status, sealed = outcome_status(recorded)
    return ChildRow(rank, position, replay_key, tool, status, settled_at, sealed, started_at)


def running_child(
    position: int, replay_key: str | None, tool: str | None, started_at: float | None = None
) -> ChildRow:
    """The row of a child that holds no rank yet."""
    return ChildRow(None, position, replay_key, tool, RUNNING, None, None, started_at)


def open_group(
    key: str,
    opened_at: float | None,
    wake: str | None = None,
    disposition: str | None = None,
    settled: int | None = None,
    total: int | None = None,
    owner: str | None = None,
) -> GroupRow:
    """The row of an open group, its age counted from ``opened_at`` (epoch seconds)."""
    return GroupRow(key, age(opened_at), wake, disposition, settled, total, owner, opened_at)


def in_rank_order(children: Sequence[ChildRow]) -> list[ChildRow]:
    """Ranked children by rank, then the running ones by position (a rank or position
    that is not an integer, as a tampered store may hold, sorts last)."""

    def order(c: ChildRow) -> tuple[bool, bool, int, int]:
        rank, position = c.rank, c.position
        odd = not (rank is None or _integer(rank)) or not _integer(position)
        return (
            odd,
            rank is None,
            rank if isinstance(rank, int) and _integer(rank) else 0,
            position if _integer(position) else 0,
        )

    return sorted(children, key=order)


def _integer(value: Any) -> bool:
    return type(value) is int


UNREADABLE = "<unreadable>"
"""The cell of a stored value that cannot be shown as its column's type (a time of
``inf`` or text, a position that is not an integer): inspection shows the rest."""

# C0, DEL, C1, and the bidirectional controls that reorder what a terminal shows
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def safe_text(value: Any) -> str:
    """``value`` as text a terminal shows as it is: every control character (C0, C1,
    ESC, DEL, line separators, bidirectional overrides) written as ``\\xNN`` or
    ``\\uNNNN``. Every value read from a store or an engine goes through it before a
    human-readable line is printed (``--json`` prints values as they are, escaped by
    JSON)."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shorten(value: Any, limit: int = 200) -> str:
    """:func:`safe_text`, cut to ``limit`` characters with how long it was."""
    text = safe_text(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return safe_text(value)


def _count(value: Any) -> str:
    if value is None:
        return "-"
    return str(value) if _integer(value) else UNREADABLE


def _when(epoch: Any) -> str:
    if epoch is None:
        return "-"
    try:
        return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    except (TypeError, ValueError, OverflowError, OSError):
        return UNREADABLE


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        if math.isfinite(seconds) and abs(seconds) < 1e15:
            return f"{seconds:.0f}s"
    return UNREADABLE


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
            _cell(g.key),
            _age(g.age_seconds),
            _cell(g.wake),
            _cell(g.disposition),
            f"{_count(g.settled)}/{_count(g.total)}",
            _cell(g.owner),
        )
        for g in groups
    ]
    return _table(header, rows)


def ranks_table(children: Sequence[ChildRow]) -> str:
    header = ("RANK", "POSITION", "REPLAY KEY", "TOOL", "STATUS", "SETTLED AT", "SEALED")
    rows = [
        (
            _count(c.rank),
            _count(c.position),
            _cell(c.replay_key),
            _cell(c.tool),
            _cell(c.status),
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
