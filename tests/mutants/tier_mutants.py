"""Mutants of a tier's own machinery, killed by the tier tests that cite their id.

The SQL obligations G-31…G-36 bind the statements of the SQL store, which the
conformance suite cannot see on a third-party host; their arbiter is ``tests/sql``. A
mutant here is either one statement of ``SqliteStore`` rewritten the way a contributor
would get it wrong (applied by rewriting that method's source), or a method overridden
or a call wrapped (a finalize in two transactions, a drain that leaves claimed children
alone, a PostgreSQL trigger that locks child rows after the group row).

The engine obligations G-37…G-46 bind the Restate endpoint's services and the Temporal
workflow and worker; their arbiters are ``tests/restate`` and ``tests/temporal``. Their
mutants rewrite one statement of ``build_services``, the endpoint check, a workflow
method or ``create_worker``, and reach the endpoint or worker process the fixtures start.

The catalog test runs the named tier tests in a fresh pytest process with this module as
a plugin (``-p tier_mutants``) and the mutant named in ``EFFECTHOST_TIER_MUTANT``; the
processes those tests start (drain workers, crash workers, the CLI, a Restate endpoint, a
Temporal worker) apply it too, through a ``sitecustomize`` on their ``PYTHONPATH``. A
failing test's docstring, or its module's, must cite the id.
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
        rewrite(self.name, self.owner, self.old, self.new)


def rewrite(name: str, owner: str, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in the source of ``owner``
    (``module:Class.method`` or ``module:function``) with ``new``."""
    module_name, qualified = owner.split(":")
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    class_name, _, method = qualified.rpartition(".")
    holder: Any = getattr(module, class_name) if class_name else module
    source = textwrap.dedent(inspect.getsource(getattr(holder, method)))
    if source.count(old) != 1:
        raise AssertionError(f"{name}: the statement to break is not in {owner}")
    code = compile(source.replace(old, new), f"<{name}>", "exec")
    namespace: dict[str, Any] = {}
    exec(code, vars(module), namespace)
    original = getattr(holder, method)
    setattr(holder, method, namespace[method])
    if holder is module:  # rebind it where it was imported by name (a package's API)
        for other in list(sys.modules.values()):
            if getattr(other, method, None) is original:
                setattr(other, method, namespace[method])


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

# -- engine tiers: the Restate endpoint and the Temporal worker run in processes of their
# own, which apply the mutant through the ``sitecustomize`` ----------------------------------

ENDPOINT = "effecthost.hosts.restate._endpoint:build_services"
RESTATE = "tests/restate/test_restate_tier.py::"
WORKFLOW = "effecthost.hosts.temporal._workflow:EffectGroupWorkflow"


def _child_key_without_epoch() -> None:
    """G-37: a child's idempotency key is its tool, position and replay key, without the
    group's epoch, so a later group reusing a freed replay key at the same position
    attaches to the finished invocation of the group before and its child never runs."""
    import effecthost.hosts.restate._endpoint  # noqa: F401  (rebinds its import too)

    rewrite(
        "ChildKeyWithoutTheEpoch",
        "effecthost.hosts.restate._wire:idempotency_key",
        'f"{tool}:{position}:{replay_key}:{short}"',
        'f"{tool}:{position}:{replay_key}"',
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
    TierMutant(
        "ChildKeyWithoutTheEpoch",
        "G-37",
        _child_key_without_epoch.__doc__ or "",
        "",
        "",
        "",
        (f"{RESTATE}test_G37_a_reused_replay_key_runs_as_a_new_invocation",),
        patch=_child_key_without_epoch,
    ),
    TierMutant(
        "SettleRanksADuplicate",
        "G-38",
        "G-38: the group object's settle takes the next rank without looking up whether the "
        "replay key holds one, so a second delivery of one child's settlement takes a rank.",
        ENDPOINT,
        'kit.next_rank(int(state["counter"] or 0), settled)',
        'kit.next_rank(int(state["counter"] or 0), False)',
        (f"{RESTATE}test_G38_a_duplicate_settlement_takes_no_rank",),
    ),
    TierMutant(
        "AwaitRankHoldsTheLock",
        "G-39",
        "G-39: the group object's await_rank is an exclusive handler (a consistent read of "
        "the counter), so a parked read holds the object's lock and the settle that would "
        "wake it waits behind it.",
        ENDPOINT,
        '@group.handler(kind="shared", state_preload=False)\n    async def await_rank',
        "@group.handler(state_preload=False)\n    async def await_rank",
        (f"{RESTATE}test_G39_a_parked_read_holds_no_lock",),
    ),
    TierMutant(
        "LargeOutcomesInObjectState",
        "G-40",
        "G-40: the child sends every outcome inline, so a large one lands as bytes in the "
        "group object's state instead of a reference into the payload object.",
        ENDPOINT,
        "if len(canonical_json(document)) > INLINE_LIMIT:",
        "if False:",
        (f"{RESTATE}test_G41_close_clears_spilled_outcomes_also_of_a_group_of_the_layout_before",),
    ),
    TierMutant(
        "CloseClearsOnlyTheShape",
        "G-41",
        "G-41: retirement clears the keys it names (shape, children, counter, waiters) and "
        "leaves the per-rank, per-child and invocation keys behind, so a closed group's "
        "object state grows with every child it ever had.",
        ENDPOINT,
        '        ctx.clear_all()\n        ctx.set("tombstone", {"effective": effective',
        '        for name in ("shape", "children", "counter", "waiters"):\n'
        "            ctx.clear(name)\n"
        '        ctx.set("tombstone", {"effective": effective',
        (f"{RESTATE}test_G41_close_leaves_only_the_tombstone",),
    ),
    TierMutant(
        "ValidatesServicesNotHandlers",
        "G-42",
        "G-42: the endpoint check looks for each needed service, not each handler, so a "
        "deployment whose payload object lacks a handler passes validation at start-up.",
        "effecthost.hosts.restate._deploy:missing_handlers",
        'bound = {(s.name, h) for s in services for h in getattr(s, "handlers", {})}',
        "bound = {(s.name, h) for s in services for h in REQUIRED_HANDLERS.get(s.name, ())}",
        ("tests/restate/test_deploy_validation.py",),
    ),
    TierMutant(
        "NamesChildrenWithoutAPatch",
        "G-43",
        "G-43: the workflow gives child activities their tool-naming ids in every run, not "
        "only in runs started under the patch that introduced them, so a history recorded "
        "before no longer replays.",
        WORKFLOW + "._watch",
        "elif self._named:",
        "elif True:",
        ("tests/temporal/test_replay.py::test_history_replays_in_the_sandbox",),
    ),
    TierMutant(
        "BatchFromTheWrongRank",
        "G-44",
        "G-44: the workflow's batch after rank ``after`` starts at index ``after + 1`` (ranks "
        "counted from one), so the durable read of rank n returns rank n + 1.",
        WORKFLOW + "._batch",
        "self._settled[max(after, 0) :]",
        "self._settled[max(after, 0) + 1 :]",
        ("tests/temporal/test_reads.py::test_recorded_ranks_are_read_in_one_batch",),
    ),
    TierMutant(
        "CloseKeepsTheOpenMemo",
        "G-45",
        "G-45: close marks the run closed but leaves its memo saying open, so the "
        "visibility listing of open groups still shows a closed group.",
        WORKFLOW + "._close",
        'workflow.upsert_memo({MEMO_STATE: "closed"})',
        "pass",
        ("tests/temporal/test_cancel_close.py::test_cancel_close_returns_while_the_loser_runs",),
    ),
    TierMutant(
        "WorkerWithoutTheShardWorkflow",
        "G-46",
        "G-46: the one-call worker registers the group workflow and the activities but not "
        "the shard workflow, so a group wider than its shard size never runs its children.",
        "effecthost.hosts.temporal._worker:create_worker",
        "workflows=[EffectGroupWorkflow, EffectShardWorkflow],",
        "workflows=[EffectGroupWorkflow],",
        ("tests/temporal/test_worker.py",),
    ),
]


