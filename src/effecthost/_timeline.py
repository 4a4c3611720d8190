"""A group's timeline as a self-contained HTML page (``effecthost inspect --html``), and
the loopback-only viewer serving it for every open group (``effecthost ui``).

The page is drawn from the rows ``inspect`` reads (:mod:`effecthost._inspect`): one lane
per child from its start to its settlement, the rank on each settlement mark, the rank
that decides the group's wake policy highlighted. It loads nothing (inline CSS and SVG,
no script), so it opens from a file, a mail attachment or an air-gapped machine alike.
"""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import math
import socket
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
)

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
        f"{escape(_short(child.tool, 34))}</text>"
        f'<text class="sub" x="10" y="{top + 32}">{escape(_short(child.replay_key, 40))}'
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
            f"{who.position} ({escape(who.tool)}), {escape(who.status)}."
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
    rows = "".join(
        f'<tr><td><a href="{group_path(g.key)}">{escape(g.key)}</a></td>'
        f"<td>{'-' if g.age_seconds is None else f'{g.age_seconds:.0f}s'}</td>"
        f"<td>{escape(g.wake or '-')}</td><td>{escape(g.disposition or '-')}</td>"
        f"<td>{'-' if g.settled is None else g.settled}/{'-' if g.total is None else g.total}"
        f"</td><td>{escape(g.owner or '-')}</td></tr>"
        for g in groups
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


def make_server(
    read: Read, address: str, port: int, *, refresh: int | None = 5
) -> http.server.HTTPServer:
    """An HTTP server on ``address:port`` (loopback only) answering ``/`` with the index
    and ``/group/KEY`` with that group's timeline; one request at a time."""
    address = loopback_address(address)

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "effecthost-ui"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the pages are the output."""

        def _send(self, status: int, page: str) -> None:
            data = page.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header(
                "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"
            )
            self.end_headers()
            self.wfile.write(data)

        def _problem(self, status: int, text: str) -> None:
            self._send(
                status,
                f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status}'
                f'</title></head><body><p>{escape(text)}</p><p><a href="/">all open groups</a>'
                "</p></body></html>\n",
            )

        def do_GET(self) -> None:
            if not _loopback_host_header(self.headers.get("Host")):
                self._problem(403, "this viewer answers only to a loopback host name")
                return
            path = self.path.split("?", 1)[0]
            try:
                if path == "/":
                    groups = read(lambda inspector: inspector.groups())
                    self._send(200, render_index(groups, refresh=refresh))
                elif path.startswith("/group/"):
                    key = unquote(path[len("/group/") :])
                    group, children = read(lambda inspector: inspector.group(key))
                    self._send(200, render_timeline(group, children, refresh=refresh, index="/"))
                else:
                    self._problem(404, "not found")
            except UnknownGroupKey as exc:
                self._problem(404, f"no open group {exc.group_key!r}")
            except TierUnreachable as exc:
                self._problem(503, str(exc))
            except Exception as exc:  # a refusal of the tier: one line, no payload
                self._problem(503, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class Server(http.server.HTTPServer):
        address_family = family

    return Server((address, port), Handler)


def run_in(loop: asyncio.AbstractEventLoop, inspector: Any, timeout: float = 60.0) -> Read:
    """A :data:`Read` running each read on ``loop`` (where ``inspector`` lives)."""

    def read(call: Callable[[Any], Awaitable[Any]]) -> Any:
        async def go() -> Any:
            return await call(inspector)

        return asyncio.run_coroutine_threadsafe(go(), loop).result(timeout)

    return read
