"""The contract depends on pydantic and the standard library only (SPEC §2)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import effecthost

PYDANTIC_STACK = (
    "pydantic",
    "pydantic_core",
    "typing_extensions",
    "annotated_types",
    "typing_inspection",
)
FORBIDDEN = ("effecthost.hosts", "effecthost.conformance", "effecthost.combinators")

FOOTPRINT = """
import json, sys
before = set(sys.modules)
import effecthost.contract
added = sorted(set(sys.modules) - before)
print(json.dumps({name: getattr(sys.modules[name], "__file__", None) for name in added}))
"""


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def is_stdlib(name: str, file: str | None) -> bool:
    """Listed by the interpreter, or a platform module living in the stdlib directory
    (``_sysconfigdata_*`` is not in ``sys.stdlib_module_names``)."""
    if name.split(".")[0] in sys.stdlib_module_names:
        return True
    stdlib = Path(sysconfig.get_path("stdlib"))
    return file is not None and "site-packages" not in file and stdlib in Path(file).parents


def test_contract_imports_only_stdlib_pydantic_and_itself() -> None:
    result = run("-c", FOOTPRINT)
    assert result.returncode == 0, result.stderr
    loaded: dict[str, str | None] = json.loads(result.stdout)
    assert "effecthost.contract" in loaded
    assert "pydantic" in loaded
    allowed = {"effecthost", *PYDANTIC_STACK}
    strays = sorted(
        name
        for name, file in loaded.items()
        if name.split(".")[0] not in allowed and not is_stdlib(name, file)
    )
    assert strays == []
    tiers = [name for name in loaded if name.startswith(FORBIDDEN)]
    assert tiers == []


def bare_path(tmp_path: Path) -> Path:
    """A directory holding only the pydantic stack and ``effecthost``, as links."""
    root = tmp_path / "bare"
    root.mkdir()
    for name in PYDANTIC_STACK:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        if spec.submodule_search_locations:
            (target,) = list(spec.submodule_search_locations)
            (root / name).symlink_to(target, target_is_directory=True)
        else:
            origin = Path(spec.origin)
            (root / origin.name).symlink_to(origin)
    package = Path(effecthost.__file__).parent
    (root / "effecthost").symlink_to(package, target_is_directory=True)
    return root


def run_bare(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    return run("-S", "-B", "-c", code, env={"PYTHONPATH": str(root)})


def test_contract_works_with_only_pydantic_installed(tmp_path: Path) -> None:
    root = bare_path(tmp_path)
    probe = (
        "import sys, effecthost.contract, pydantic\n"
        "assert not any('site-packages' in p for p in sys.path), sys.path\n"
        f"assert pydantic.__file__.startswith({str(root)!r}), pydantic.__file__\n"
        "print('ok')"
    )
    result = run_bare(root, probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_memory_host_works_in_the_bare_environment_and_pytest_is_absent(tmp_path: Path) -> None:
    root = bare_path(tmp_path)
    memory = run_bare(root, "import effecthost.hosts.memory; print('ok')")
    assert memory.returncode == 0, memory.stderr
    assert memory.stdout.strip() == "ok"
    absent = run_bare(root, "import pytest")
    assert absent.returncode != 0
    assert "ModuleNotFoundError" in absent.stderr
