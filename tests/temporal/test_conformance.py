"""The shipped conformance suite against a real dev server and a real worker process,
with restarts (worker SIGKILLed, dev server restarted on the same database file)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from effecthost.conformance import SuiteReport, run_suite
from effecthost.hosts.temporal.testing import factory, sharded_factory

from ._support import require_cli


@pytest.mark.idle
@pytest.mark.timeout(420)
def test_conformance_suite_passes_on_temporal() -> None:
    require_cli()
    report = asyncio.run(run_suite(factory, keep=True))
    _assert_passed(report)
    assert report.missing_capabilities() <= {
        "payload_refs",
        "sealing",
        "payload_limit",
        "transient_faults",
    }, report.table()


@pytest.mark.idle
@pytest.mark.timeout(420)
def test_conformance_suite_passes_on_sharded_groups() -> None:
    """G-43, G-15, G-21, G-27, G-51: the suite again, every group of two or more children
    run in shards of one child (the path of groups wider than ``SHARD_CHILDREN``):
    ranks, wakes, closes, cancels, timers and events hold there too."""
    require_cli()
    report = asyncio.run(run_suite(sharded_factory, keep=True))
    _assert_passed(report)


def _assert_passed(report: SuiteReport) -> None:
    """No check failed; otherwise the tails of the server's and the worker's logs are
    printed with the table (what the engine did is the first thing a flaky run needs)."""
    print(report.table())
    failed = [f"{r.check.node_name}: {r.reason}" for r in report.by_status("failed")]
    if failed:
        for log in report.logs:
            lines = log.read_text(errors="replace").splitlines()
            print(f"--- the last lines of {log.name} ---", *lines[-60:], sep="\n")
    if report.kept is not None and not failed:
        shutil.rmtree(report.kept, ignore_errors=True)
    assert not failed, "\n".join(failed)
