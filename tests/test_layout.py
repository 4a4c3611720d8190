"""Layout rules: a tier never imports another tier; the contract imports no tier, no
suite and no third-party package but pydantic (the runtime pin is in
test_contract_imports.py; this reads the source, so a lazy import cannot hide)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import effecthost

PACKAGE = Path(effecthost.__file__).parent
TIERS = sorted(p.name for p in (PACKAGE / "hosts").iterdir() if (p / "__init__.py").exists())


def imported_modules(directory: Path) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in directory.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update((path.name, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((path.name, node.module))
    return found


def test_the_tier_packages_cover_the_five_tiers() -> None:
    """SQLite and Postgres share `sql`."""
    assert TIERS == ["memory", "restate", "sql", "temporal"]


@pytest.mark.parametrize("tier", TIERS)
def test_a_tier_never_imports_another_tier(tier: str) -> None:
    others = [f"effecthost.hosts.{other}" for other in TIERS if other != tier]
    offending = {
        (file, module)
        for file, module in imported_modules(PACKAGE / "hosts" / tier)
        if any(module == o or module.startswith(o + ".") for o in others)
    }
    assert not offending


def test_the_contract_imports_no_tier_and_no_third_party_package() -> None:
    import sys

    allowed_third_party = {"pydantic", "pydantic_core", "typing_extensions"}
    for file, module in imported_modules(PACKAGE / "contract"):
        top = module.split(".")[0]
        assert top in sys.stdlib_module_names or top in allowed_third_party, (file, module)
        assert not module.startswith("effecthost"), (file, module)
