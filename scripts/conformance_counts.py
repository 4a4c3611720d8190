"""The counts ``docs/conformance.md`` states, generated from the suite and the catalog.

Each generated part of the page sits between ``<!-- counts:NAME -->`` and
``<!-- /counts:NAME -->``. ``python scripts/conformance_counts.py`` rewrites them;
``--check`` exits 1 when the page disagrees (``tests/test_conformance_counts.py`` runs it,
so a new check or mutant without the page updated fails CI).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest  # noqa: F401  (file_mutants registers its mutants only under pytest)

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "conformance.md"

SHIPPED = (
    ("effecthost.hosts.memory.testing:factory", "LimitedMemoryHostUnderTest"),
    ("effecthost.hosts.memory.testing:adversarial_factory", "MemoryHostUnderTest"),
    ("effecthost.hosts.memory.testing:sealed_factory", "SealedMemoryHostUnderTest"),
    (
        "effecthost.hosts.sql.testing:sqlite_factory`, `:postgres_factory",
        "SqlHostUnderTest",
    ),
    (
        "effecthost.hosts.sql.testing:sqlite_sealed_factory`, `:postgres_sealed_factory",
        "SealedSqlHostUnderTest",
    ),
    ("effecthost.hosts.restate.testing:factory", "RestateHostUnderTest"),
    ("effecthost.hosts.restate.testing:sealed_factory", "SealedRestateHostUnderTest"),
    ("effecthost.hosts.temporal.testing:factory", "TemporalHostUnderTest"),
    ("effecthost.hosts.temporal.testing:sealed_factory", "SealedTemporalHostUnderTest"),
)
"""Each shipped factory and the class whose capabilities it declares."""


def _capabilities(spec: str, cls_name: str) -> tuple[str, ...]:
    import importlib

    module = importlib.import_module(spec.split(":", 1)[0])
    declared = getattr(module, cls_name).capabilities
    return tuple(name for name, on in sorted(vars(declared).items()) if on is True)


def factories() -> str:
    from effecthost.conformance import all_checks

    checks = all_checks()
    rows = [
        f"| factory | declares | runs / skips (of {len(checks)} checks) |",
        "|---|---|---|",
    ]
    for spec, cls_name in SHIPPED:
        declared = _capabilities(spec, cls_name)
        skipped = sum(1 for c in checks if any(r not in declared for r in c.requires))
        names = ", ".join(f"`{d}`" for d in declared) or "nothing"
        rows.append(f"| `{spec}` | {names} | {len(checks) - skipped} / {skipped} |")
    return "\n".join(rows)


def _catalog() -> tuple[list[object], list[object]]:
    sys.path.insert(0, str(ROOT / "tests" / "mutants"))
    sys.path.insert(0, str(ROOT))
    import file_mutants  # noqa: F401
    import library_mutants  # noqa: F401
    import memory_mutants  # noqa: F401
    import refusal_mutants  # noqa: F401
    import sql_mutants  # noqa: F401
    from catalog import CATALOG
    from tier_mutants import TIER_MUTANTS

    return list(CATALOG), list(TIER_MUTANTS)


def _tier(mutant: object) -> str:
    first = getattr(mutant, "tests", ("tests/sql",))[0]
    return "Restate" if "restate" in first else "Temporal" if "temporal" in first else "SQL"


def summary() -> str:
    from effecthost.conformance import all_checks
    from effecthost.conformance._spec import cites

    checks = all_checks()
    obligations = {i for c in checks for i in c.ids if i.startswith("G-")}
    others = [f"G-{n:02d}" for n in range(1, 54) if f"G-{n:02d}" not in obligations]
    rulings = {f"R-{n}" for n in range(1, 14) if any(cites(c.ids, c.doc, f"R-{n}") for c in checks)}
    suite, tier = _catalog()
    harness = Counter(getattr(m, "harness", "") for m in suite)
    tiers = Counter(_tier(m) for m in tier)
    order = ("memory", "durable", "sealed", "sqlite", "routed", "library", "file")
    parts = ", ".join(f"{harness[h]} {h}" for h in order if harness[h])
    tier_parts = ", ".join(f"{tiers[t]} {t}" for t in ("SQL", "Restate", "Temporal") if tiers[t])
    return (
        f"**{len(checks)} checks** cite {len(obligations)} obligations and "
        f"{len(rulings)} rulings; the other obligations ({', '.join(others)}) are a tier's "
        "own machinery, checked by that tier's tests. "
        f"**The catalog: {len(suite) + len(tier)} mutants, each killed on its own id** — "
        f"{len(suite)} against the suite ({parts}) and {len(tier)} tier mutants "
        f"({tier_parts}) against the tier tests."
    )


def _id_key(ident: str) -> tuple[int, int]:
    kind, _, number = ident.partition("-")
    return (0 if kind == "G" else 1, int(number) if number.isdigit() else 0)


def ids() -> str:
    suite, tier = _catalog()
    per = Counter(getattr(m, "breaks", "") for m in suite + tier)
    cells = [f"| {i} | {per[i]} |" for i in sorted(per, key=_id_key)]
    columns = 4
    height = -(-len(cells) // columns)
    grid = [cells[c * height : (c + 1) * height] for c in range(columns)]
    rows = ["| id | mutants " * columns + "|", "|---|---" * columns + "|"]
    for r in range(height):
        row = ""
        for col in grid:
            row += col[r][:-1] if r < len(col) else "|  |  "
        rows.append(row + "|")
    return "\n".join(rows)


PARTS = {"factories": factories, "summary": summary, "ids": ids}


def render(text: str) -> str:
    for name, make in PARTS.items():
        pattern = re.compile(
            rf"(<!-- counts:{name} -->\n)(?:.*?\n)?(<!-- /counts:{name} -->)", re.DOTALL
        )
        if not pattern.search(text):
            raise SystemExit(f"{PAGE.name}: no <!-- counts:{name} --> block")
        made = make()
        text = pattern.sub(lambda m, made=made: m.group(1) + made + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    fresh = render(text)
    if "--check" in argv:
        if fresh != text:
            print(f"{PAGE} is stale: run python scripts/conformance_counts.py")
            return 1
        return 0
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
