"""The conformance suite against the mutant catalog: every mutant is killed on its own id.

A mutant survives when the suite passes it, or fails it only on checks that cite other
ids; either fails this test. The controls show the harnesses themselves are sound: the
correct memory host passes the whole suite on the durable harness.
"""

from __future__ import annotations

import file_mutants  # noqa: F401  (registers the file-host mutants)
import library_mutants  # noqa: F401  (registers the library mutants)
import memory_mutants  # noqa: F401  (registers the memory mutants)
import pytest
import refusal_mutants  # noqa: F401  (registers the refusal and limit mutants)
import sql_mutants  # noqa: F401  (registers the SQLite mutants)
from catalog import (
    CATALOG,
    NOT_COVERED,
    DurableMemoryHostUnderTest,
    RoutedMemoryHostUnderTest,
    killers,
)
from routing import RoutingMemoryHost
from tier_mutants import TIER_MUTANTS

from effecthost.conformance import (
    OBLIGATIONS,
    FactoryEnv,
    SuiteReport,
    conformance_resolver,
    run_suite,
)
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio


def _explain(report: SuiteReport) -> str:
    failures = "\n".join(f"  {r.check.node_name}: {r.reason}" for r in report.by_status("failed"))
    return f"failures:\n{failures or '  none'}"


def _params() -> list[object]:
    params: list[object] = []
    for m in CATALOG:
        marks = [pytest.mark.slow, pytest.mark.timeout(240)] if m.slow else []
        params.append(pytest.param(m, id=f"{m.breaks}-{m.name}", marks=marks))
    return params


@pytest.mark.parametrize("mutant", _params())
async def test_mutant_is_killed_on_its_own_id(mutant: object) -> None:
    from catalog import Mutant

    assert isinstance(mutant, Mutant)
    with mutant.applied():
        report = await run_suite(mutant.factory, select=mutant.select)
    assert report.by_status("passed") or report.by_status("failed"), "no check ran"
    assert killers(report, mutant.breaks), (
        f"{mutant.name} survived: no failing check cites {mutant.breaks} ({mutant.doc})\n"
        + _explain(report)
    )


def _durable_reference(env: FactoryEnv) -> DurableMemoryHostUnderTest:
    return DurableMemoryHostUnderTest(MemoryEffectHost, env)


async def test_the_correct_host_passes_the_whole_suite_on_the_durable_harness() -> None:
    """The control of every ``durable`` mutant: the reference host over the surviving
    record passes every check, the restart, drain and timer checks included (its unwired
    host is the same incarnation, not a second one)."""
    report = await run_suite(_durable_reference)
    assert report.ok, _explain(report)
    assert not report.by_status("skipped") or report.missing_capabilities() <= {
        "unroutable_children",
        "payload_refs",
        "sealing",
        "second_incarnation",
        "payload_limit",
        "transient_faults",
    }


async def test_the_routing_host_passes_the_whole_suite_with_unroutable_children() -> None:
    """The control of every ``routed`` mutant: the reference host over the modelled
    engine passes every check, the G-14 check run, not skipped."""
    report = await run_suite(_routed_reference)
    assert report.ok, _explain(report)
    assert "unroutable_children" not in report.missing_capabilities()
    assert any("G-14" in r.check.ids for r in report.by_status("passed"))


def _routed_reference(env: FactoryEnv) -> RoutedMemoryHostUnderTest:
    return RoutedMemoryHostUnderTest(
        RoutingMemoryHost(conformance_resolver(env.lab_path)), RoutingMemoryHost()
    )


def test_every_host_breakable_id_has_a_mutant() -> None:
    """Every obligation and ruling has at least one mutant, killed by the suite or by the
    tier tests; the ids still without one are listed with why."""
    rulings = {f"R-{n}" for n in range(1, 14)}
    ids = set(OBLIGATIONS) | {f"G-{n:02d}" for n in range(31, 47)} | rulings
    mutated = {m.breaks for m in CATALOG} | {m.breaks for m in TIER_MUTANTS}
    assert sorted(ids - mutated - set(NOT_COVERED)) == []
    assert not (mutated & set(NOT_COVERED)), "a covered id is still listed as not covered"


async def test_a_cancel_close_that_waits_out_its_losers_fails_at_the_close() -> None:
    """G-27: a ``CANCEL`` close's promptness is bounded by one settlement's timeout, not
    by the whole check's: the host whose close waits for a losing sleep fails at the close,
    with a reason that says so."""
    from catalog import CATALOG

    mutant = next(m for m in CATALOG if m.name == "WaitsOutHostRunLosersHost")
    report = await run_suite(mutant.factory, select="signal_or_deadline_select")
    reasons = [r.reason for r in report.by_status("failed")]
    assert reasons and all("CANCEL close" in reason for reason in reasons), reasons
