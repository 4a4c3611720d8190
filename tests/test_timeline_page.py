"""The timeline page (``inspect --group KEY --html``, ``effecthost ui``) in a real
headless Chromium, over real SQLite groups: what a person sees — lanes, labels, rank
order, the deciding rank, the cancelled losers, the open bars of running children."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from inspect_support import TESTS, inspect
from timeline_groups import (
    ALL,
    ALL_TOOLS,
    HELD,
    ORDER,
    RACE,
    RACE_LABELS,
    RACE_TOOLS,
    all_of_twenty,
    race_with_cancelled_losers,
)

DECIDE = "rgb(242, 183, 5)"
"""The deciding mark's fill."""

LANES_JS = """() => [...document.querySelectorAll('g.lane')].map(lane => {
  const box = e => { if (!e) return null; const r = e.getBoundingClientRect();
    return {x: r.x, y: r.y, right: r.right, cx: r.x + r.width / 2, w: r.width, h: r.height}; };
  const mark = lane.querySelector('circle.mark');
  const notes = [...lane.querySelectorAll('text.note')];
  return {
    name: lane.querySelector('text.name').textContent,
    sub: lane.querySelector('text.sub').textContent,
    box: box(lane.querySelector('text.name')),
    bar: box(lane.querySelector('rect.bar')),
    barFill: getComputedStyle(lane.querySelector('rect.bar')).fill,
    rank: mark ? lane.querySelector('text.rank').textContent : null,
    mark: box(mark),
    markFill: mark ? getComputedStyle(mark).fill : null,
    markStroke: mark ? getComputedStyle(mark).stroke : null,
    openEnd: box(lane.querySelector('path.open-end')),
    notes: notes.map(n => [n.textContent, getComputedStyle(n).fill]),
  };
})"""


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run async set-up in a thread of its own (Playwright's sync API owns this one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        executable = None
    if executable is None:
        why = "chromium or the playwright package is not installed (./dev setup installs both)"
        if os.environ.get("CI"):
            pytest.fail(why)  # CI installs them: a missing browser there is a failure
        print(why)
        pytest.skip(why)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1200, "height": 1200})
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(url)
    return page, requests


def _draw(db: Path, key: str, out: Path) -> str:
    drawn = inspect("--sqlite", str(db), "--group", key, "--html", str(out))
    assert drawn.returncode == 0, drawn.stderr
    return out.as_uri()


@pytest.fixture(scope="module")
def race_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("race") / "effects.sqlite3"
    _run(race_with_cancelled_losers(db))
    return db


def test_race_page_shows_the_deciding_rank_and_the_cancelled_losers(
    browser: Any, race_db: Path, tmp_path: Path
) -> None:
    """G-24, G-27, G-29: a race whose caller died after rank 1 and whose losers a drain
    cancelled: one lane per child in position order labelled with position, tool, replay
    key and status; rank 1 highlighted as the deciding settlement, before the losers'
    ranks 2 and 3 in time; each loser marked cancelled; nothing loaded from outside."""
    page, requests = _open(browser, _draw(race_db, RACE, tmp_path / "race.html"))
    lanes = page.evaluate(LANES_JS)
    assert [lane["name"] for lane in lanes] == [f"#{i} {t}" for i, t in enumerate(RACE_TOOLS)]
    statuses = ["cancelled", "success", "cancelled"]
    assert [lane["sub"] for lane in lanes] == [
        f"{RACE}:{label} · {status}" for label, status in zip(RACE_LABELS, statuses, strict=True)
    ]
    assert [lane["box"]["y"] for lane in lanes] == sorted(lane["box"]["y"] for lane in lanes)
    assert [lane["rank"] for lane in lanes] == ["2", "1", "3"]
    winner, losers = lanes[1], [lanes[0], lanes[2]]
    assert winner["markFill"] == DECIDE
    assert all(loser["markFill"] != DECIDE for loser in losers)
    assert winner["mark"]["w"] > losers[0]["mark"]["w"]  # drawn larger, too
    assert winner["mark"]["cx"] < min(loser["mark"]["cx"] for loser in losers)
    assert lanes[0]["mark"]["cx"] <= lanes[2]["mark"]["cx"]  # rank 2 before rank 3
    assert [text for text, _ in winner["notes"]] == ["◆ decides"]
    for loser in losers:
        assert [text for text, _ in loser["notes"]] == ["✕ cancelled"]
        assert loser["markStroke"] == loser["notes"][0][1] == "rgb(179, 38, 30)"
        assert "url" in loser["barFill"]  # hatched
    assert page.get_by_text("Rank 1 decides this race: position 1 (search.cache)").is_visible()
    assert page.get_by_text("records no start time for its children").is_visible()
    assert page.get_by_text("◆ decides").is_visible()
    assert page.get_by_text("✕ cancelled").first.is_visible()
    assert requests == [page.url]
    page.close()


