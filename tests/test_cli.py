"""The ``effecthost`` command, run as a child process."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from cli_support import cli

from effecthost.conformance import OBLIGATIONS, all_checks

MEMORY = "effecthost.hosts.memory.testing:factory"
TESTS_DIR = Path(__file__).parent
TABLE_HEADER = "obligation  checks  passed  failed  skipped  why skipped"


def effecthost(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``effecthost ARGS`` with ``broken_hosts`` importable and no host configured
    through the environment."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("EFFECTHOST_FACTORY", "EFFECTHOST_HOST")
    }
    return cli(*args, timeout=timeout, env=env)


def _table_rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    start = lines.index(TABLE_HEADER)
    return {
        line.split()[0]: line.split() for line in lines[start + 1 :] if re.match(r"G-\d+ ", line)
    }


def test_conformance_prints_the_obligation_table() -> None:
    run = effecthost("conformance", MEMORY)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = _table_rows(run.stdout)
    assert set(rows) == set(OBLIGATIONS), sorted(set(OBLIGATIONS) ^ set(rows))
    for row in rows.values():
        checks, passed, failed, skipped = map(int, row[1:5])
        assert checks >= 1 and failed == 0 and passed + skipped == checks, row
        if skipped:
            assert "host does not declare" in " ".join(row[5:]), row
    total = len(all_checks())
    assert re.search(rf"^{total} checks: \d+ passed, 0 failed, \d+ skipped$", run.stdout, re.M)
    for check in all_checks():
        assert re.search(rf"^(PASS|SKIP)  {re.escape(check.node_name)} ", run.stdout, re.M)


def test_keyword_runs_only_the_checks_of_one_obligation() -> None:
    run = effecthost("conformance", MEMORY, "-k", "G-05")
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"^(?:PASS|FAIL|SKIP)  (\S+)", run.stdout, re.M)
    expected = [c.node_name for c in all_checks() if "G-05" in c.ids]
    assert ran == expected
    assert f"{len(expected)} checks: {len(expected)} passed, 0 failed, 0 skipped" in run.stdout
    rows = _table_rows(run.stdout)
    assert rows["G-05"][1:3] == [str(len(expected))] * 2
    ran_ids = {i for c in all_checks() if "G-05" in c.ids for i in c.ids}
    assert set(rows) == ran_ids, "the table lists only the obligations of the checks it ran"


def test_a_broken_factory_exits_1() -> None:
    run = effecthost("conformance", "broken_hosts:widens_cancel_factory")
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(
        r"^FAIL  close_only_narrows\[G-26\] .*DispositionWidened, but it was accepted",
        run.stdout,
        re.M,
    ), run.stdout
    assert _table_rows(run.stdout)["G-26"][3] == "1"


def _listed(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines() if line and not line[0].isspace()]


def test_list_names_every_check_with_its_whole_description() -> None:
    run = effecthost("conformance", "--list")
    assert run.returncode == 0, run.stderr
    assert _listed(run.stdout) == [c.node_name for c in all_checks()]
    flat = " ".join(run.stdout.split())
    for check in all_checks():
        assert " ".join(check.doc.split()) in flat, check.name
    only = effecthost("conformance", "--list", "-k", "G-26")
    assert _listed(only.stdout) == [c.node_name for c in all_checks() if "G-26" in c.ids]


def test_explain_prints_a_rule_and_its_checks() -> None:
    run = effecthost("conformance", "--explain", "G-20")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("G-20 · ")
    assert "CursorExhausted" in run.stdout and "HandleMismatch" in run.stdout
    for check in all_checks():
        if "G-20" in check.ids:
            assert check.node_name in run.stdout
    ruling = effecthost("conformance", "--explain", "R-4")
    assert ruling.returncode == 0 and ruling.stdout.startswith("R-4 · Closed means closed")


def test_explain_of_an_unknown_id_is_a_one_line_error() -> None:
    run = effecthost("conformance", "--explain", "G-99")
    assert run.returncode == 2
    assert run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "G-99" in run.stderr


def test_conformance_without_a_factory_is_a_usage_error() -> None:
    run = effecthost("conformance")
    assert run.returncode == 2
    assert "MODULE:FACTORY" in run.stderr


def test_demo_survives_a_sigkill_with_the_same_ranks() -> None:
    run = effecthost("demo", "--slow", "1", "--deadline", "0.05")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "deadline won" in out
    assert "the first rejection in rank order" in out
    assert "SIGKILL -> worker" in out
    assert "ranks 1-2 are byte-identical to what the killed worker read" in out
    assert "settlement order by position: [0, 2, 1, 3]; group closed" in out


def test_inspect_without_a_host_exits_2() -> None:
    run = effecthost("inspect")
    assert run.returncode == 2
    assert "--host MODULE:ATTR" in run.stderr
    assert run.stdout == ""
