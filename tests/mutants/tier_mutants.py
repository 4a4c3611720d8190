"""Mutants of a tier's own machinery, killed by the tier tests that cite their id.

The SQL obligations G-31…G-36 bind the statements of the SQL store, which the
conformance suite cannot see on a third-party host; their arbiter is ``tests/sql``. A
mutant here is either one statement of ``SqliteStore`` rewritten the way a contributor
would get it wrong (applied by rewriting that method's source), or a method overridden
or a call wrapped (a finalize in two transactions, a drain that leaves claimed children
alone, a PostgreSQL trigger that locks child rows after the group row). The catalog test
runs the named tier tests in a fresh pytest process with this module as a plugin
(``-p tier_mutants``) and the mutant named in ``EFFECTHOST_TIER_MUTANT``; the processes
those tests start (drain workers, crash workers, the CLI) apply it too, through a
``sitecustomize`` on their ``PYTHONPATH``. A failing test's docstring, or its module's,
must cite the id.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

MUTANT_ENV = "EFFECTHOST_TIER_MUTANT"
REPORT_ENV = "EFFECTHOST_TIER_MUTANT_REPORT"
CHILD_ENV = "EFFECTHOST_TIER_MUTANT_CHILD"
"""Set by the plugin: the mutant the processes the tier tests start apply at start."""


@dataclass(frozen=True)
class TierMutant:
    """One mistake in the tier's machinery: the id it breaks, the mistake, the tests
    that must kill it. Either a statement rewritten (``owner``, ``old``, ``new``) or a
    ``patch`` that overrides a method or wraps a call (robust to the statements'
    wording)."""

    name: str
    breaks: str
    doc: str
    owner: str
    """``module:Class.method`` whose source is rewritten (unused with ``patch``)."""
    old: str
    new: str
    tests: tuple[str, ...]
    patch: Callable[[], None] | None = None

    def apply(self) -> None:
        if self.name in _APPLIED:  # the plugin and ``sitecustomize`` may both apply it
            return
        _APPLIED.add(self.name)
        if self.patch is not None:
            self.patch()
            return
        module_name, qualified = self.owner.split(":")
        class_name, method = qualified.split(".")
        module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
        cls = getattr(module, class_name)
        source = textwrap.dedent(inspect.getsource(getattr(cls, method)))
        if source.count(self.old) != 1:
            raise AssertionError(f"{self.name}: the statement to break is not in {self.owner}")
        code = compile(source.replace(self.old, self.new), f"<{self.name}>", "exec")
        namespace: dict[str, Any] = {}
        exec(code, vars(module), namespace)
        setattr(cls, method, namespace[method])


_APPLIED: set[str] = set()


SQLITE = "effecthost.hosts.sql._sqlite:SqliteStore"
BATCH = (
    "tests/sql/test_batched_finalize.py::"
    "test_batch_gets_dense_distinct_ranks_and_a_fenced_off_child_bumps_nothing[sqlite]"
)

FENCES = ("tests/sql/test_store_fences.py",)

# -- mutants that override a method or wrap a call: they reach child processes too (the
# catalog test puts a ``sitecustomize`` applying the mutant on their ``PYTHONPATH``) ------------


def _settle_then_number() -> None:
    """G-35: the finalize settles the child in one transaction and takes its sequence
    number in a second one (keeping the group row's lock short), so a SIGKILL between
    the two leaves a settled child with no rank."""
    from effecthost.hosts.sql import SqliteStore
    from effecthost.hosts.sql._store import Finalize

    async def finalize(
        self: Any, replay_key: str, envelope_hash: str, owner: str, fence: int, outcome: str
    ) -> int | None:
        def settle(c: Any) -> str | None:
            row = c.execute(
                "UPDATE eh_children SET state = 'settled', outcome = ?, lease_owner = NULL, "
                "lease_expires = NULL WHERE replay_key = ? AND envelope_hash = ? "
                "AND lease_owner = ? AND fence = ? AND state = 'claimed' RETURNING group_key",
                (outcome, replay_key, envelope_hash, owner, fence),
            ).fetchone()
            return None if row is None else str(row[0])

        group = await self._write(settle)
        if group is None:
            return None
        self._fault("finalize:after_update")

        def number(c: Any) -> tuple[int, str]:
            seq, state = c.execute(
                "UPDATE eh_groups SET counter = counter + 1 WHERE group_key = ? "
                "RETURNING counter, state",
                (group,),
            ).fetchone()
            c.execute("UPDATE eh_children SET seq = ? WHERE replay_key = ?", (seq, replay_key))
            self._fault("finalize:before_commit")
            return int(seq), str(state)

        seq, state = await self._write(number)
        if state == "open":
            self.open_at_finalize.add(replay_key)
        self._fault("finalize:after_commit")
        return seq

    async def finalize_many(self: Any, owner: str, items: list[Finalize]) -> list[int | None]:
        return [
            await self.finalize(i.replay_key, i.envelope_hash, owner, i.fence, i.outcome)
            for i in items
        ]

    SqliteStore.finalize = finalize  # type: ignore[method-assign]
    SqliteStore.finalize_many = finalize_many  # type: ignore[method-assign]


def _drain_skips_claimed_children() -> None:
    """G-34: a drain pass takes over only children no driver ever claimed; those whose
    driver died holding a (now expired) lease are left to it, so the children a killed
    caller was running never finish."""
    from effecthost.hosts.sql._host import SqlDrain

    run_pass = SqlDrain.run_pass

    async def pending_only_pass(self: Any) -> Any:
        store = self.host.store
        unfinished = store.unfinished

        async def pending() -> Any:
            return [row for row in await unfinished() if row.state == "pending"]

        store.unfinished = pending
        try:
            return await run_pass(self)
        finally:
            del store.unfinished

    SqlDrain.run_pass = pending_only_pass  # type: ignore[method-assign]


_LOCKS_SIBLINGS = (
    "CREATE OR REPLACE FUNCTION eh_mutant_siblings() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN PERFORM 1 FROM eh_children WHERE group_key = NEW.group_key "
    "AND state <> 'settled' ORDER BY replay_key FOR UPDATE; RETURN NEW; END $$",
    "DROP TRIGGER IF EXISTS eh_mutant_siblings ON eh_groups",
    "CREATE TRIGGER eh_mutant_siblings AFTER UPDATE OF counter ON eh_groups "
    "FOR EACH ROW EXECUTE FUNCTION eh_mutant_siblings()",
)


def _group_row_then_siblings() -> None:
    """G-32: after the counter bump (the group row locked), the finalize locks the
    group's other unsettled children to see whether the group is complete: child rows
    taken after the group row, against the order every other transaction takes them."""
    from effecthost.hosts.sql import PostgresStore

    start = PostgresStore.start

    async def start_with_the_sibling_lock(self: Any) -> None:
        await start(self)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.channel)
            for statement in _LOCKS_SIBLINGS:
                await conn.execute(statement)

    PostgresStore.start = start_with_the_sibling_lock  # type: ignore[method-assign]


DRAIN_WORKERS = ("tests/sql/test_drain_workers.py",)
CRASHES = (
    "tests/sql/test_crash_and_concurrency.py::"
    "test_G35_sigkill_keeps_recorded_ranks_and_settles_each_child_once",
)
DEADLOCKS = (
    "tests/sql/test_deadlocks.py::test_G32_a_finalize_takes_no_child_row_after_the_group_row",
)

TIER_MUTANTS: list[TierMutant] = [
    TierMutant(
        "BatchFinalizeIgnoresTheFence",
        "G-31",
        "G-31: the batched finalize matches a child on replay key, hash, owner and state but "
        "not its fence token, so a driver holding a stale fence still settles it.",
        f"{SQLITE}.finalize_many",
        '"AND fence = ? AND state',
        '"AND ? > 0 AND state',
        (BATCH, *FENCES),
    ),
    TierMutant(
        "BatchFinalizeBumpsForEveryItem",
        "G-31",
        "G-31: the batched finalize bumps the counter by the batch's size, not by the "
        "children whose fenced update matched, so a fenced-off child burns a number.",
        f"{SQLITE}.finalize_many",
        "(len(matched), group),",
        "(len(items), group),",
        (BATCH, *FENCES),
    ),
    TierMutant(
        "FinalizeIgnoresTheFence",
        "G-31",
        "G-31: the finalize matches a child on replay key, hash, owner and state but not its "
        "fence token, so a driver that lost its lease and reclaimed it settles twice.",
        f"{SQLITE}._finalize_body",
        "AND lease_owner = ? AND fence = ? ",
        "AND lease_owner = ? AND ? > 0 ",
        FENCES,
    ),
    TierMutant(
        "RetiresWithUnsettledChildren",
        "G-36",
        "G-36: retirement counts the children still pending but not those claimed and "
        "running, so a closed group is deleted under a loser that is owed a rank.",
        f"{SQLITE}._retire_body",
        "WHERE group_key = ? AND state <> 'settled'",
        "WHERE group_key = ? AND state = 'pending'",
        FENCES,
    ),
    TierMutant(
        "RenewsAnExpiredLease",
        "G-33",
        "G-33: a renewal extends a child's lease whether or not it has already expired, so a "
        "driver past its TTL keeps a child another host may have taken over.",
        f"{SQLITE}.renew",
        "AND state = 'claimed' AND lease_expires >= {NOW} \"",
        "AND state = 'claimed' \"",
        FENCES,
    ),
    TierMutant(
        "ClaimTakesALiveLease",
        "G-33",
        "G-33: a claim takes any unsettled child, an unexpired lease included, so two drivers "
        "run one child at once.",
        f"{SQLITE}._claim_sql",
        'AND (lease_owner IS NULL OR lease_expires < {NOW}) "',
        '"',
        FENCES,
    ),
    TierMutant(
        "SettlesThenNumbers",
        "G-35",
        _settle_then_number.__doc__ or "",
        "",
        "",
        "",
        CRASHES,
        patch=_settle_then_number,
    ),
    TierMutant(
        "DrainSkipsClaimedChildren",
        "G-34",
        _drain_skips_claimed_children.__doc__ or "",
        "",
        "",
        "",
        DRAIN_WORKERS,
        patch=_drain_skips_claimed_children,
    ),
    TierMutant(
        "LocksSiblingsAfterTheGroupRow",
        "G-32",
        _group_row_then_siblings.__doc__ or "",
        "",
        "",
        "",
        DEADLOCKS,
        patch=_group_row_then_siblings,
    ),
]


def by_name(name: str) -> TierMutant:
    return next(m for m in TIER_MUTANTS if m.name == name)


# -- the plugin, in the pytest process that runs the tier tests ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get(MUTANT_ENV)
    if name:
        by_name(name).apply()
        os.environ[CHILD_ENV] = name


_FAILED: list[dict[str, str]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        function = getattr(item, "function", None)
        module = getattr(item, "module", None)
        _FAILED.append(
            {
                "nodeid": item.nodeid,
                "doc": f"{getattr(module, '__doc__', '') or ''}\n{getattr(function, '__doc__', '') or ''}",
                "reason": str(report.longrepr)[-600:],
            }
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(_FAILED, out)
