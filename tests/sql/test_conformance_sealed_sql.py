"""The shipped conformance suite against both SQL substrates with payload references and
sealing declared (G-47…G-50), on top of restart and durable timers."""

from __future__ import annotations

import pytest

from effecthost.conformance import SuiteReport, run_suite
from effecthost.hosts.sql.testing import postgres_sealed_factory, sqlite_sealed_factory

pytestmark = pytest.mark.anyio


R1 = "a_drain_never_touches_a_live_owners_group"
G50 = "a_destroyed_key_shreds_its_scope"


def _assert_clean(report: SuiteReport, known: set[str]) -> None:
    failed = [(r.check.node_name, r.reason) for r in report.by_status("failed")]
    # Known SQL bugs the strengthened suite finds. R-1: see KNOWN_FAILURES in
    # test_conformance_sql.py (strict xfail there). G-50 on SQLite: a reader host started
    # late in the run (a second host on the live WAL database) is refused at start-up with
    # DatabaseRefused "truncated or corrupt SQLite database (SQLITE_IOERR_SHORT_READ)";
    # the check passes run alone.
    assert {r.check.name for r in report.by_status("failed")} <= known, failed
    assert report.missing_capabilities() <= {"unroutable_children"}
    passed = {r.check.node_name for r in report.by_status("passed")}
    for obligation in ("G-47", "G-48", "G-49", "G-50"):
        if obligation == "G-50" and G50 in known:
            continue
        assert any(obligation in name for name in passed), obligation
    assert len(passed) >= 45


@pytest.mark.timeout(180)
async def test_sealed_conformance_suite_passes_on_sqlite() -> None:
    _assert_clean(await run_suite(sqlite_sealed_factory), {R1, G50})


@pytest.mark.timeout(120)
async def test_G50_a_destroyed_key_shreds_its_scope_on_sqlite_run_alone() -> None:
    """G-50 on SQLite, run alone (in the whole run its late reader host is refused at
    start-up, see ``_assert_clean``)."""
    report = await run_suite(sqlite_sealed_factory, select=G50)
    assert [r.status for r in report.results] == ["passed"], report.results


@pytest.mark.timeout(240)
async def test_sealed_conformance_suite_passes_on_postgres(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFFECTHOST_POSTGRES_DSN", pg_dsn)
    _assert_clean(await run_suite(postgres_sealed_factory), {R1})
