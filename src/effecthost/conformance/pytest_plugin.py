"""pytest plugin (entry point ``pytest11``), inert until a host factory is configured.

Configure with ``--effecthost-factory MODULE:FACTORY``, the ini option
``effecthost_factory`` or the ``EFFECTHOST_FACTORY`` environment variable. A factory set
only in the ini file applies to runs without explicit paths (the whole test suite), so
``pytest tests/test_x.py`` runs just that file. Every check
becomes a test item named ``check_name[G-xx,…]`` (so ``-k G-12`` selects an obligation)
carrying one ``obligation(id)`` marker per id it covers (``-m "obligation(id='G-12')"``
selects the same, and ``--strict-markers`` accepts it), undeclared capabilities are skips
with the reason, and the run ends with the obligation table. ``--effecthost-keep`` keeps
the run's work dir and the factory's logs and names them in the summary.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from ._registry import Check, all_checks
from ._runner import CheckResult, SuiteRun, load_factory, obligation_table

OPTION = "--effecthost-factory"
KEEP = "--effecthost-keep"
INI = "effecthost_factory"
ENV = "EFFECTHOST_FACTORY"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("effecthost", "effecthost conformance suite")
    group.addoption(
        OPTION,
        dest="effecthost_factory",
        default=None,
        metavar="MODULE:FACTORY",
        help="run the effecthost conformance checks against this host factory",
    )
    group.addoption(
        KEEP,
        dest="effecthost_keep",
        action="store_true",
        default=False,
        help="keep the conformance run's work dir and the logs of every process the "
        "factory started; the summary says where",
    )
    parser.addini(INI, "host factory MODULE:FACTORY for the effecthost conformance checks")


def _factory_spec(config: pytest.Config) -> str | None:
    spec = config.getoption("effecthost_factory") or os.environ.get(ENV) or config.getini(INI)
    return str(spec) if spec else None


MARKER = "obligation"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(id): an effecthost conformance check covering obligation id (G-20); "
        f"select with -m \"{MARKER}(id='G-20')\"",
    )
    spec = _factory_spec(config)
    if not spec:
        return
    explicit = config.getoption("effecthost_factory") or os.environ.get(ENV)
    if not explicit and config.args_source == pytest.Config.ArgsSource.ARGS:
        return  # an ini default: a run of chosen test files does not also run the suite
    plugin = ConformancePlugin(spec, keep=bool(config.getoption("effecthost_keep")))
    config.pluginmanager.register(plugin, "effecthost-conformance")


class ConformanceFailure(Exception):
    """A check failed; the message is the check's own account."""


class ConformanceItem(pytest.Item):
    def __init__(self, *, check: Check, plugin: ConformancePlugin, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.plugin = plugin
        for obligation in check.ids:
            self.keywords[obligation] = True
            self.add_marker(getattr(pytest.mark, MARKER)(obligation, id=obligation))
        self.user_properties.append(("obligations", ",".join(check.ids)))

    def runtest(self) -> None:
        result = self.plugin.run(self.check)
        if result.status == "skipped":
            pytest.skip(f"{self.check.name}: {result.reason}")
        if result.status == "failed":
            raise ConformanceFailure(result.failure_text())

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.check.node_name} failed: {excinfo.value}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return (f"effecthost-conformance[{self.plugin.spec}]", None, self.check.node_name)


class ConformancePlugin:
    """Owns the event loop, the host and the lab for the whole pytest run."""

    def __init__(self, spec: str, *, keep: bool = False) -> None:
        self.spec = spec
        self.keep = keep
        self._kept: tuple[Path, list[Path]] | None = None
        self.results: list[CheckResult] = []
        self._runner: asyncio.Runner | None = None
        self._suite: SuiteRun | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        for check in all_checks():
            items.append(
                ConformanceItem.from_parent(session, name=check.node_name, check=check, plugin=self)
            )

    def run(self, check: Check) -> CheckResult:
        if self._runner is None:
            self._runner = asyncio.Runner()
            self._suite = SuiteRun(load_factory(self.spec), keep=self.keep)
            self._runner.run(self._suite.start())
        assert self._suite is not None
        result = self._runner.run(self._suite.run(check))
        self.results.append(result)
        return result

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._runner is not None:
            try:
                if self._suite is not None:
                    self._runner.run(self._suite.stop())
                    if self.keep and self._suite.root is not None:
                        self._kept = (self._suite.root, self._suite.logs())
            finally:
                self._runner.close()
                self._runner = None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.results:
            terminalreporter.section(f"effecthost conformance: {self.spec}")
            terminalreporter.write_line(obligation_table(self.results))
        if self._kept is not None:
            root, logs = self._kept
            terminalreporter.write_line(f"kept: {root} (the factory's work/ and the lab's lab/)")
            terminalreporter.write_line("logs:" if logs else "logs: none written under it")
            for log in logs:
                terminalreporter.write_line(f"  {log}")
