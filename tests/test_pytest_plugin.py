"""The pytest plugin, run in a pytester sandbox with its own ini file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest

from effecthost.conformance import Check, all_checks
from effecthost.hosts.memory.testing import LimitedMemoryHostUnderTest, MemoryHostUnderTest

MEMORY = "effecthost.hosts.memory.testing:factory"
TESTS_DIR = Path(__file__).parent
TABLE_HEADER = "obligation  checks  passed"


@pytest.fixture
def sandbox(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester dir with an ini of its own (so this repository's ``effecthost_factory``
    is not inherited) and no factory in the environment."""
    monkeypatch.delenv("EFFECTHOST_FACTORY", raising=False)
    pytester.makeini("[pytest]\n")
    return pytester


def _runnable(
    checks: list[Check], host: type[MemoryHostUnderTest] = LimitedMemoryHostUnderTest
) -> tuple[int, int]:
    """(checks the memory host runs, checks it skips for an undeclared capability); the
    shipped factory's host declares its byte limit, a broken host's harness does not."""
    declared = set(host.capabilities.declared())
    runs = sum(1 for c in checks if set(c.requires) <= declared)
    return runs, len(checks) - runs


def test_plugin_is_inert_without_a_factory(sandbox: pytest.Pytester) -> None:
    sandbox.makepyfile("def test_plain():\n    assert True\n")
    result = sandbox.runpytest("-v")
    result.assert_outcomes(passed=1)
    output = result.stdout.str()
    assert "effecthost conformance" not in output
    assert TABLE_HEADER not in output
    assert "[G-" not in output


def test_factory_option_runs_every_check(sandbox: pytest.Pytester) -> None:
    result = sandbox.runpytest("--effecthost-factory", MEMORY, "-rs")
    passed, skipped = _runnable(all_checks())
    assert skipped, "the memory host declares no restart, so some checks must skip"
    result.assert_outcomes(passed=passed, skipped=skipped)
    output = result.stdout.str()
    assert TABLE_HEADER in output
    assert f"effecthost conformance: {MEMORY}" in output
    assert "host does not declare restart" in output
    declared = set(LimitedMemoryHostUnderTest.capabilities.declared())
    for check in all_checks():
        if not set(check.requires) <= declared:
            assert f"{check.name}: host does not declare" in output, check.name
    assert f"{len(all_checks())} checks: {passed} passed, 0 failed, {skipped} skipped" in output


def test_factory_from_the_ini_file(sandbox: pytest.Pytester) -> None:
    sandbox.makeini(f"[pytest]\neffecthost_factory = {MEMORY}\n")
    result = sandbox.runpytest("-k", "G-05")
    result.assert_outcomes(passed=len([c for c in all_checks() if "G-05" in c.ids]))
    assert TABLE_HEADER in result.stdout.str()


def test_ini_factory_stays_out_of_runs_of_chosen_files(sandbox: pytest.Pytester) -> None:
    sandbox.makeini(f"[pytest]\neffecthost_factory = {MEMORY}\n")
    chosen = sandbox.makepyfile("def test_plain():\n    assert True\n")
    result = sandbox.runpytest(str(chosen))
    result.assert_outcomes(passed=1)
    assert TABLE_HEADER not in result.stdout.str()


def test_keyword_selects_the_checks_of_one_obligation(sandbox: pytest.Pytester) -> None:
    covering = [c for c in all_checks() if "G-20" in c.ids]
    assert covering
    result = sandbox.runpytest("--effecthost-factory", MEMORY, "-k", "G-20", "-v")
    passed, skipped = _runnable(covering)
    result.assert_outcomes(
        passed=passed, skipped=skipped, deselected=len(all_checks()) - len(covering)
    )
    output = result.stdout.str()
    for check in all_checks():
        ran = f"{check.node_name} PASSED" in output or f"{check.node_name} SKIPPED" in output
        assert ran == ("G-20" in check.ids), check.node_name
    rows = {line.split()[0] for line in output.splitlines() if line.startswith("G-")}
    assert rows == {i for c in covering for i in c.ids}, "only the rows of the checks run"


