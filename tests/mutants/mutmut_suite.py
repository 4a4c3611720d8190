"""The judge of ``./dev mutate``: the conformance suite, and only it, one item per check
and harness, so mutmut runs a mutant against the checks that reach its function.

Harnesses (each one :class:`SuiteRun` for the whole pytest process, started lazily):

- ``memory``: the reference host as its factory runs it.
- ``durable``: the reference host over a record that outlives a restart (the catalog's
  harness), so the restart, drain and timer checks run.
- ``sealed``: with payload references and sealing.
- ``adversarial``: late, shuffled and duplicated settlements, so the fences also meet
  children that already settled.
- ``file``: the guide's example host (``examples/file_host``), built on the kit, in this
  process: the kit's controller, ledger and drain rules run only there. A restart cancels
  the incarnation's tasks without recording and drops its owner lock, as a killed
  process would; the directory survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from catalog import DurableMemoryHostUnderTest, _MortalLabClient

from effecthost.conformance import (
    FactoryEnv,
    HostCapabilities,
    HostUnderTest,
    all_checks,
    conformance_resolver,
)
from effecthost.conformance._host import FaultedStep
from effecthost.conformance._registry import Check
from effecthost.conformance._runner import SuiteRun
from effecthost.contract import EffectController
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.memory.testing import adversarial_factory, factory, sealed_factory

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the examples package

from examples.file_host.faults import FaultyFileHost
from examples.file_host.host import FileHost
from examples.file_host.store import FileStore, Record


class _UnsyncedStore(FileStore):
    """The example's store without ``fsync``: the judge kills no machine, only processes,
    and a write that reaches the page cache is what every later read sees."""

    def write(self, record: Record) -> None:
        temp = self._path(record["key"]).with_suffix(".tmp")
        temp.write_text(json.dumps(record))
        os.replace(temp, self._path(record["key"]))


class InProcessFileHostUnderTest(HostUnderTest):
    """The example file host, each incarnation a pair of host objects in this process."""

    capabilities = HostCapabilities(
        restart=True,
        durable_timers=True,
        waiter_probe=True,
        second_incarnation=True,  # the unwired host holds an owner lock of its own
        transient_faults=True,
    )
    timeout = 1.0

    def __init__(self, env: FactoryEnv) -> None:
        self._env = env
        self._root = env.work_dir / "records"
        self._wired, self._unwired = self._incarnation()

    def _incarnation(self) -> tuple[FaultyFileHost, FileHost]:
        resolver = conformance_resolver(self._env.lab_path)
        self._lab_client = resolver._lab = _MortalLabClient(self._env.lab_path)
        hosts = (FaultyFileHost(self._root, resolver), FileHost(self._root, None))
        for host in hosts:
            host.poll_seconds = 0.05  # another object's write is seen by polling
            host.store.__class__ = _UnsyncedStore
        return hosts

    async def controller(self, *, wired: bool = True) -> EffectController:
        return self._wired if wired else self._unwired

    async def awaiting(self, group_key: str, rank: int) -> bool:
        return await self._wired.awaiting(group_key, rank)

    async def inject_faults(self, operation: FaultedStep, count: int) -> int:
        return self._wired.inject_faults(operation, count)

    async def _die(self) -> None:
        for host in (self._wired, self._unwired):
            tasks = list(host.running.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            host._owner_lock.close()  # the kernel drops a dead process's flock

    async def restart(self) -> None:
        self._lab_client.dead = True
        await self._die()
        self._wired, self._unwired = self._incarnation()

    async def aclose(self) -> None:
        await self._die()


JUDGE_TIMEOUT = 1.0
"""Seconds a check waits for one settlement: a mutant that hangs a check costs four of
them (the check's limit), and the correct hosts settle in milliseconds."""


def _quick(build: Callable[[FactoryEnv], HostUnderTest]) -> Callable[[FactoryEnv], HostUnderTest]:
    def made(env: FactoryEnv) -> HostUnderTest:
        host = build(env)
        host.timeout = JUDGE_TIMEOUT
        return host

    return made


def _durable(env: FactoryEnv) -> HostUnderTest:
    return DurableMemoryHostUnderTest(MemoryEffectHost, env)


HARNESSES: dict[str, Callable[[FactoryEnv], Any]] = {
    "memory": _quick(factory),
    "durable": _quick(_durable),
    "sealed": _quick(sealed_factory),
    "adversarial": _quick(adversarial_factory),
    "file": InProcessFileHostUnderTest,
}


class _Runs:
    """One event loop and one started :class:`SuiteRun` per harness, for the session."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.suites: dict[str, SuiteRun] = {}

    def suite(self, harness: str) -> SuiteRun:
        if harness not in self.suites:
            suite = SuiteRun(HARNESSES[harness])
            self.runner.run(suite.start())
            self.suites[harness] = suite
        return self.suites[harness]

    def close(self) -> None:
        try:
            for suite in self.suites.values():
                with contextlib.suppress(Exception):
                    self.runner.run(suite.stop())
        finally:
            self.runner.close()


@pytest.fixture(scope="session")
def runs() -> Iterator[_Runs]:
    found = _Runs()
    yield found
    found.close()


ONE_HARNESS = {"a_group_over_the_byte_limit_is_refused_before_any_host": "memory"}
"""Checks of library code alone that cost seconds (a group of 17 MB is built): judged on
one harness, which runs the same library code as the others."""


@pytest.mark.parametrize("check", all_checks(), ids=lambda c: c.name)
@pytest.mark.parametrize("harness", list(HARNESSES))
def test_check(runs: _Runs, harness: str, check: Check) -> None:
    if ONE_HARNESS.get(check.name, harness) != harness:
        pytest.skip(f"judged on the {ONE_HARNESS[check.name]} harness only")
    result = runs.runner.run(runs.suite(harness).run(check))
    assert result.status != "failed", f"{check.node_name} on {harness}: {result.reason}"
