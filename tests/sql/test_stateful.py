"""Hypothesis stateful test on SQLite: interleavings of finalize, takeover, close, drain
and retirement, checking G-15…G-17 after every step."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from effecthost.hosts.sql import SqliteStore
from effecthost.hosts.sql._store import ChildSpec

T = TypeVar("T")

GROUPS = ["g0", "g1"]
CHILDREN = 3
OWNERS = ["a:1", "b:2"]


class SqlGroups(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "s.sqlite3"
        self.loop = asyncio.new_event_loop()
        self.store = SqliteStore(self.path)
        self.run(self.store.start())
        self.fences: dict[tuple[str, str], int] = {}  # what each owner believes it holds
        self.ranks: dict[str, dict[int, str]] = {g: {} for g in GROUPS}  # observed facts
        self.retired: set[str] = set()
        self.counters: dict[str, int] = {g: 0 for g in GROUPS}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.store.aclose())
        self.loop.close()
        self.dir.cleanup()

    @staticmethod
    def key(group: str, i: int) -> str:
        return f"{group}/{i}"

    @rule(group=st.sampled_from(GROUPS))
    def open(self, group: str) -> None:
        if group in self.retired:
            return
        self.run(self.store.create_group(group, "all", "run_to_completion", CHILDREN))
        specs = [
            ChildSpec(self.key(group, i), i, "tool_call", "t", "{}", "h", claim=False)
            for i in range(CHILDREN)
        ]
        self.run(self.store.insert_children(group, specs, "nobody", 1.0))

    @rule(
        group=st.sampled_from(GROUPS), i=st.integers(0, CHILDREN - 1), owner=st.sampled_from(OWNERS)
    )
    def claim(self, group: str, i: int, owner: str) -> None:
        claim = self.run(self.store.claim(self.key(group, i), owner, 30.0))
        if claim is not None:
            self.fences[(owner, self.key(group, i))] = claim.fence

    @rule(group=st.sampled_from(GROUPS), i=st.integers(0, CHILDREN - 1))
    def expire(self, group: str, i: int) -> None:
        """The holder stalls past its TTL: its lease is expired on the database clock."""
        with sqlite3.connect(self.path) as conn:
            conn.execute(
                "UPDATE eh_children SET lease_expires = lease_expires - 3600 WHERE replay_key = ?",
                (self.key(group, i),),
            )

    @rule(
        group=st.sampled_from(GROUPS), i=st.integers(0, CHILDREN - 1), owner=st.sampled_from(OWNERS)
    )
    def finalize(self, group: str, i: int, owner: str) -> None:
        fence = self.fences.get((owner, self.key(group, i)))
        if fence is None:
            return
        seq = self.run(
            self.store.finalize(self.key(group, i), "h", owner, fence, '{"status":"success"}')
        )
        if seq is not None:
            assert seq == self.counters[group] + 1  # strictly monotonic, dense (G-16, G-17)
            self.counters[group] = seq

    @rule(
        group=st.sampled_from(GROUPS), i=st.integers(0, CHILDREN - 1), owner=st.sampled_from(OWNERS)
    )
    def drain(self, group: str, i: int, owner: str) -> None:
        """A drain worker settles a free child (cancel disposition) through a takeover."""
        seq = self.run(self.store.settle_free(self.key(group, i), owner, '{"status":"cancelled"}'))
        if seq is not None:
            assert seq == self.counters[group] + 1
            self.counters[group] = seq

    @rule(group=st.sampled_from(GROUPS), cancel=st.booleans())
    def close(self, group: str, cancel: bool) -> None:
        self.run(self.store.close(group, "cancel" if cancel else "run_to_completion"))

    @rule(group=st.sampled_from(GROUPS))
    def retire(self, group: str) -> None:
        if self.run(self.store.retire(group)):
            self.retired.add(group)

    @invariant()
    def ranks_are_durable_facts(self) -> None:
        with sqlite3.connect(self.path) as conn:
            for group in GROUPS:
                row = conn.execute(
                    "SELECT counter FROM eh_groups WHERE group_key = ?", (group,)
                ).fetchone()
                rows = conn.execute(
                    "SELECT seq, replay_key FROM eh_children WHERE group_key = ? AND seq IS NOT NULL",
                    (group,),
                ).fetchall()
                if group in self.retired:
                    # G-17: retired whole — no group row, no child row
                    assert row is None and rows == []
                    assert (
                        conn.execute(
                            "SELECT count(*) FROM eh_children WHERE group_key = ?", (group,)
                        ).fetchone()[0]
                        == 0
                    )
                    continue
                if row is None:
                    assert rows == []
                    continue
                seqs = sorted(seq for seq, _ in rows)
                assert seqs == list(range(1, row[0] + 1))  # counter == settled, dense
                current = {int(seq): str(rk) for seq, rk in rows}
                for rank, rk in self.ranks[group].items():  # G-15: append-only below
                    assert current[rank] == rk
                self.ranks[group] = current


TestG15G16G17Interleavings = SqlGroups.TestCase
TestG15G16G17Interleavings.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_sqlite_newer_schema_version_is_refused_at_start_up(tmp_path: Path) -> None:
    from effecthost.hosts.sql import SchemaVersionError

    path = tmp_path / "v.sqlite3"

    async def go() -> None:
        store = SqliteStore(path)
        await store.start()
        await store.aclose()
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE eh_schema SET version = version + 1")
        try:
            await SqliteStore(path).start()
        except SchemaVersionError as exc:
            assert exc.found == exc.expected + 1
        else:
            raise AssertionError("a newer schema version was accepted")

    asyncio.run(go())