def test_all_of_twenty_shows_open_bars_then_the_last_rank_deciding(
    browser: Any, tmp_path: Path
) -> None:
    """G-21, G-24: a 20-child all drawn while three children still run (open bars up to
    now, no rank, nothing decided) and once all have settled (rank 20 decides); rank
    numbers follow settlement order, lanes follow positions."""
    db = tmp_path / "effects.sqlite3"
    pictures: list[Path] = []

    async def picture() -> None:
        out = tmp_path / f"all-{len(pictures)}.html"
        pictures.append(out)
        await asyncio.to_thread(_draw, db, ALL, out)

    _run(all_of_twenty(db, picture))
    rank_of = {position: str(rank) for rank, position in enumerate(ORDER, start=1)}
    held = set(ORDER[-HELD:])

    page, requests = _open(browser, pictures[0].as_uri())
    lanes = page.evaluate(LANES_JS)
    assert [lane["name"] for lane in lanes] == [
        f"#{i} {ALL_TOOLS[i % len(ALL_TOOLS)]}" for i in range(20)
    ]
    assert [lane["box"]["y"] for lane in lanes] == sorted(lane["box"]["y"] for lane in lanes)
    assert [lane["rank"] for lane in lanes] == [
        None if i in held else rank_of[i] for i in range(20)
    ]
    settled = sorted((int(lane["rank"]), lane["mark"]["cx"]) for lane in lanes if lane["rank"])
    assert [x for _, x in settled] == sorted(x for _, x in settled)  # rank order in time
    now_x = page.locator("line.now").bounding_box()
    assert now_x is not None
    for i in held:
        lane = lanes[i]
        assert lane["sub"].endswith(" · running") and lane["mark"] is None
        assert [text for text, _ in lane["notes"]] == ["running"]
        assert abs(lane["bar"]["right"] - now_x["x"]) < 2 and lane["openEnd"] is not None
        assert lane["bar"]["x"] < lane["bar"]["right"] - 50  # an open bar, not a dot
    assert all(lane["markFill"] != DECIDE for lane in lanes)
    assert page.get_by_text("Not decided yet").is_visible()
    assert requests == [page.url]
    page.close()

    page, _ = _open(browser, pictures[1].as_uri())
    lanes = page.evaluate(LANES_JS)
    assert [lane["rank"] for lane in lanes] == [rank_of[i] for i in range(20)]
    deciding = [lane for lane in lanes if lane["markFill"] == DECIDE]
    assert [lane["rank"] for lane in deciding] == ["20"]
    assert page.get_by_text(f"Rank 20 decides this all: position {ORDER[-1]}").is_visible()
    assert (
        page.locator("line.now").count() == 0
        and page.get_by_text("running", exact=True).count() == 0
    )
    page.close()


