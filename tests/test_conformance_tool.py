"""The conformance tool as a third party's CI uses it: failure text, reports, ``--keep``,
progress. Uses the memory factory, and broken hosts where a check must fail."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

from cli_support import cli_env, on_a_terminal
from test_cli import effecthost

from effecthost.conformance import HostCapabilities, all_checks
from effecthost.hosts.memory.testing import MemoryHostUnderTest

MEMORY = "effecthost.hosts.memory.testing:factory"
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


def test_junit_and_json_reports_for_ci(tmp_path: Path) -> None:
    """``--junit-xml`` writes one testcase per check run (classname its obligation ids,
    skips with their reason, failures with the failure text); ``--json`` each check with
    its ids, status, duration and reason, and the factory's declared capabilities."""
    junit, report = tmp_path / "conformance.xml", tmp_path / "conformance.json"
    run = effecthost(
        "conformance",
        BROKEN,
        "-k",
        "G-26 or G-29",
        "--junit-xml",
        str(junit),
        "--json",
        str(report),
    )
    assert run.returncode == 1, run.stdout + run.stderr
    ran = [c for c in all_checks() if {"G-26", "G-29"} & set(c.ids)]
    declared = MemoryHostUnderTest.capabilities.declared()
    undeclared = {c.name: [r for r in c.requires if r not in declared] for c in ran}
    skipped = {name: missing for name, missing in undeclared.items() if missing}
    assert skipped and len(skipped) < len(ran) - 1

    suite = ElementTree.parse(junit).getroot()
    assert suite.tag == "testsuites"
    cases = suite.findall("testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        (",".join(c.ids), c.name) for c in ran
    ]
    by_name = {c.get("name"): c for c in cases}
    failure = by_name[NARROWS].find("failure")
    assert failure is not None and failure.get("message", "").startswith("CheckFailed: widening")
    assert "last lab events" in (failure.text or "")
    for name, missing in skipped.items():
        skip = by_name[name].find("skipped")
        assert skip is not None
        assert skip.get("message") == f"host does not declare {', '.join(missing)}"
    for case in cases:
        assert float(case.get("time", "-1")) >= 0
    testsuite = suite.find("testsuite")
    assert testsuite is not None
    assert (testsuite.get("tests"), testsuite.get("failures"), testsuite.get("skipped")) == (
        str(len(ran)),
        "1",
        str(len(skipped)),
    )

    data = json.loads(report.read_text())
    assert data["factory"] == BROKEN and data["ok"] is False
    assert data["capabilities"] == {
        name: name in MemoryHostUnderTest.capabilities.declared()
        for name in HostCapabilities.__dataclass_fields__
    }
    assert data["summary"] == {
        "checks": len(ran),
        "passed": len(ran) - len(skipped) - 1,
        "failed": 1,
        "skipped": len(skipped),
    }
    assert [(c["name"], c["ids"]) for c in data["checks"]] == [(c.name, list(c.ids)) for c in ran]
    for entry in data["checks"]:
        assert entry["seconds"] >= 0
        if entry["name"] == NARROWS:
            assert entry["status"] == "failed"
            assert entry["reason"].startswith("CheckFailed: widening CANCEL")
            assert "last lab events" in entry["failure"]
            assert "started" in [e["kind"] for e in entry["events"]]
        elif entry["name"] in skipped:
            assert entry["status"] == "skipped"
            missing = skipped[entry["name"]]
            assert entry["reason"] == f"host does not declare {', '.join(missing)}"
            assert entry["missing"] == missing
        else:
            assert entry["status"] == "passed" and entry["reason"] == ""


def _kept(stdout: str) -> tuple[Path, list[Path]]:
    """The work dir and the logs a ``--keep`` run printed at its end."""
    tail = stdout.split("\nkept: ", 1)[1]
    root = Path(tail.splitlines()[0].split()[0])
    logs = [Path(line.strip()) for line in tail.splitlines()[1:] if line.startswith("  ")]
    return root, logs


def test_keep_leaves_the_work_dir_and_prints_where_it_is() -> None:
    """Without ``--keep`` nothing of the run is left; with it, the work dir and the lab
    stay and their place is printed after the table."""
    run = effecthost("conformance", MEMORY, "-k", "G-05", "--keep")
    assert run.returncode == 0, run.stdout + run.stderr
    root, logs = _kept(run.stdout)
    try:
        assert run.stdout.index("obligation  checks") < run.stdout.index("\nkept: ")
        assert (root / "work").is_dir() and (root / "lab").is_dir()
        assert logs == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    plain = effecthost("conformance", MEMORY, "-k", "G-05")
    assert "kept:" not in plain.stdout


def test_keep_keeps_the_logs_of_every_process_of_the_sql_factories() -> None:
    """The deployment process of the SQLite factory and, for PostgreSQL, the server and
    the deployment keep their logs, and each is printed."""
    for factory, expected in (
        ("effecthost.hosts.sql.testing:sqlite_factory", {"deployment.log"}),
        ("effecthost.hosts.sql.testing:postgres_factory", {"deployment.log", "postgres.log"}),
    ):
        run = effecthost("conformance", factory, "-k", "open_returns_once_recorded", "--keep")
        assert run.returncode == 0, run.stdout + run.stderr
        root, logs = _kept(run.stdout)
        try:
            assert {log.name for log in logs} == expected, logs
            for log in logs:
                assert log.is_file(), log
            if "postgres" in factory:
                server_log = next(log for log in logs if log.name == "postgres.log")
                assert "database system is ready" in server_log.read_text()
        finally:
            for log in logs:
                shutil.rmtree(log.parent, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """Run ``effecthost ARGS`` with its stdout on a pseudo-terminal; (exit code, output)."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTHOST_FACTORY"}
    env["COLUMNS"] = "200"
    return on_a_terminal(*args, env=cli_env(env))


def test_progress_on_a_terminal_and_plain_lines_elsewhere() -> None:
    """On a terminal the running check and how many are left are shown on a status line
    that each result overwrites; piped, the output is one line per result, then the
    table, with no control characters."""
    selection = "G-05 or G-26"
    ran = [c for c in all_checks() if {"G-05", "G-26"} & set(c.ids)]
    code, shown = _on_a_terminal("conformance", MEMORY, "-k", selection)
    assert code == 0, shown
    for number, check in enumerate(ran, 1):
        status = f"\r\x1b[K[{number}/{len(ran)}, {len(ran) - number} left] {check.node_name}"
        assert status in shown, (status, shown)
        declared = set(MemoryHostUnderTest.capabilities.declared())
        word = "PASS" if set(check.requires) <= declared else "SKIP"
        assert re.search(rf"\r\x1b\[K{word}  {re.escape(check.node_name)} ", shown), shown
    piped = effecthost("conformance", MEMORY, "-k", selection)
    assert piped.returncode == 0
    lines = piped.stdout.splitlines()
    assert [line.split()[1] for line in lines[: len(ran)]] == [c.node_name for c in ran]
    assert lines[len(ran)] == "" and lines[len(ran) + 1].startswith("obligation  checks")
    assert "\x1b" not in piped.stdout and "\r" not in piped.stdout
