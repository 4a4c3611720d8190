"""A group's timeline as a self-contained HTML page (``effecthost inspect --html``), and
the loopback-only viewer serving it for every open group (``effecthost ui``).

The page is drawn from the rows ``inspect`` reads (:mod:`effecthost._inspect`): one lane
per child from its start to its settlement, the rank on each settlement mark, the rank
that decides the group's wake policy highlighted. It loads nothing (inline CSS and SVG,
no script), so it opens from a file, a mail attachment or an air-gapped machine alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import math
import re
import socket
import socketserver
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote, unquote

from effecthost._inspect import (
    HIDDEN,
    ChildRow,
    GroupRow,
    TierUnreachable,
    UnknownGroupKey,
    _age,
    safe_text,
    shorten,
)

PAGE_PREFIX = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>effecthost · group '
)
"""How every timeline page begins: ``inspect --html`` replaces only a file that does."""

WAKES = {
    "first": "first — race (the first settlement decides)",
    "first_success": "first_success — any (the first success decides)",
    "all": "all — all / allSettled (every child, or all's first rejection)",
}

_COMBINATOR = {"first": "race", "first_success": "any", "all": "all"}

LABEL_W = 380
PLOT_W = 620
RIGHT_W = 90
LANE_H = 40
AXIS_H = 46
MARK_R = 11


def deciding_rank(wake: str | None, children: Sequence[ChildRow], total: int | None) -> int | None:
    """The rank the group's combinator returns on, once it is known.

    ``first`` (race): rank 1. ``first_success`` (any): the first success, or the last
    rank when every child failed (the aggregate error). ``all``: the first rejection in
    rank order (``all`` stops there; ``allSettled`` reads on), else the last rank. A
    status inspection cannot read (sealed, by reference) leaves it unknown.
    """
    ranked = sorted((c for c in children if c.rank is not None), key=lambda c: c.rank or 0)
    complete = total is not None and len(ranked) >= total
    if wake == "first":
        return ranked[0].rank if ranked else None
    if wake not in ("first_success", "all"):
        return None
    for child in ranked:
        if child.status == HIDDEN:
            return None
        if (child.status == "success") == (wake == "first_success"):
            return child.rank
    return ranked[-1].rank if ranked and complete else None


@dataclass(frozen=True)
class _Lane:
    child: ChildRow
    start: float
    end: float
    start_known: bool
    end_known: bool


_EPOCH_LIMIT = 1e11  # about the year 5138: beyond it a recorded time is not a time


def _time(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and abs(value) < _EPOCH_LIMIT:
            return float(value)
    return None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _text(value: Any) -> str:
    return safe_text(value)


def drawable(group: GroupRow, children: Sequence[ChildRow]) -> tuple[GroupRow, list[ChildRow]]:
    """The rows with every value a tampered store may hold in a form the page can draw:
    a time that is not a finite epoch, a count or rank that is not an integer becomes
    "not recorded"; a position that is not an integer becomes the row's index."""
    group = dataclasses.replace(
        group,
        key=_text(group.key),
        age_seconds=_time(group.age_seconds),
        wake=None if group.wake is None else _text(group.wake),
        disposition=None if group.disposition is None else _text(group.disposition),
        settled=_int(group.settled),
        total=_int(group.total),
        owner=None if group.owner is None else _text(group.owner),
        opened_at=_time(group.opened_at),
    )
    positions = [c.position for c in children if type(c.position) is int]
    fixed = []
    for index, c in enumerate(children):
        position = c.position if type(c.position) is int else max(positions, default=0) + 1 + index
        fixed.append(
            dataclasses.replace(
                c,
                rank=_int(c.rank),
                position=position,
                replay_key=_text(c.replay_key),
                tool=_text(c.tool),
                status=_text(c.status),
                settled_at=_time(c.settled_at),
                started_at=_time(c.started_at),
            )
        )
    return group, fixed


