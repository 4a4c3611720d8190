"""G-31, G-33, G-36 at the store on SQLite (PostgreSQL: test_takeover.py): the fenced
finalize, the lease rules of claim and renewal, and retirement only once every child has
settled. The mutant catalog's SQLite store mutants are killed here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sql_support import ok, running, spec

from effecthost.contract import Outcome
from effecthost.hosts.sql import SqliteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with running(SqliteStore(tmp_path / "fences.sqlite3")) as (made,):
        yield made


async def test_G31_G33_a_stale_fence_finalizes_nothing_and_a_live_lease_is_never_taken(
    store: SqliteStore,
) -> None:
    """G-31, G-33: a takeover of an expired lease bumps the fence; the finalize of the
    driver holding the old fence, even under the same owner, is a no-op with no counter
    bump; an unexpired lease is never taken over."""
    await store.create_group("g", "all", "run_to_completion", 1)
    await store.insert_children("g", [spec("c")], "nobody", 1.0)
    stale = await store.claim("c", "node-a:1", -1.0)  # a driver stalled past its TTL
    assert stale is not None
    fresh = await store.claim("c", "node-a:1", 30.0)  # its own host takes it over
    assert fresh is not None and fresh.fence == stale.fence + 1
    assert await store.claim("c", "node-b:2", 30.0) is None  # unexpired: never taken
    assert await store.finalize("c", "h", "node-a:1", stale.fence, ok("stale")) is None
    group = await store.get_group("g")
    assert group is not None and group.counter == 0
    assert await store.finalize("c", "h", "node-a:1", fresh.fence, ok("fresh")) == 1
    read = await store.read_rank("g", 1)
    assert read is not None and read.outcome is not None
    assert Outcome.model_validate_json(read.outcome).value == "fresh"


async def test_G33_an_expired_lease_is_not_renewed(store: SqliteStore) -> None:
    """G-33: a renewal confirms only leases that have not expired; a driver past its TTL
    learns it lost the child instead of extending a lease another host may take."""
    await store.create_group("g", "all", "run_to_completion", 2)
    await store.insert_children("g", [spec("old", 0), spec("live", 1)], "nobody", 1.0)
    assert await store.claim("old", "node-a:1", -1.0) is not None
    assert await store.claim("live", "node-a:1", 30.0) is not None
    renewed, _groups = await store.renew("node-a:1", 30.0, ["old", "live"], [])
    assert [r.replay_key for r in renewed] == ["live"]
    assert await store.claim("old", "node-b:2", 30.0) is not None


async def test_G36_a_closed_group_retires_only_once_every_child_settled(
    store: SqliteStore,
) -> None:
    """G-36: retirement deletes a closed group only when no child can still take a rank."""
    await store.create_group("g", "all", "run_to_completion", 2)
    await store.insert_children("g", [spec("a", 0), spec("b", 1)], "nobody", 1.0)
    claim = await store.claim("a", "node-a:1", 30.0)
    assert claim is not None
    assert await store.finalize("a", "h", "node-a:1", claim.fence, ok("a")) == 1
    late = await store.claim("b", "node-a:1", 30.0)  # a loser still running
    assert late is not None
    await store.close("g", "run_to_completion")
    assert not await store.retire("g")
    assert await store.get_group("g") is not None
    assert await store.finalize("b", "h", "node-a:1", late.fence, ok("b")) == 2
    assert await store.retire("g")
