"""The shipped conformance suite against both SQL substrates, with restart declared."""

from __future__ import annotations

import pytest

from effecthost.conformance import SuiteReport, run_suite
from effecthost.hosts.sql.testing import postgres_factory, sqlite_factory

pytestmark = pytest.mark.anyio


def _assert_clean(report: SuiteReport) -> None:
    failed = [(r.check.node_name, r.reason) for r in report.by_status("failed")]
    assert not failed, failed
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