def _lanes(
    group: GroupRow, children: Sequence[ChildRow], now: float
) -> tuple[list[_Lane], float, float, bool]:
    """Lanes in position order, the axis bounds, and whether the axis is to scale.

    A child whose start the tier does not record starts at the group's open; a rank
    whose settlement time is not recorded is placed between its recorded neighbours, so
    marks stay in rank order.
    """
    known = [t for c in children for t in (c.started_at, c.settled_at) if t is not None]
    opened = group.opened_at if group.opened_at is not None else min(known, default=None)
    to_scale = opened is not None
    ranked = sorted((c for c in children if c.rank is not None), key=lambda c: c.rank or 0)
    running = any(c.rank is None for c in children)
    if not to_scale:
        opened = 0.0
        settles: dict[int, float] = {c.position: float(i + 1) for i, c in enumerate(ranked)}
        end = float(len(ranked) + (1 if running or not ranked else 0))
    else:
        assert opened is not None
        settles = {}
        latest = max(known, default=opened)
        end = max(now, latest) if running else latest
        i = 0
        while i < len(ranked):
            if ranked[i].settled_at is not None:
                settles[ranked[i].position] = ranked[i].settled_at or 0.0
                i += 1
                continue
            j = i
            while j < len(ranked) and ranked[j].settled_at is None:
                j += 1
            before = settles[ranked[i - 1].position] if i else opened
            after = ranked[j].settled_at if j < len(ranked) else end
            assert after is not None
            for k in range(i, j):
                settles[ranked[k].position] = before + (after - before) * (k - i + 1) / (j - i + 1)
            i = j
        end = max([end, *settles.values()])
    start_axis = min([opened, *(c.started_at for c in children if c.started_at is not None)])
    lanes = []
    for child in sorted(children, key=lambda c: c.position):
        start = child.started_at if child.started_at is not None and to_scale else opened
        stop = settles.get(child.position, end)
        lanes.append(
            _Lane(
                child,
                min(start, stop),
                stop,
                child.started_at is not None,
                child.settled_at is not None or child.rank is None,
            )
        )
    if end - start_axis <= 0:
        end = start_axis + 1e-3
    return lanes, start_axis, end, to_scale


def _offset(seconds: float) -> str:
    if seconds < 1:
        return f"+{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"+{seconds:.3g} s"
    return f"+{seconds // 60:.0f} min {seconds % 60:.0f} s"


def _ticks(span: float) -> list[float]:
    raw = span / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(span / step) + 1)]


def _utc(epoch: float | None) -> str:
    if epoch is None:
        return "not recorded"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_CSS = """
:root { color-scheme: light; --ink: #1d2430; --muted: #5b6575; --line: #d5dae2;
  --ok: #2f7d5b; --err: #c0501f; --cancel: #b3261e; --run: #2458c6; --hidden: #7a8494;
  --decide: #f2b705; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
  margin: 24px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 8px; } h1 code { font-size: 18px; }
nav { margin-bottom: 12px; } a { color: var(--run); }
.facts { display: flex; flex-wrap: wrap; gap: 4px 22px; margin: 0 0 10px; padding: 0; }
.facts div { display: flex; gap: 6px; } .facts dt { color: var(--muted); } .facts dd { margin: 0; }
.verdict { margin: 6px 0 14px; font-weight: 600; }
svg.timeline { display: block; max-width: 100%; height: auto; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; fill: var(--ink); }
.stripe { fill: #f5f7fa; } .grid { stroke: var(--line); stroke-width: 1; }
.tick { font-size: 11px; fill: var(--muted); } .edge { stroke: #8a93a3; stroke-dasharray: 4 3; }
.edge-label { font-size: 11px; fill: var(--muted); }
.name { font-size: 13px; font-weight: 600; } .sub { font-size: 11.5px; fill: var(--muted); }
.bar { stroke-width: 0; } .bar.success { fill: #8fc9ad; } .bar.error { fill: #efb08f; }
.bar.settled { fill: #c3c9d3; } .bar.cancelled { fill: url(#hatch); stroke: var(--cancel);
  stroke-width: 1; } .bar.running { fill: url(#fade); stroke: var(--run); stroke-width: 1.5;
  stroke-dasharray: 6 3; }
.mark { fill: #fff; stroke: var(--ink); stroke-width: 1.5; }
.mark.success { stroke: var(--ok); } .mark.error { stroke: var(--err); }
.mark.cancelled { stroke: var(--cancel); stroke-width: 2.5; }
.mark.deciding { fill: var(--decide); stroke: #6b4e00; stroke-width: 3; }
.rank { font-size: 12px; font-weight: 700; text-anchor: middle; dominant-baseline: central; }
.note { font-size: 11.5px; font-weight: 700; } .note.cancel { fill: var(--cancel); }
.note.decide { fill: #6b4e00; } .note.running { fill: var(--run); }
.legend { margin-top: 16px; padding: 10px 14px; border: 1px solid var(--line);
  border-radius: 6px; max-width: 1060px; }
.legend h2 { font-size: 14px; margin: 0 0 6px; } .legend ul { margin: 0; padding: 0;
  list-style: none; display: grid; gap: 4px; } .legend li { display: flex; gap: 8px;
  align-items: center; } .legend p { margin: 6px 0 0; color: var(--muted); }
table.groups { border-collapse: collapse; } table.groups th, table.groups td {
  text-align: left; padding: 4px 12px; border-bottom: 1px solid var(--line); }
"""

