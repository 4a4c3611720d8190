"""What every tier's ``effecthost inspect`` test checks: the same columns and JSON shape
for a group of two children, position 1 settled (rank 1) and position 0 running."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent

GROUP_FIELDS = [
    "key",
    "age_seconds",
    "wake",
    "disposition",
    "settled",
    "total",
    "owner",
    "opened_at",
]
CHILD_FIELDS = [
    "rank",
    "position",
    "replay_key",
    "tool",
    "status",
    "settled_at",
    "sealed",
    "started_at",
]
GROUP_HEADER = ["KEY", "AGE", "WAKE", "DISPOSITION", "SETTLED", "OWNER"]
RANK_HEADER = ["RANK", "POSITION", "REPLAY", "KEY", "TOOL", "STATUS", "SETTLED", "AT", "SEALED"]


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    """``effecthost inspect ARGS`` in a process of its own."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "effecthost.cli", "inspect", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def check_inspect(
    where: list[str],
    key: str,
    *,
    wake: str,
    disposition: str,
    owner: str | None,
    children: list[tuple[str, str]],
    starts: bool = True,
) -> None:
    """Run the listing, the rank table (text and JSON) and the timeline page against
    ``where`` and check them: ``children`` are (replay key, tool) by position; position 1
    holds rank 1. ``starts``: the tier records when each child started."""
    listed = inspect(*where, "--json")
    assert listed.returncode == 0, listed.stderr
    groups = json.loads(listed.stdout)["groups"]
    assert [list(g) for g in groups] == [GROUP_FIELDS] * len(groups)
    (group,) = [g for g in groups if g["key"] == key]
    assert (group["wake"], group["disposition"], group["settled"], group["total"]) == (
        wake,
        disposition,
        1,
        2,
    )
    assert group["owner"] == owner
    assert group["age_seconds"] is not None and 0 <= group["age_seconds"] < 600
    assert group["opened_at"] is not None and abs(time.time() - group["opened_at"]) < 600

    text = inspect(*where)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == GROUP_HEADER
    (row,) = [line.split() for line in lines[1:] if line.split()[0] == key]
    assert row[2:5] == [wake, disposition, "1/2"] and row[5] == (owner or "-")

    ranks = inspect(*where, "--group", key, "--json")
    assert ranks.returncode == 0, ranks.stderr
    doc: dict[str, Any] = json.loads(ranks.stdout)
    assert list(doc) == ["group", "children"] and doc["group"]["key"] == key
    assert [list(c) for c in doc["children"]] == [CHILD_FIELDS] * 2
    first, running = doc["children"]
    assert first["settled_at"] is not None
    if starts:
        assert first["started_at"] is not None and running["started_at"] is not None
        assert doc["group"]["opened_at"] <= first["started_at"] + 1 <= first["settled_at"] + 1
    else:
        assert first["started_at"] is None and running["started_at"] is None
    times = ("settled_at", "started_at")
    assert {k: v for k, v in first.items() if k not in times} == {
        "rank": 1,
        "position": 1,
        "replay_key": children[1][0],
        "tool": children[1][1],
        "status": "success",
        "sealed": False,
    }
    assert running == {
        "rank": None,
        "position": 0,
        "replay_key": children[0][0],
        "tool": children[0][1],
        "status": "running",
        "settled_at": None,
        "sealed": None,
        "started_at": running["started_at"],
    }

    table = inspect(*where, "--group", key)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("RANK")))
    assert lines[header].split() == RANK_HEADER
    ranked, unranked = (line.split() for line in lines[header + 1 :])
    assert ranked[:5] == ["1", "1", children[1][0], children[1][1], "success"]
    assert ranked[6] == "no"
    assert unranked == ["-", "0", children[0][0], children[0][1], "running", "-", "-"]

    with tempfile.TemporaryDirectory() as scratch:
        page_file = Path(scratch) / "group.html"
        drawn = inspect(*where, "--group", key, "--html", str(page_file))
        assert drawn.returncode == 0, drawn.stderr
        page = page_file.read_text("utf-8")
    assert html.escape(key) in page and "running" in page
    assert all(html.escape(rk) in page and html.escape(tool) in page for rk, tool in children)
    assert ("records no start time" in page) is not starts
    assert "<script" not in page and "http" not in page.split("<body>", 1)[1]

    unknown = inspect(*where, "--group", "no:such:group")
    assert unknown.returncode == 17, unknown.stderr
    assert unknown.stderr.strip() == "effecthost: no open group 'no:such:group'"
