"""The conformance suite is itself tested: the reference host and its adversarial variant
pass it, and each deliberately broken host fails it on the obligation it breaks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from broken_hosts import (
    BROKEN_TIMEOUT,
    bump_before_fence_factory,
    clamping_cursor_factory,
    dense_adversarial_factory,
    ranks_by_position_factory,
    records_refused_open_factory,
    reopens_closed_factory,
    seeded_adversarial_factory,
    seeded_sequence_equality_factory,
    sequence_equality_factory,
    widens_cancel_factory,
)

from effecthost.conformance import (
    OBLIGATIONS,
    FactoryEnv,
    HostCapabilities,
    HostUnderTest,
    SuiteReport,
    all_checks,
    conformance_resolver,
    run_suite,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.memory.testing import (
    MemoryHostUnderTest,
    adversarial_factory,
    factory,
    sealed_factory,
)

pytestmark = pytest.mark.anyio

Factory = Callable[[FactoryEnv], HostUnderTest]

# A broken host that makes checks wait for ranks that never come costs a timeout per
# check, so those run the checks of the six broken obligations (their own among them)
# rather than the whole suite; the others run everything. The sequence-equality host runs
# its G-16 check alone: on a fresh seeded host its gaps are reproducible, whereas children
# that earlier checks leave behind would draw from the same random stream.
BROKEN_OBLIGATIONS = "G-10 or G-16 or G-17 or G-20 or G-21 or G-26"


def _explain(report: SuiteReport) -> str:
    failures = "\n".join(f"  {r.check.node_name}: {r.reason}" for r in report.by_status("failed"))
    return f"{report.table()}\nfailures:\n{failures or '  none'}"


def test_every_obligation_has_a_registered_check() -> None:
    covered = {obligation for check in all_checks() for obligation in check.ids}
    missing = sorted(set(OBLIGATIONS) - covered)
    assert not missing, f"obligations without a check: {missing}"
    names = [check.node_name for check in all_checks()]
    assert len(names) == len(set(names)), "two checks share a node name"


@pytest.mark.parametrize(
    "host_factory",
    [
        pytest.param(factory, id="memory"),
        pytest.param(adversarial_factory, id="adversarial"),
        pytest.param(seeded_adversarial_factory(1), id="adversarial-seed-1"),
        pytest.param(seeded_adversarial_factory(2), id="adversarial-seed-2"),
        pytest.param(seeded_adversarial_factory(3), id="adversarial-seed-3"),
        pytest.param(dense_adversarial_factory, id="dense-adversarial"),
    ],
)
async def test_correct_hosts_pass_the_whole_suite(host_factory: Factory) -> None:
    report = await run_suite(host_factory)
    assert report.ok, _explain(report)
    assert len(report.results) == len(all_checks())
    assert report.by_status("passed"), "nothing ran"
    assert all(r.status in ("passed", "skipped") for r in report.results)


@pytest.mark.parametrize(
    ("host_factory", "expected", "select", "pinpointed"),
    [
        pytest.param(sequence_equality_factory, "G-16", "G-16", False, id="sequence-equality"),
        pytest.param(
            bump_before_fence_factory, "G-17", BROKEN_OBLIGATIONS, False, id="bump-before-fence"
        ),
        pytest.param(clamping_cursor_factory, "G-20", None, True, id="clamping-cursor"),
        pytest.param(records_refused_open_factory, "G-10", None, True, id="records-refused-open"),
        pytest.param(widens_cancel_factory, "G-26", None, True, id="widens-cancel"),
        pytest.param(reopens_closed_factory, "G-26", None, True, id="reopens-closed"),
        pytest.param(
            ranks_by_position_factory, "G-21", BROKEN_OBLIGATIONS, False, id="ranks-by-position"
        ),
    ],
)
async def test_broken_host_fails_on_the_obligation_it_breaks(
    host_factory: Factory, expected: str, select: str | None, pinpointed: bool
) -> None:
    report = await run_suite(host_factory, select=select)
    assert not report.ok, f"the suite passed a broken host\n{_explain(report)}"
    assert expected in report.failed_ids(), _explain(report)
    if pinpointed:
        # A single-rule bug fails only checks of that rule, across the whole suite.
        stray = [
            r.check.node_name for r in report.by_status("failed") if expected not in r.check.ids
        ]
        assert not stray, f"checks of other obligations failed: {stray}\n{_explain(report)}"
    for result in report.by_status("failed"):
        assert result.reason, f"{result.check.node_name} failed without saying why"


@pytest.mark.parametrize("seed", [1, 11, 23])
async def test_sequence_equality_fails_whatever_the_gaps(seed: int) -> None:
    """Rank-by-sequence is caught whatever gaps the adversarial sequences happen to have."""
    report = await run_suite(seeded_sequence_equality_factory(seed), select="G-16")
    assert "G-16" in report.failed_ids(), f"seed {seed}\n{_explain(report)}"


async def test_undeclared_capabilities_are_printed_skips() -> None:
    report = await run_suite(factory)
    skipped = report.by_status("skipped")
    assert skipped, "the memory host declares no restart, so some checks must skip"
    declared = set(MemoryHostUnderTest.capabilities.declared())
    for result in skipped:
        missing = [c for c in result.check.requires if c not in declared]
        assert missing, f"{result.check.node_name} skipped though it needs nothing undeclared"
        for capability in missing:
            assert capability in result.reason, (result.check.node_name, result.reason)
    for result in report.results:
        if not result.check.requires:
            assert result.status == "passed", (result.check.node_name, result.reason)
    table = report.table()
    assert "host does not declare restart" in table
    assert "host does not declare unroutable_children" in table


@pytest.mark.parametrize(
    "host_factory",
    [
        pytest.param(factory, id="memory"),
        pytest.param(adversarial_factory, id="adversarial"),
        pytest.param(sealed_factory, id="sealed"),
    ],
)
async def test_the_parked_await_check_runs_on_every_memory_factory(host_factory: Factory) -> None:
    """G-19: the memory factories declare ``waiter_probe``, so cancelling an await while it
    is parked in the host is checked there, not skipped."""
    report = await run_suite(host_factory, select="cancelling_a_parked_await_changes_nothing")
    assert [r.status for r in report.results] == ["passed"], _explain(report)


class _RestartFails(MemoryHostUnderTest):
    """Declares a restart it cannot perform."""

    capabilities = HostCapabilities(restart=True)
    timeout = BROKEN_TIMEOUT

    async def restart(self) -> None:
        raise RuntimeError("this host cannot rebuild from durable state")


def _restart_fails_factory(env: FactoryEnv) -> _RestartFails:
    return _RestartFails(MemoryEffectHost(conformance_resolver(env.lab_path)), MemoryEffectHost())


async def test_a_declared_capability_that_fails_is_a_failure_not_a_skip() -> None:
    report = await run_suite(_restart_fails_factory)
    restart_only = [r for r in report.results if r.check.requires == ("restart",)]
    assert restart_only, "no check needs restart alone"
    for result in restart_only:
        assert result.status == "failed", (result.check.node_name, result.status, result.reason)
        assert "cannot rebuild from durable state" in result.reason, result.reason
    for result in report.by_status("skipped"):
        assert "restart" not in result.reason, (result.check.node_name, result.reason)
    assert report.failed_ids() >= {"G-11", "G-29"}, _explain(report)