_DEFS = (
    "<defs>"
    '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f3d3d1"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#b3261e" stroke-width="2"/></pattern>'
    '<linearGradient id="fade"><stop offset="0" stop-color="#9db8ee"/>'
    '<stop offset="1" stop-color="#9db8ee" stop-opacity="0.15"/></linearGradient>'
    "</defs>"
)


def _swatch(body: str) -> str:
    return f'<svg width="46" height="22" viewBox="0 0 46 22" aria-hidden="true">{_DEFS}{body}</svg>'


def _lane_svg(lane: _Lane, index: int, x: Callable[[float], float], decide: int | None) -> str:
    child = lane.child
    top = AXIS_H + index * LANE_H
    mid = top + LANE_H / 2
    status = child.status if child.status in ("success", "error", "cancelled") else "settled"
    if child.rank is None:
        status = "running"
    x0, x1 = x(lane.start), x(lane.end)
    tip = (
        f"position {child.position} · {child.tool} · {child.replay_key} · {child.status}"
        f" · started {_utc(child.started_at)} · settled {_utc(child.settled_at)}"
    )
    parts = [
        f'<g class="lane" data-position="{child.position}" data-status="{escape(child.status)}"'
        f' data-rank="{"" if child.rank is None else child.rank}">',
        f"<title>{escape(tip)}</title>",
    ]
    if index % 2 == 0:
        parts.append(
            f'<rect class="stripe" x="0" y="{top}" width="{LABEL_W + PLOT_W + RIGHT_W}"'
            f' height="{LANE_H}"/>'
        )
    parts.append(
        f'<text class="name" x="10" y="{top + 16}">#{child.position} '
        f"{escape(_short(child.tool or '-', 34))}</text>"
        f'<text class="sub" x="10" y="{top + 32}">{escape(_short(child.replay_key or "-", 40))}'
        f" · {escape(child.status)}</text>"
    )
    parts.append(
        f'<rect class="bar {status}" x="{x0:.1f}" y="{mid - 6:.1f}" '
        f'width="{max(x1 - x0, 2):.1f}" height="12" rx="2"/>'
    )
    if child.rank is None:
        parts.append(
            f'<path class="open-end" d="M{x1:.1f},{mid - 8:.1f} l9,8 l-9,8 z" fill="#2458c6"/>'
            f'<text class="note running" x="{x1 + 13:.1f}" y="{mid + 4:.1f}">running</text>'
        )
    else:
        deciding = child.rank == decide
        radius = MARK_R + (3 if deciding else 0)
        classes = f"mark {status}{' deciding' if deciding else ''}"
        parts.append(
            f'<circle class="{classes}" cx="{x1:.1f}" cy="{mid:.1f}" r="{radius}"/>'
            f'<text class="rank" x="{x1:.1f}" y="{mid:.1f}">{child.rank}</text>'
        )
        notes = []
        if status == "cancelled":
            notes.append(("cancel", "✕ cancelled"))
        if deciding:
            notes.append(("decide", "◆ decides"))
        at = x1 + radius + 5
        for kind, text in notes:
            parts.append(f'<text class="note {kind}" x="{at:.1f}" y="{mid + 4:.1f}">{text}</text>')
            at += 82
    parts.append("</g>")
    return "".join(parts)


