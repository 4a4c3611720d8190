"""The shipped conformance suite against both SQL substrates, with restart declared."""

from __future__ import annotations

import pytest

from effecthost.conformance import SuiteReport, run_suite
from effecthost.hosts.sql.testing import postgres_factory, sqlite_factory

pytestmark = pytest.mark.anyio


KNOWN_FAILURES = {"a_drain_never_touches_a_live_owners_group"}
"""R-1 on the SQL tiers: a drain pass beside the live owner of a ``CANCEL`` group cancels
its unsettled ``await_event`` and ``sleep`` children (the drain takes host-run children
without a lease for orphans). Tracked by the strict xfail below."""


def _assert_clean(report: SuiteReport) -> None:
    failed = [(r.check.node_name, r.reason) for r in report.by_status("failed")]
    assert {r.check.name for r in report.by_status("failed")} <= KNOWN_FAILURES, failed
    assert report.missing_capabilities() <= {"unroutable_children", "payload_refs", "sealing"}
    assert len(report.by_status("passed")) >= 41


@pytest.mark.timeout(180)
async def test_G01_to_G53_conformance_suite_passes_on_sqlite_with_restart() -> None:
    _assert_clean(await run_suite(sqlite_factory))


@pytest.mark.timeout(240)
async def test_G01_to_G53_conformance_suite_passes_on_postgres_with_restart(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFFECTHOST_POSTGRES_DSN", pg_dsn)
    _assert_clean(await run_suite(postgres_factory))


@pytest.mark.xfail(strict=True, reason="R-1: the SQL drain cancels a live owner's timers")
@pytest.mark.timeout(120)
async def test_R1_a_drain_beside_a_live_owner_touches_nothing_on_sqlite() -> None:
    """R-1: a drain pass never cancels the sleep or event wait of a group whose owner is
    live (today it cancels both on the SQL tiers)."""
    report = await run_suite(sqlite_factory, select="a_drain_never_touches")
    assert report.ok, [(r.check.node_name, r.reason) for r in report.by_status("failed")]
