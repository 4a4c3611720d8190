"""The host-writing guide's example host runs the conformance suite in CI, and the guide
shows its real code."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effecthost.conformance import (
    FactoryEnv,
    ProcessHostUnderTest,
    all_checks,
    mark_killed,
    run_suite,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "file_host"
GUIDE = ROOT / "docs" / "writing-a-host.md"
GLUE_LIMIT = 200

pytestmark = pytest.mark.anyio


async def passes_what_it_declares(factory: Callable[[FactoryEnv], Any]) -> str:
    """Run the suite against an example host: nothing fails, restart, the durable timers
    and the waiter probe are declared, and only checks needing an undeclared capability
    are skipped. The run's summary line."""
    report = await run_suite(factory)
    failed = [f"{r.check.node_name}: {r.reason}" for r in report.by_status("failed")]
    assert not failed, "\n".join(failed)
    declared = set(report.capabilities.declared()) if report.capabilities else set()
    assert {"restart", "durable_timers", "waiter_probe"} <= declared
    for result in report.by_status("skipped"):
        assert not set(result.check.requires) <= declared, result.check.node_name
    assert len(report.results) == len(all_checks())
    counts = {s: len(report.by_status(s)) for s in ("passed", "failed", "skipped")}
    return (
        f"{len(report.results)} checks: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped"
    )


@pytest.fixture
def example_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


async def test_the_file_host_passes_every_check_it_declares(example_importable: None) -> None:
    """The example host passes every check its capabilities allow; the only skips are
    checks needing a capability it does not declare (restart, the durable timers and the
    waiter probe are declared, so none of their checks is skipped). The guide shows the
    summary line this run prints."""
    from examples.file_host.testing import factory

    summary = await passes_what_it_declares(factory)
    guide = (ROOT / "docs" / "writing-a-host.md").read_text()
    assert f"\n{summary}\n" in guide, f"the guide's example output is not {summary!r}"


async def test_a_restart_that_leaves_the_old_process_running_fails(
    example_importable: None,
) -> None:
    """G-15, G-28 (issue 12, item 5): the example's harness is honest. A factory whose
    restart marks the deployment process killed but leaves it running (its children still
    run) fails the restart check: the lab refuses the zombie's events."""
    from examples.file_host.testing import factory

    zombies: list[subprocess.Popen[bytes]] = []

    class Zombie(ProcessHostUnderTest):
        async def restart(self) -> None:
            proc, self._proc = self._proc, None
            await super().restart()
            if proc is not None:
                zombies.append(proc)
                mark_killed(self._env.lab_path, proc.pid)

        async def aclose(self) -> None:
            await super().aclose()
            for proc in zombies:
                proc.kill()
                proc.wait()

    def zombie_factory(env: FactoryEnv) -> ProcessHostUnderTest:
        capabilities = factory(env).capabilities
        return Zombie(env, "examples.file_host.testing:build", capabilities=capabilities)

    report = await run_suite(zombie_factory, select="drain_finishes_losers")
    (result,) = report.results
    assert result.status == "failed" and "killed process" in result.reason, result.reason


async def test_the_deployment_log_starts_clean(example_importable: None) -> None:
    """The deployment process is started without ``-m`` on a module its package already
    imported, so its log does not begin with runpy's ``RuntimeWarning``."""
    from examples.file_host.testing import factory

    kept: list[Path] = []
    report = await run_suite(
        factory, select="G-16", keep=True, on_kept=lambda _root, logs: kept.extend(logs)
    )
    assert report.results and not report.by_status("failed")
    logs = [p for p in kept if p.name == "deployment.log"]
    assert logs, kept
    for log in logs:
        assert "RuntimeWarning" not in log.read_text(), log.read_text()[:500]


def code_lines(path: Path) -> int:
    """Lines holding code: no blank lines, comments or docstrings."""
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip and token.type != tokenize.ENDMARKER:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_the_engine_glue_stays_small() -> None:
    """The guide's claim: the host's engine glue (``host.py``) is at most 200 lines of
    code, and the guide states the number it has."""
    count = code_lines(EXAMPLE / "host.py")
    assert count <= GLUE_LIMIT, f"host.py has {count} lines of code"
    assert f"{count} lines of code" in GUIDE.read_text(), f"the guide must say {count}"


EXCERPT = re.compile(
    r"<!-- excerpt: (?P<file>\S+) (?P<name>\S+) -->\n```python\n(?P<body>.*?)```", re.S
)


def region(path: Path, name: str) -> str:
    """The lines between ``# [name]`` and ``# [/name]`` in ``path``, dedented."""
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == f"# [{name}]"]
    ends = [i for i, line in enumerate(lines) if line.strip() == f"# [/{name}]"]
    assert len(starts) == len(ends) == 1, f"{path.name} must mark region {name!r} once"
    body = lines[starts[0] + 1 : ends[0]]
    while body and not body[-1].strip():
        body.pop()
    indent = min(len(line) - len(line.lstrip()) for line in body if line.strip())
    return "".join(line[indent:] + "\n" for line in body)


def test_the_guide_shows_the_real_code() -> None:
    """Every excerpt in the guide is the marked region of the file it names, verbatim,
    and together they show all of host.py between its imports and its end."""
    text = GUIDE.read_text()
    excerpts = list(EXCERPT.finditer(text))
    assert excerpts, "the guide has no excerpts"
    for match in excerpts:
        expected = region(ROOT / match["file"], match["name"])
        assert match["body"] == expected, (
            f"the guide's excerpt {match['file']} {match['name']} differs from the file; "
            f"run: python {Path(__file__).relative_to(ROOT)} to rewrite the excerpts"
        )
    shown = {(m["file"], m["name"]) for m in excerpts}
    host = ROOT / "examples/file_host/host.py"
    for name in re.findall(r"^\s*# \[(\w+)\]$", host.read_text(), re.M):
        assert ("examples/file_host/host.py", name) in shown, f"host.py region {name} not shown"


def rewrite_excerpts() -> None:
    """Replace every excerpt in the guide with the current region of its file."""
    text = GUIDE.read_text()

    def fresh(match: re.Match[str]) -> str:
        body = region(ROOT / match["file"], match["name"])
        return f"<!-- excerpt: {match['file']} {match['name']} -->\n```python\n{body}```"

    GUIDE.write_text(EXCERPT.sub(fresh, text))


if __name__ == "__main__":
    rewrite_excerpts()
    sys.exit(0)