def render_timeline(
    group: GroupRow,
    children: Sequence[ChildRow],
    *,
    now: float | None = None,
    refresh: int | None = None,
    index: str | None = None,
) -> str:
    """The page for ``group``: a header of its facts, the lanes, and a legend saying
    what each mark means and which times the tier did not record."""
    now = time.time() if now is None else now
    group, children = drawable(group, children)
    lanes, t0, t1, to_scale = _lanes(group, children, now)
    decide = deciding_rank(group.wake, children, group.total)
    span = t1 - t0

    def x(t: float) -> float:
        return LABEL_W + (t - t0) / span * (PLOT_W - 20) + 10

    height = AXIS_H + LANE_H * max(len(lanes), 1) + 10
    width = LABEL_W + PLOT_W + RIGHT_W
    svg = [
        f'<svg class="timeline" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="timeline of group {escape(group.key)}">',
        _DEFS,
        f'<text class="tick" x="10" y="18">{"time since open" if to_scale else "rank order"}'
        "</text>",
    ]
    if to_scale:
        for offset in _ticks(span):
            tx = x(t0 + offset)
            svg.append(
                f'<line class="grid" x1="{tx:.1f}" y1="{AXIS_H - 8}" x2="{tx:.1f}" '
                f'y2="{height - 10}"/><text class="tick" x="{tx:.1f}" y="{AXIS_H - 14}" '
                f'text-anchor="middle">{_offset(offset)}</text>'
            )
    for i, lane in enumerate(lanes):
        svg.append(_lane_svg(lane, i, x, decide))
    if any(lane.child.rank is None for lane in lanes):
        nx = x(t1)
        svg.append(
            f'<line class="edge now" x1="{nx:.1f}" y1="{AXIS_H - 4}" x2="{nx:.1f}" '
            f'y2="{height - 10}"/><text class="edge-label" x="{nx:.1f}" y="{height - 1}" '
            'text-anchor="middle">now</text>'
        )
    svg.append("</svg>")

    by_rank = {c.rank: c for c in children if c.rank is not None}
    if decide is not None:
        who = by_rank[decide]
        verdict = (
            f"Rank {decide} decides this {_COMBINATOR.get(group.wake or '', 'group')}: "
            "position "
            f"{who.position} ({escape(who.tool or '-')}), {escape(who.status)}."
        )
    elif group.wake in WAKES:
        verdict = "Not decided yet: the settlement that decides this group has not happened."
    else:
        verdict = "The wake policy is not recorded here, so no rank is marked as deciding."

    notes = []
    guessed = [lane.child.position for lane in lanes if not lane.start_known]
    if guessed:
        which = (
            "its children"
            if len(guessed) == len(lanes)
            else "positions " + ", ".join(map(str, guessed))
        )
        notes.append(
            f"Start times: the tier records no start time for {which}; those lanes start "
            "at the group's open."
        )
    placed = [lane.child.rank for lane in lanes if not lane.end_known]
    if placed and to_scale:
        notes.append(
            "Settlement times not recorded for ranks "
            + ", ".join(str(r) for r in sorted(p for p in placed if p is not None))
            + ": their marks are placed in rank order between their neighbours."
        )
    if not to_scale:
        notes.append("No times recorded: marks are spaced in rank order, not to scale.")

    facts = [
        ("wake", WAKES.get(group.wake or "", group.wake or "-")),
        ("disposition", group.disposition or "-"),
        (
            "settled",
            f"{'-' if group.settled is None else group.settled}/"
            f"{'-' if group.total is None else group.total}",
        ),
        ("owner", group.owner or "-"),
        ("opened", _utc(group.opened_at)),
        ("drawn", _utc(now)),
    ]
    legend_items = [
        (
            _swatch(
                '<rect x="2" y="5" width="30" height="12" fill="#8fc9ad"/>'
                '<circle cx="32" cy="11" r="9" fill="#fff" stroke="#2f7d5b" stroke-width="1.5"/>'
                '<text x="32" y="15" font-size="11" text-anchor="middle">1</text>'
            ),
            "a child from its start to its settlement; the number is its rank (settlement order)",
        ),
        (
            _swatch(
                '<circle cx="23" cy="11" r="10" fill="#f2b705" stroke="#6b4e00" stroke-width="3"/>'
            ),
            "the deciding rank: the settlement the group's combinator returns on",
        ),
        (
            _swatch(
                '<rect x="2" y="5" width="30" height="12" fill="url(#hatch)" stroke="#b3261e"/>'
                '<circle cx="32" cy="11" r="9" fill="#fff" stroke="#b3261e" stroke-width="2.5"/>'
            ),
            "a cancelled loser: its settlement is a cancellation (it still takes a rank)",
        ),
        (
            _swatch(
                '<rect x="2" y="5" width="32" height="12" fill="url(#fade)" stroke="#2458c6" '
                'stroke-dasharray="6 3"/><path d="M34,3 l9,8 l-9,8 z" fill="#2458c6"/>'
            ),
            "a running child: an open bar up to now, no rank yet",
        ),
    ]
    head = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>effecthost · group {escape(group.key)}</title>"
        + (f'<meta http-equiv="refresh" content="{refresh}">' if refresh else "")
        + f"<style>{_CSS}</style></head><body>"
    )
    body = [
        f'<nav><a href="{escape(index)}">all open groups</a></nav>' if index else "",
        f"<h1>Group <code>{escape(group.key)}</code></h1>",
        '<dl class="facts">'
        + "".join(f"<div><dt>{k}</dt><dd>{escape(v)}</dd></div>" for k, v in facts)
        + "</dl>",
        f'<p class="verdict">{verdict}</p>',
        "".join(svg),
        '<section class="legend"><h2>Legend</h2><ul>'
        + "".join(f"<li>{s}<span>{escape(t)}</span></li>" for s, t in legend_items)
        + "</ul>"
        + "".join(f'<p class="legend-note">{escape(n)}</p>' for n in notes)
        + "</section>",
    ]
    return head + "".join(body) + "</body></html>\n"


