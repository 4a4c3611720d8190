"""``effecthost inspect`` and ``effecthost drain`` against a real SQLite host whose opener
went away (G-12, G-30, G-34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import abandoned_groups, cli


async def abandoned_group(db: Path) -> str:
    """Open a two-child group whose tools never return, then stop the host the way a
    dying process does; its short leases expire on the database clock."""
    key = "cli:group:abandoned:0"
    await abandoned_groups(db, [key])
    return key


def drain_until(db: Path, *args: str, expect: str) -> str:
    """Drain passes are refused children under a live lease; repeat (bounded) until the
    dead opener's leases have expired and the pass acts."""
    for _ in range(40):
        result = cli("drain", "--sqlite", str(db), "--once", *args)
        assert result.returncode == 0, result.stderr
        if expect in result.stdout:
            return result.stdout
    raise AssertionError(f"no drain pass reported {expect!r}: {result.stdout}")


@pytest.mark.anyio
async def test_inspect_and_drain_a_gone_opener(tmp_path: Path) -> None:
    db = tmp_path / "effects.sqlite3"
    key = await abandoned_group(db)

    listed = cli("inspect", "--sqlite", str(db), "--json")
    assert listed.returncode == 0, listed.stderr
    (group,) = json.loads(listed.stdout)["groups"]
    assert (group["key"], group["settled"], group["total"]) == (key, 0, 2)
    assert "1 open group(s)" in listed.stderr

    report = drain_until(db, expect="no executor 2")
    assert f"no executor: {key} {key}:0" in report

    drain_until(db, "--resolver", "cli_tools:registry", expect="resumed 2")
    final = cli("inspect", "--sqlite", str(db), "--json")
    (group,) = json.loads(final.stdout)["groups"]
    assert (group["settled"], group["total"]) == (2, 2), final.stdout
