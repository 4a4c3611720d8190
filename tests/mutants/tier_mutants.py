"""Mutants of a tier's own machinery, killed by the tier tests that cite their id.

The SQL obligations G-31…G-36 bind the statements of the SQL store, which the
conformance suite cannot see on a third-party host; their arbiter is ``tests/sql``. Each
mutant here is a one-line change to one statement of ``SqliteStore``, the way a
contributor would get it wrong, applied by rewriting that method's source. The catalog
test runs the named tier tests in a fresh pytest process with this module as a plugin
(``-p tier_mutants``) and the mutant named in ``EFFECTHOST_TIER_MUTANT``; it requires
that a failing test's docstring, or its module's, cites the id.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

import pytest

MUTANT_ENV = "EFFECTHOST_TIER_MUTANT"
REPORT_ENV = "EFFECTHOST_TIER_MUTANT_REPORT"


@dataclass(frozen=True)
class TierMutant:
    """One broken statement: the id it breaks, the mistake, the tests that must kill it."""

    name: str
    breaks: str
    doc: str
    owner: str
    """``module:Class.method`` whose source is rewritten."""
    old: str
    new: str
    tests: tuple[str, ...]

    def apply(self) -> None:
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


SQLITE = "effecthost.hosts.sql._sqlite:SqliteStore"
BATCH = (
    "tests/sql/test_batched_finalize.py::"
    "test_batch_gets_dense_distinct_ranks_and_a_fenced_off_child_bumps_nothing[sqlite]"
)

FENCES = ("tests/sql/test_store_fences.py",)

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
]


def by_name(name: str) -> TierMutant:
    return next(m for m in TIER_MUTANTS if m.name == name)


# -- the plugin, in the pytest process that runs the tier tests ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get(MUTANT_ENV)
    if name:
        by_name(name).apply()


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
