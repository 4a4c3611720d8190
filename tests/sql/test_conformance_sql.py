"""The shipped conformance suite against both SQL substrates, with restart and durable
timers declared; ``sealed``: with payload references and sealing declared too
(G-47…G-50)."""

from __future__ import annotations

import pytest

from effecthost.conformance import SuiteReport, run_suite
from effecthost.hosts.sql.testing import (
    postgres_factory,
    postgres_sealed_factory,
    sqlite_factory,
    sqlite_sealed_factory,
)

pytestmark = pytest.mark.anyio
FACTORIES = {
    ("sqlite", "plain"): sqlite_factory,
    ("postgres", "plain"): postgres_factory,
    ("sqlite", "sealed"): sqlite_sealed_factory,
    ("postgres", "sealed"): postgres_sealed_factory,
}


def _assert_clean(report: SuiteReport, sealed: bool) -> None:
    failed = [(r.check.node_name, r.reason) for r in report.by_status("failed")]
    assert not failed, failed
    passed = {r.check.node_name for r in report.by_status("passed")}
    if not sealed:
        assert report.missing_capabilities() <= {
            "unroutable_children",
            "payload_refs",
            "sealing",
            "payload_limit",
            "transient_faults",
        }
        assert len(passed) >= 41
        return
    assert report.missing_capabilities() <= {
        "unroutable_children",
        "payload_limit",
        "transient_faults",
    }
    for obligation in ("G-47", "G-48", "G-49", "G-50"):
        assert any(obligation in name for name in passed), obligation
    assert len(passed) >= 45


@pytest.mark.timeout(240)
@pytest.mark.parametrize("payloads", ["plain", "sealed"])
@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_G01_to_G53_conformance_suite_passes_with_restart(
    db: str, payloads: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if db == "postgres":
        monkeypatch.setenv("EFFECTHOST_POSTGRES_DSN", request.getfixturevalue("pg_dsn"))
    _assert_clean(await run_suite(FACTORIES[db, payloads]), payloads == "sealed")
