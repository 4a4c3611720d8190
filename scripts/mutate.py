"""Mechanical mutation of the reference host, the kit, the identity code and the
combinators, judged by the conformance suite alone (``./dev mutate``).

mutmut (configured in ``pyproject.toml``, ``[tool.mutmut]``) writes every mutant of those
files into a ``mutants/`` copy of the tree and runs ``tests/mutants/mutmut_suite.py`` (the
suite against the reference host) with each switched on. This script runs it in a work
directory of its own (a copy of ``src``, ``tests``, ``examples`` and ``pyproject.toml``, so mutmut's
copy never mixes with the checkout and a subprocess can only import the mutated tree),
then scores the run: killed (a failing check or a timeout) over every mutant not listed
in ``tests/mutants/equivalent.txt`` (a mutant in code no check reaches counts as a
survivor; a second figure leaves those out).

    python scripts/mutate.py                 # every mutant, 2 workers
    python scripts/mutate.py --sample        # the fixed CI sample (test_mutation_sample.py)
    python scripts/mutate.py 'effecthost.combinators.*'   # mutants by name (fnmatch)

It prints the survivors, the score and the run time, and writes them to
``<work>/summary.json``; it exits 1 when a mutant of the run survived.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tests" / "mutants" / "equivalent.txt"

SAMPLE = (
    "effecthost.combinators.x_all_settled__mutmut_*",
    "effecthost.combinators.x_settlements__mutmut_*",
    "effecthost.hosts.memory._host.xǁMemoryEffectHostǁwith_payloads__mutmut_*",
    "effecthost.hosts.memory._host.xǁMemoryEffectHostǁdrain__mutmut_*",
)
"""The CI sample (names are mutmut's: module, function, number): every mutant of
``all_settled`` and ``settlements`` and of the memory host's ``with_payloads`` and
``drain``, all killed by the full run."""

KILLED = {"killed", "timeout"}


def equivalent() -> dict[str, str]:
    """``name  reason`` lines of ``equivalent.txt`` (``#`` starts a comment)."""
    found: dict[str, str] = {}
    for line in EQUIVALENT.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, reason = line.partition(" ")
            found[name] = reason.strip()
    return found


def prepare(work: Path) -> None:
    """A fresh copy of what mutmut needs, without caches or an earlier run."""
    work.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache")
    for name in ("src", "tests", "examples"):
        shutil.rmtree(work / name, ignore_errors=True)
        shutil.copytree(ROOT / name, work / name, ignore=ignore, symlinks=True)
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")


def statuses(work: Path) -> dict[str, str]:
    """Every mutant of the run and its verdict, from mutmut's own records."""
    from mutmut.stats import status_by_exit_code

    found: dict[str, str] = {}
    for meta in (work / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        for name, code in data["exit_code_by_key"].items():
            found[name] = status_by_exit_code[code]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutant names or fnmatch patterns")
    parser.add_argument("--sample", action="store_true", help="only the fixed CI sample")
    parser.add_argument("--workers", type=int, default=2, help="mutants run at once")
    parser.add_argument("--work", type=Path, default=ROOT / ".mutmut", help="work directory")
    parser.add_argument("--score", action="store_true", help="only score the work dir's last run")
    args = parser.parse_args(argv)
    names = list(SAMPLE if args.sample else args.names)

    started = time.monotonic()
    work: Path = args.work.resolve()
    returncode = 0
    if not args.score:
        prepare(work)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(work / "src")  # mutmut replaces it with mutants/src
        env.pop("MUTANT_UNDER_TEST", None)
        mutmut = [sys.executable, "-c", "from mutmut.__main__ import cli; cli()"]
        returncode = subprocess.run(
            [*mutmut, "run", "--max-children", str(args.workers), *names], cwd=work, env=env
        ).returncode
    seconds = time.monotonic() - started

    verdicts = statuses(work)
    if names:
        verdicts = {k: v for k, v in verdicts.items() if any(fnmatch.fnmatch(k, n) for n in names)}
    known = equivalent()
    judged = {k: v for k, v in verdicts.items() if k not in known}
    killed = sorted(k for k, v in judged.items() if v in KILLED)
    survivors = sorted(k for k, v in judged.items() if v not in KILLED)
    unreached = [k for k in survivors if judged[k] == "no tests"]
    score = 100.0 * len(killed) / len(judged) if judged else 100.0
    reached = len(judged) - len(unreached)
    reached_score = 100.0 * len(killed) / reached if reached else 100.0
    summary = {
        "mutants": len(verdicts),
        "equivalent": len(verdicts) - len(judged),
        "killed": len(killed),
        "survived": {k: judged[k] for k in survivors},
        "unreached": len(unreached),
        "score": round(score, 1),
        "score_of_reached": round(reached_score, 1),
        "seconds": round(seconds),
        "workers": args.workers,
        "mutmut_exit": returncode,
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name in survivors:
        print(f"survived ({judged[name]}): {name}")
    print(
        f"{len(verdicts)} mutants, {summary['equivalent']} equivalent, {len(killed)} killed, "
        f"{len(survivors)} survived ({len(unreached)} in code no check reaches): score "
        f"{score:.1f} %, {reached_score:.1f} % of the mutants a check reaches, in "
        f"{seconds:.0f} s ({args.workers} workers)"
    )
    return 1 if survivors or not verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