# -- SQL outages: killed by tests/sql/test_outages.py ---------------------------------

SQL_HOST = "effecthost.hosts.sql._host:SqlEffectHost"
OUTAGES = "tests/sql/test_outages.py"
TIER_MUTANTS += [
    TierMutant(
        "AwaitLetsTheDriverErrorOut",
        "R-12",
        "R-12: an await whose database is unreachable does not wait: asyncpg's connection "
        "error reaches the caller.",
        f"{SQL_HOST}.await_next_settlement",
        "except self.store.driver_errors as exc:",
        "except ZeroDivisionError as exc:",
        (f"{OUTAGES}::test_an_await_rides_out_a_postgres_restart",),
    ),
    TierMutant(
        "RetriedOpenLeavesItsOwnLeases",
        "R-12",
        "R-12: a retried open whose first try committed is a reopen but does not start the "
        "tool calls that try leased to this host, so they wait for the lease to expire.",
        f"{SQL_HOST}._open",
        "if retried:",
        "if False:",
        (
            f"{OUTAGES}::test_an_open_that_committed_before_its_connection_dropped_is_a_reopen_on_retry",
        ),
    ),
    TierMutant(
        "FinalizeGivesUpInAnOutage",
        "R-12",
        "R-12: a finalize that cannot reach the database fails its child at once instead of "
        "trying again while the lease lasts, so the outcome is lost and the rank waits for "
        "the lease to expire and the tool to run again.",
        f"{SQL_HOST}._flush",
        "if self._dead or isinstance(exc, self.store.input_errors):",
        "if True:",
        (f"{OUTAGES}::test_a_tool_that_finishes_during_an_outage_is_recorded_once_afterwards",),
    ),
    TierMutant(
        "RetriedCloseForgetsItsCancels",
        "R-12",
        "R-12: a retried CANCEL close whose first try committed is a no-op that does not "
        "issue the cancels that try never got to, so the group's event wait never settles "
        "and the group never retires.",
        f"{SQL_HOST}._close",
        "if retried and row is not None",
        "if False and row is not None",
        (
            f"{OUTAGES}::test_a_close_that_committed_before_its_connection_dropped_is_a_no_op_on_retry",
        ),
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


# -- owner liveness on the engines (R-1): killed by the tiers' owner-liveness tests ------------

TIER_MUTANTS += [
    TierMutant(
        "RestateDrainSeesNoLiveIncarnation",
        "R-1",
        "R-1: the Restate drain does not read the owner leases, so it takes a live "
        "incarnation of the same owner in another process for gone and cancels its group.",
        "effecthost.hosts.restate._controller:_RestateDrain.run_pass",
        "opener != ctl.incarnation and opener in live:",
        "opener != ctl.incarnation and False:",
        ("tests/restate/test_owner_liveness.py",),
    ),
    TierMutant(
        "TemporalDrainSeesNoLiveLease",
        "R-1",
        "R-1: the Temporal drain knows only the controllers of its own process, so another "
        "process's live incarnation is gone to it: its group is cancelled, or reported as "
        "``NoExecutor`` by an unwired drain.",
        "effecthost.hosts.temporal._controller:TemporalEffectHost._owner_live",
        "return described.status == WorkflowExecutionStatus.RUNNING",
        "return False",
        ("tests/temporal/test_owner_liveness.py",),
    ),
]
