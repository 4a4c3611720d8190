"""The pytest plugin, run in a pytester sandbox with its own ini file."""

from __future__ import annotations

from pathlib import Path

import pytest

from effecthost.conformance import Check, all_checks
from effecthost.hosts.memory.testing import MemoryHostUnderTest

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


def _runnable(checks: list[Check]) -> tuple[int, int]:
    """(checks the memory host runs, checks it skips for an undeclared capability)."""
    declared = set(MemoryHostUnderTest.capabilities.declared())
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
    declared = set(MemoryHostUnderTest.capabilities.declared())
    for check in all_checks():
        if not set(check.requires) <= declared:
            assert f"{check.name}: host does not declare" in output, check.name
    assert f"{len(all_checks())} checks: {passed} passed, 0 failed, {skipped} skipped" in output


def test_factory_from_the_ini_file(sandbox: pytest.Pytester) -> None:
    sandbox.makeini(f"[pytest]\neffecthost_factory = {MEMORY}\n")
    result = sandbox.runpytest("-k", "G-05")
    result.assert_outcomes(passed=1)
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


def test_a_broken_host_fails_naming_the_check_and_its_ids(sandbox: pytest.Pytester) -> None:
    sandbox.syspathinsert(TESTS_DIR)
    result = sandbox.runpytest("--effecthost-factory", "broken_hosts:clamping_cursor_factory")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    passed, skipped = _runnable(all_checks())
    result.assert_outcomes(failed=1, passed=passed - 1, skipped=skipped)
    output = result.stdout.str()
    assert (
        "both_sides_of_the_cursor_are_fenced[G-20] failed: CheckFailed: past the end: "
        "expected CursorExhausted, but it was accepted"
    ) in output
    assert TABLE_HEADER in output
    row = next(line for line in output.splitlines() if line.startswith("G-20 "))
    assert row.split()[:4] == ["G-20", "2", "1", "1"], row
