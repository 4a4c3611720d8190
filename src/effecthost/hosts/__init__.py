"""The tiers. Each lives in its own subpackage and never imports another tier.

``memory`` needs nothing beyond the core install. The engine and database tiers
(``sql``, ``restate``, ``temporal``) load their drivers lazily and, when the extra is
missing, fail with :class:`MissingExtra` naming the install command.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """A tier's optional dependencies are not installed."""

    def __init__(self, tier: str, extra: str, missing: str) -> None:
        super().__init__(
            f"the {tier} host needs the {missing!r} package: pip install 'effecthost[{extra}]'"
        )
        self.tier = tier
        self.extra = extra
        self.missing = missing


class EngineMissing(FileNotFoundError):
    """An engine's or database's executable (``restate-server``, ``temporal``,
    ``initdb``…) is not installed where a test factory looks for it.

    Attributes:
        engine: what is missing.
        install: the command (or setting) that provides it.
    """

    def __init__(self, engine: str, install: str) -> None:
        super().__init__(f"{engine} not found: {install}")
        self.engine = engine
        self.install = install


def require(tier: str, extra: str, *modules: str) -> list[ModuleType]:
    """Import a tier's third-party ``modules`` or raise :class:`MissingExtra`."""
    loaded: list[ModuleType] = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as exc:
            raise MissingExtra(tier, extra, name.split(".")[0]) from exc
    return loaded


__all__ = ["EngineMissing", "MissingExtra", "require"]
