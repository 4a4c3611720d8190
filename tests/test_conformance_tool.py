"""The conformance tool as a third party's CI uses it: failure text, reports, ``--keep``,
progress. Uses the memory factory, and broken hosts where a check must fail."""

from __future__ import annotations

import re

from test_cli import effecthost

BROKEN = "broken_hosts:widens_cancel_factory"
NARROWS = "close_only_narrows"
EVENT_LINE = re.compile(r"^ +\+\d+\.\d{3}s +started +s +attempt=1 .*pid=\d+", re.M)


def test_a_failing_check_names_the_last_lab_events_it_saw() -> None:
    """The failure text of a check lists the lab events (child starts, ends, gates) it
    saw last, so a third party sees what their host's children did before it failed."""
    run = effecthost("conformance", BROKEN, "-k", NARROWS)
    assert run.returncode == 1, run.stdout + run.stderr
    failure = run.stdout.split(f"FAILED {NARROWS}[G-26]: ", 1)[1]
    assert failure.startswith("CheckFailed: widening CANCEL: expected DispositionWidened")
    assert "last lab events" in failure.splitlines()[1]
    assert EVENT_LINE.search(failure), failure
    assert run.stdout.index(f"FAILED {NARROWS}") < run.stdout.index("obligation  checks")
