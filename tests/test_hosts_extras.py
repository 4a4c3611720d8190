"""Tiers load their third-party packages lazily, with an install hint when missing."""

import sys

import pytest

from effecthost.hosts import MissingExtra, require


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    with pytest.raises(MissingExtra) as caught:
        require("postgres", "postgres", "json", "asyncpg")
    assert caught.value.tier == "postgres"
    assert caught.value.missing == "asyncpg"
    assert "pip install 'effecthost[postgres]'" in str(caught.value)
    assert isinstance(caught.value, ImportError)


def test_present_modules_are_returned_in_order() -> None:
    modules = require("memory", "none", "json", "asyncio")
    assert [m.__name__ for m in modules] == ["json", "asyncio"]


def test_memory_tier_needs_no_extra() -> None:
    import effecthost.hosts.memory as memory

    assert memory.MemoryEffectHost().supports_effect_groups() is False