def _ui(*args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "effecthost.cli", "ui", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_ui_serves_an_index_and_each_open_group_on_loopback(browser: Any, race_db: Path) -> None:
    """G-30: ``effecthost ui`` lists the open groups, links each to its timeline, answers
    only to a loopback host name, and stops on SIGTERM."""
    server = _ui("--sqlite", str(race_db), "--port", "0", "--refresh", "0")
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("effecthost ui: serving http://127.0.0.1:"), line
        url = line.split()[-1]
        page, requests = _open(browser, url)
        assert page.get_by_role("link", name=RACE).is_visible()
        page.get_by_role("link", name=RACE).click()
        page.wait_for_load_state()
        assert page.get_by_text("Rank 1 decides this race").is_visible()
        assert [lane["rank"] for lane in page.evaluate(LANES_JS)] == ["2", "1", "3"]
        assert all(r.startswith(url) for r in requests)
        page.close()

        rebound = urllib.request.Request(url, headers={"Host": "attacker.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=10)
        assert refused.value.code == 403
        refused.value.close()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url + "group/no%3Asuch", timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        server.terminate()
        assert server.wait(20) == 0
        server.communicate(timeout=10)


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "192.0.2.1"])
def test_ui_refuses_a_non_loopback_bind(tmp_path: Path, bind: str) -> None:
    """G-30: the viewer has no authentication, so it listens on loopback only: any other
    address is refused (exit 18) before anything is opened or bound."""
    server = _ui("--sqlite", str(tmp_path / "none.sqlite3"), "--bind", bind)
    out, err = server.communicate(timeout=30)
    assert server.returncode == 18, err
    assert err.strip() == f"effecthost: ui binds to loopback addresses only, not {bind!r}"
    assert out == "" and not (tmp_path / "none.sqlite3").exists()


def test_html_needs_a_group(tmp_path: Path) -> None:
    """``--html`` draws one group: without ``--group`` it is a usage error (exit 2)."""
    drawn = inspect("--sqlite", str(tmp_path / "x.sqlite3"), "--html", str(tmp_path / "x.html"))
    assert drawn.returncode == 2 and "give --group KEY" in drawn.stderr
    assert not (tmp_path / "x.html").exists()


def _child(rank: int | None, position: int, status: str, settled_at: float | None = None) -> Any:
    from effecthost._inspect import ChildRow

    return ChildRow(rank, position, f"k:{position}", "t", status, settled_at, None)


@pytest.mark.parametrize(
    ("wake", "statuses", "total", "decides"),
    [
        ("first", ["error", "success"], 3, 1),
        ("first_success", ["error", "success", "success"], 3, 2),
        ("first_success", ["error", "error"], 3, None),  # a success may still come
        ("first_success", ["error", "cancelled", "error"], 3, 3),  # the aggregate error
        ("first_success", ["settled", "success"], 2, None),  # sealed: cannot tell
        ("all", ["success", "success"], 3, None),
        ("all", ["success", "cancelled", "error"], 3, 2),  # all's first rejection
        ("all", ["success", "success", "success"], 3, 3),
        ("all", [], 0, None),
    ],
)
def test_deciding_rank_follows_the_wake_policy(
    wake: str, statuses: list[str], total: int, decides: int | None
) -> None:
    """G-24: the highlighted rank is the settlement each combinator returns on."""
    from effecthost._timeline import deciding_rank

    children = [_child(rank, rank, s) for rank, s in enumerate(statuses, start=1)]
    assert deciding_rank(wake, children, total) == decides


def test_page_escapes_what_the_records_hold() -> None:
    """Keys, tools and owners are recorded text: the page shows them, never runs them."""
    from effecthost._inspect import ChildRow, GroupRow
    from effecthost._timeline import render_index, render_timeline

    hostile = '<script>alert("x")</script>'
    group = GroupRow(hostile, 1.0, "first", "cancel", 1, 2, hostile, 100.0)
    children = [
        ChildRow(1, 0, hostile, hostile, "success", None, False, None),  # time gone
        ChildRow(2, 1, "b", "b", "error", 101.0, False, 100.5),
    ]
    for page in (render_timeline(group, children, now=102.0), render_index([group])):
        assert "<script" not in page and "&lt;script&gt;" in page
    page = render_timeline(group, children, now=102.0)
    assert "Settlement times not recorded for ranks 1" in page
    assert "records no start time for positions 0" in page


def test_html_through_a_host_named_by_module_attr(race_db: Path, tmp_path: Path) -> None:
    """G-30: ``--host MODULE:ATTR`` draws the same page as ``--sqlite`` for its store."""
    (tmp_path / "timeline_host.py").write_text(
        "from effecthost.hosts.sql import sqlite_host\n\n"
        f"async def host():\n    return await sqlite_host({str(race_db)!r})\n"
    )
    out = tmp_path / "race.html"
    command = ["inspect", "--host", "timeline_host:host", "--group", RACE, "--html", str(out)]
    drawn = subprocess.run(
        [sys.executable, "-m", "effecthost.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert drawn.returncode == 0, drawn.stderr
    page = out.read_text("utf-8")
    assert "Rank 1 decides this race: position 1 (search.cache)" in page
    assert page.count("✕ cancelled") == 2
