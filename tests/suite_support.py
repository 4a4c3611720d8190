"""What the tier tests assert of a whole conformance run."""

from __future__ import annotations

import shutil
from collections.abc import Collection

from effecthost.conformance import SuiteReport

ENGINE_GAPS = frozenset({"payload_refs", "sealing", "payload_limit", "transient_faults"})
"""Capabilities a plain engine host (Restate, Temporal) does not declare."""


def assert_suite_passed(report: SuiteReport, *, may_miss: Collection[str] = ()) -> None:
    """No check failed and the host declares every capability but ``may_miss``. On a
    failure the table is printed with the tails of the logs of a kept run (what the
    engine did is the first thing a flaky run needs); a kept run that passed is removed."""
    print(report.table())
    failed = [f"{r.check.node_name}: {r.reason}" for r in report.by_status("failed")]
    if failed:
        for log in report.logs:
            lines = log.read_text(errors="replace").splitlines()
            print(f"--- the last lines of {log.name} ---", *lines[-60:], sep="\n")
    elif report.kept is not None:
        shutil.rmtree(report.kept, ignore_errors=True)
    assert not failed, "\n".join(failed)
    assert report.missing_capabilities() <= set(may_miss), report.table()