def group_path(key: str) -> str:
    return "/group/" + quote(key, safe="")


def render_index(groups: Sequence[GroupRow], *, refresh: int | None = None) -> str:
    """The viewer's front page: every open group, each linking to its timeline."""
    links = [group_path(g.key if isinstance(g.key, str) else str(g.key)) for g in groups]
    groups = [drawable(g, [])[0] for g in groups]
    rows = "".join(
        f'<tr><td><a href="{link}">{escape(g.key)}</a></td>'
        f"<td>{escape(_age(g.age_seconds))}</td>"
        f"<td>{escape(g.wake or '-')}</td><td>{escape(g.disposition or '-')}</td>"
        f"<td>{'-' if g.settled is None else g.settled}/{'-' if g.total is None else g.total}"
        f"</td><td>{escape(g.owner or '-')}</td></tr>"
        for g, link in zip(groups, links, strict=True)
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>effecthost · open groups</title>"
        + (f'<meta http-equiv="refresh" content="{refresh}">' if refresh else "")
        + f"<style>{_CSS}</style></head><body><h1>Open groups</h1>"
        + (
            '<table class="groups"><thead><tr><th>key</th><th>age</th><th>wake</th>'
            "<th>disposition</th><th>settled</th><th>owner</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            if groups
            else "<p>No open group.</p>"
        )
        + f"<p>{len(groups)} open group(s)</p></body></html>\n"
    )


# -- the viewer -------------------------------------------------------------------------


class NotLoopback(ValueError):
    """``effecthost ui`` serves only on a loopback address: the pages show every open
    group's keys, tools and owners, and the server has no authentication."""

    def __init__(self, address: str) -> None:
        super().__init__(f"ui binds to loopback addresses only, not {address!r}")
        self.address = address


def loopback_address(address: str) -> str:
    """``address`` resolved, when every address it names is loopback; else
    :class:`NotLoopback`."""
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        found = {str(info[4][0]) for info in infos}
    except (socket.gaierror, UnicodeError):
        raise NotLoopback(address) from None
    if not found or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found):
        raise NotLoopback(address)
    return address if address in found else sorted(found)[0]


def _loopback_host_header(value: str | None) -> bool:
    """A request names this server by a loopback name (a page another site rebinds to
    127.0.0.1 arrives with that site's name, and is refused)."""
    if not value:
        return False
    host = value.rsplit(":", 1)[0] if not value.endswith("]") else value
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


Read = Callable[[Callable[[Any], Awaitable[Any]]], Any]
"""Runs one read against the open inspector and returns its result (or raises)."""


MAX_HEAD_BYTES = 16 * 1024
"""Largest request line and headers together; a longer head is answered 431."""

MAX_HEADERS = 64
"""Most header lines in one request."""

READ_SECONDS = 5.0
"""How long a client has to send its whole request head, however it trickles it."""