def test_a_broken_host_fails_naming_the_check_and_its_ids(sandbox: pytest.Pytester) -> None:
    sandbox.syspathinsert(TESTS_DIR)
    result = sandbox.runpytest("--effecthost-factory", "broken_hosts:clamping_cursor_factory")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    passed, skipped = _runnable(all_checks(), MemoryHostUnderTest)
    result.assert_outcomes(failed=1, passed=passed - 1, skipped=skipped)
    output = result.stdout.str()
    assert (
        "both_sides_of_the_cursor_are_fenced[G-20] failed: CheckFailed: past the end: "
        "expected CursorExhausted, but it was accepted"
    ) in output
    assert TABLE_HEADER in output
    row = next(line for line in output.splitlines() if line.startswith("G-20 "))
    g20 = sum("G-20" in c.ids for c in all_checks())
    assert row.split()[:4] == ["G-20", str(g20), str(g20 - 1), "1"], row


def test_a_failing_item_names_the_last_lab_events(sandbox: pytest.Pytester) -> None:
    """A failing item's text lists the lab events its check saw last (child starts,
    ends, gates), as the CLI does."""
    sandbox.syspathinsert(TESTS_DIR)
    result = sandbox.runpytest(
        "--effecthost-factory", "broken_hosts:widens_cancel_factory", "-k", "close_only_narrows"
    )
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "close_only_narrows[G-26] failed: CheckFailed: widening CANCEL" in output
    assert "last lab events" in output
    assert re.search(r"^ +\+\d+\.\d{3}s +started +s +attempt=1 .*pid=\d+", output, re.M), output


def test_items_carry_their_obligation_ids_as_markers(sandbox: pytest.Pytester) -> None:
    """Each item has one ``obligation(id=...)`` marker per id it covers, registered so
    ``--strict-markers`` accepts ``-m "obligation(id='G-20')"``."""
    covering = [c for c in all_checks() if "G-20" in c.ids or "G-26" in c.ids]
    result = sandbox.runpytest(
        "--strict-markers",
        "--effecthost-factory",
        MEMORY,
        "-m",
        "obligation(id='G-20') or obligation(id='G-26')",
        "-v",
    )
    passed, skipped = _runnable(covering)
    result.assert_outcomes(
        passed=passed, skipped=skipped, deselected=len(all_checks()) - len(covering)
    )
    sandbox.makeconftest(
        "def pytest_collection_finish(session):\n"
        "    for item in session.items:\n"
        "        ids = [m.kwargs['id'] for m in item.iter_markers('obligation')]\n"
        "        assert ids == [m.args[0] for m in item.iter_markers('obligation')]\n"
        "        print('MARKS', item.name, ','.join(ids))\n"
    )
    listed = sandbox.runpytest("--strict-markers", "--effecthost-factory", MEMORY, "--co", "-s")
    marks = dict(line.split()[1:3] for line in listed.stdout.lines if line.startswith("MARKS "))
    assert marks == {c.node_name: ",".join(c.ids) for c in all_checks()}
    markers = sandbox.runpytest("--markers")
    assert "@pytest.mark.obligation(id)" in markers.stdout.str()
    junit = sandbox.path / "junit.xml"
    sandbox.runpytest("--effecthost-factory", MEMORY, "-k", "G-26", f"--junit-xml={junit}")
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    properties = {
        case.get("name"): [
            p.get("value") for p in case.iter("property") if p.get("name") == "obligations"
        ]
        for case in cases
    }
    assert properties == {c.node_name: [",".join(c.ids)] for c in all_checks() if "G-26" in c.ids}


def test_keep_option_keeps_the_run_and_prints_where(sandbox: pytest.Pytester) -> None:
    """``--effecthost-keep`` leaves the run's directory and names it (and its logs) in the
    summary, as ``effecthost conformance --keep`` does."""
    result = sandbox.runpytest(
        "--effecthost-factory",
        "effecthost.hosts.sql.testing:sqlite_factory",
        "--effecthost-keep",
        "-k",
        "open_returns_once_recorded",
    )
    result.assert_outcomes(passed=1)
    lines = result.stdout.lines
    kept = next(line for line in lines if line.startswith("kept: "))
    root = Path(kept.split()[1])
    try:
        assert (root / "work").is_dir() and (root / "lab").is_dir()
        logs = [Path(line.strip()) for line in lines if line.startswith("  ") and ".log" in line]
        assert [log.name for log in logs] == ["deployment.log"] and logs[0].is_file()
    finally:
        shutil.rmtree(root, ignore_errors=True)
