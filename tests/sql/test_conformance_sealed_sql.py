"""The shipped conformance suite against both SQL substrates with payload references and
sealing declared (G-47…G-50), on top of restart and durable timers."""

from __future__ import annotations

import pytest

from effecthost.conformance import SuiteReport, run_suite
from effecthost.hosts.sql.testing import postgres_sealed_factory, sqlite_sealed_factory

pytestmark = pytest.mark.anyio


def _assert_clean(report: SuiteReport) -> None:
    failed = [(r.check.node_name, r.reason) for r in report.by_status("failed")]
    assert not failed, failed
    assert report.missing_capabilities() <= {"unroutable_children"}
    passed = {r.check.node_name for r in report.by_status("passed")}
    for obligation in ("G-47", "G-48", "G-49", "G-50"):
        assert any(obligation in name for name in passed), obligation
    assert len(passed) >= 45


@pytest.mark.timeout(180)
async def test_sealed_conformance_suite_passes_on_sqlite() -> None:
    _assert_clean(await run_suite(sqlite_sealed_factory))


@pytest.mark.timeout(240)
async def test_sealed_conformance_suite_passes_on_postgres(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFFECTHOST_POSTGRES_DSN", pg_dsn)
    _assert_clean(await run_suite(postgres_sealed_factory))