MAX_CONNECTIONS = 256
"""Connections served at once; one more is answered 503 and closed."""

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class BadRequest(ValueError):
    """A request head the viewer does not serve: ``status`` is the answer (400, 405,
    431, 505)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Request:
    """A parsed request head: the method, the path (percent-decoded, no query), the
    headers by lower-cased name."""

    method: str
    path: str
    headers: dict[str, str]


def parse_request_head(head: bytes) -> Request:
    """The request in ``head`` (its bytes up to, not including, the blank line), within
    :data:`MAX_HEAD_BYTES` and :data:`MAX_HEADERS`.

    Raises:
        BadRequest: anything else; no other exception.
    """
    if len(head) > MAX_HEAD_BYTES:
        raise BadRequest(431, "request head too large")
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "request head is not ASCII") from None
    lines = text.split("\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, "too many header lines")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(505, "HTTP version not supported")
    if not target.startswith("/") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target):
        raise BadRequest(400, "malformed request target")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest(400, "malformed header line")
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
            raise BadRequest(400, "control character in a header")
        key = name.lower()
        if key in headers and key in ("host", "content-length", "transfer-encoding"):
            raise BadRequest(400, f"repeated {key} header")
        headers[key] = value.strip(" \t")
    if method not in ("GET", "HEAD"):
        raise BadRequest(405, "only GET and HEAD")
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        raise BadRequest(400, "a GET has no body")
    return Request(method, unquote(target.split("?", 1)[0]), headers)


def _page(status: int, text: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status}'
        f'</title></head><body><p>{escape(text)}</p><p><a href="/">all open groups</a>'
        "</p></body></html>\n"
    )


_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


def _response(status: int, page: str, *, head_only: bool = False) -> bytes:
    """A whole response. Every response closes its connection and says so: there is no
    keep-alive, so no reply is ever dropped by a per-connection request cap."""
    data = page.encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Server: effecthost-ui\r\n"
        "Content-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\n"
        "Cache-Control: no-store\r\n"
        "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else data)


def _read_head(sock: socket.socket, deadline: float) -> bytes | None:
    """The request head (before its blank line), read by :data:`READ_SECONDS`; ``None``
    when the client is silent, slow or gone; over :data:`MAX_HEAD_BYTES` raises 431."""
    data = b""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return data[:end]
        if len(data) > MAX_HEAD_BYTES + 4:
            raise BadRequest(431, "request head too large")
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except OSError:  # a timeout or a reset
            return None
        if not chunk:
            return None
        data += chunk


class UiServer(socketserver.ThreadingTCPServer):
    """The viewer: a thread per connection (a slow client holds only its own), at most
    :data:`MAX_CONNECTIONS` at once, each read bounded by :data:`READ_SECONDS`. Its
    threads are daemons and :meth:`server_close` does not wait for them, so a stop
    takes at most one poll of :meth:`serve_forever`."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  # a burst of connections is accepted, not retried by the client

    def __init__(
        self, address: tuple[str, int], answer: Callable[[Request], tuple[int, str]]
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._answer = answer
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Connection)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(_response(503, _page(503, "too many connections")))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Connection(socketserver.BaseRequestHandler):
    server: UiServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        head_only = False
        try:
            head = _read_head(sock, time.monotonic() + READ_SECONDS)
            if head is None:
                status, page = 408, _page(408, "request not received in time")
            else:
                request = parse_request_head(head)
                head_only = request.method == "HEAD"
                status, page = self.server._answer(request)
        except BadRequest as exc:
            status, page = exc.status, _page(exc.status, str(exc))
        try:
            sock.settimeout(READ_SECONDS)
            sock.sendall(_response(status, page, head_only=head_only))
        except OSError:
            pass  # the client went away


def make_server(read: Read, address: str, port: int, *, refresh: int | None = 5) -> UiServer:
    """A server on ``address:port`` (loopback only) answering ``/`` with the index and
    ``/group/KEY`` with that group's timeline, concurrently."""
    address = loopback_address(address)

    def answer(request: Request) -> tuple[int, str]:
        if not _loopback_host_header(request.headers.get("host")):
            return 403, _page(403, "this viewer answers only to a loopback host name")
        path = request.path
        try:
            if path == "/":
                groups = read(lambda inspector: inspector.groups())
                return 200, render_index(groups, refresh=refresh)
            if path.startswith("/group/"):
                key = path[len("/group/") :]
                group, children = read(lambda inspector: inspector.group(key))
                return 200, render_timeline(group, children, refresh=refresh, index="/")
            return 404, _page(404, "not found")
        except UnknownGroupKey as exc:
            return 404, _page(404, f"no open group {shorten(repr(exc.group_key))}")
        except TierUnreachable as exc:
            return 503, _page(503, shorten(str(exc)))
        except Exception as exc:  # a refusal of the tier: one line, no payload
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return 503, _page(503, shorten(first))

    return UiServer((address, port), answer)


def run_in(loop: asyncio.AbstractEventLoop, inspector: Any, timeout: float = 60.0) -> Read:
    """A :data:`Read` running each read on ``loop`` (where ``inspector`` lives)."""

    def read(call: Callable[[Any], Awaitable[Any]]) -> Any:
        async def go() -> Any:
            return await call(inspector)

        return asyncio.run_coroutine_threadsafe(go(), loop).result(timeout)

    return read
