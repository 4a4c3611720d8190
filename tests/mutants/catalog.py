"""The mutant catalog: broken hosts the conformance suite must fail, each on the id it breaks.

A mutant is a host that breaks exactly one rule of docs/spec.md the way a host author
would, and behaves correctly otherwise. :func:`mutant` registers one; :data:`CATALOG`
holds them all; ``test_catalog.py`` runs the suite against each and requires that a
failing check cites the broken id (an obligation in the check's ids, a ruling in its ids
or docstring).

Harnesses:

- ``memory``: the reference host as ``effecthost.hosts.memory.testing:factory`` runs it.
- ``durable``: the reference host over a record that outlives a *restart* of the host
  objects (every child task is cancelled without recording, new host objects adopt the
  record, as a restarted process would from its database). It declares ``restart`` and
  ``durable_timers``, so the restart, drain and timer checks run in milliseconds; the
  correct host passes the whole suite on it (a control in ``test_catalog.py``).
- ``sealed``: the reference host with payload references and sealing.
- ``routed``: the reference host over a modelled engine that routes children to targets
  (``routing.py``); it declares ``unroutable_children``, so the G-14 check runs.
- ``file``: the guide's example host (``examples/file_host``) with one hook of its engine
  glue broken (``file_mutants.py``), in a deployment process of its own: how a third party
  writing a host on the kit errs. Real SIGKILL restarts; each runs only the checks of its
  id (``select``).
- ``sqlite``: the SQLite host in its own deployment process, ``host_class`` replaced by a
  mutant of ``sql_mutants.py``; real SIGKILL restarts, so slow: kept few.

Library mutants (``library_mutants.py``) patch a mistake into the contract, the
combinators or sealing for one run over the correct reference host: ids every host shares.
Mutants of a tier's own machinery (the SQL store, the Restate endpoint, the Temporal
workflow and worker) are in ``tier_mutants.py``, killed by the tier tests. Ids with no mutant yet are listed in :data:`NOT_COVERED` with why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from effecthost.conformance import (
    Check,
    FactoryEnv,
    HostCapabilities,
    HostUnderTest,
    LabClient,
    SuiteReport,
    conformance_resolver,
)
from effecthost.conformance._spec import cites as rule_cites
from effecthost.contract import EffectController, EffectGroup
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.hosts.memory.testing import MemoryHostUnderTest, SealedMemoryHostUnderTest

MUTANT_TIMEOUT = 1.0
"""Seconds a check waits for one settlement from a mutant before failing."""

HERE = Path(__file__).parent

Factory = Callable[[FactoryEnv], HostUnderTest]


@dataclass(frozen=True)
class Mutant:
    """One broken host: the id it breaks, how (its docstring), how to build it."""

    name: str
    breaks: str
    doc: str
    factory: Factory
    harness: str
    select: str | None = None
    """A ``-k`` expression of the checks to run; ``None`` runs the whole suite."""
    slow: bool = False
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    """For a library mutant: patches the mistake into the library for the run."""

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The library as this mutant has it, for the length of the block."""
        with pytest.MonkeyPatch.context() as mp:
            if self.patch is not None:
                self.patch(mp)
            yield


CATALOG: list[Mutant] = []


def _summary(doc: str | None) -> str:
    return " ".join((doc or "").split())


def mutant(
    breaks: str, *, harness: str = "memory", select: str | None = None
) -> Callable[[type[MemoryEffectHost]], type[MemoryEffectHost]]:
    """Register a memory-host mutant class breaking ``breaks``."""

    def register(cls: type[MemoryEffectHost]) -> type[MemoryEffectHost]:
        builders = {"memory": _memory, "durable": _durable, "sealed": _sealed, "routed": _routed}
        build = builders[harness]

        def factory(env: FactoryEnv) -> HostUnderTest:
            return build(cls, env)

        factory.__name__ = f"{cls.__name__}_factory"
        CATALOG.append(
            Mutant(cls.__name__, breaks, _summary(cls.__doc__), factory, harness, select)
        )
        return cls

    return register


def library_mutant(
    breaks: str, *, harness: str = "memory", select: str | None = None
) -> Callable[[Callable[[pytest.MonkeyPatch], None]], Callable[[pytest.MonkeyPatch], None]]:
    """Register a mistake in the library (a function patching it in) breaking ``breaks``,
    run over the correct reference host."""

    def register(
        patch: Callable[[pytest.MonkeyPatch], None],
    ) -> Callable[[pytest.MonkeyPatch], None]:
        build = {"memory": _memory, "sealed": _sealed, "durable": _durable}[harness]

        def factory(env: FactoryEnv) -> HostUnderTest:
            return build(MemoryEffectHost, env)

        name = "".join(part.title() for part in patch.__name__.split("_"))
        factory.__name__ = f"{name}_factory"
        CATALOG.append(
            Mutant(name, breaks, _summary(patch.__doc__), factory, "library", select, patch=patch)
        )
        return patch

    return register


def sql_mutant(
    name: str, breaks: str, doc: str, *, select: str, durable_timers: bool = True
) -> None:
    """Register a SQLite mutant: class ``name`` of ``sql_mutants.py``."""
    from effecthost.hosts.sql import SqliteStore
    from effecthost.hosts.sql.testing import SqlHostUnderTest

    def factory(env: FactoryEnv) -> HostUnderTest:
        path = env.work_dir / "effecthost.sqlite3"
        return SqlHostUnderTest(
            env,
            {"store": "sqlite", "path": str(path)},
            lambda: SqliteStore(path),
            host_class=f"sql_mutants:{name}",
            sys_path=[str(HERE)],
        )

    factory.__name__ = f"{name}_factory"
    CATALOG.append(Mutant(name, breaks, _summary(doc), factory, "sqlite", select, slow=True))


FILE_TIMEOUT = 3.0
"""Seconds a check waits on a file mutant: its deployment process answers over a socket
and its ``wait_for_change`` polls the directory once a second."""


def file_mutant(
    name: str, breaks: str, doc: str, *, select: str | None, faults: bool = False
) -> None:
    """Register a file-host mutant: class ``name`` of ``file_mutants.py``, a broken
    :class:`examples.file_host.host.FileHost`, run in its own deployment process as the
    example's factory runs the correct one (``restart`` is a SIGKILL). ``faults``: it is
    a :class:`examples.file_host.faults.FaultyFileHost` and declares ``transient_faults``."""
    from effecthost.conformance import ProcessHostUnderTest

    def factory(env: FactoryEnv) -> HostUnderTest:
        return ProcessHostUnderTest(
            env,
            "file_mutants:build",
            capabilities=HostCapabilities(
                restart=True,
                durable_timers=True,
                waiter_probe=True,
                second_incarnation=True,
                transient_faults=faults,
            ),
            timeout=FILE_TIMEOUT,
            config={"cls": name},
            sys_path=[str(HERE), str(HERE.parents[1])],
        )

    factory.__name__ = f"{name}_factory"
    CATALOG.append(Mutant(name, breaks, _summary(doc), factory, "file", select))


# -- harnesses ------------------------------------------------------------------------------


def _memory(cls: type[MemoryEffectHost], env: FactoryEnv) -> HostUnderTest:
    under_test = MemoryHostUnderTest(cls(conformance_resolver(env.lab_path)), cls())
    under_test.timeout = MUTANT_TIMEOUT
    return under_test


def _sealed(cls: type[MemoryEffectHost], env: FactoryEnv) -> HostUnderTest:
    under_test = SealedMemoryHostUnderTest(env)
    policy = under_test._policy
    under_test._wired = cls(conformance_resolver(env.lab_path), payloads=policy)
    under_test._unwired = cls(payloads=policy)
    under_test.timeout = MUTANT_TIMEOUT
    return under_test


class RoutedMemoryHostUnderTest(MemoryHostUnderTest):
    """A :class:`~routing.RoutingMemoryHost`; its unroutable child is addressed to a
    target no deployment binds."""

    capabilities = HostCapabilities(unroutable_children=True, waiter_probe=True)
    timeout = MUTANT_TIMEOUT

    async def open_unroutable(self, controller: EffectController, group: EffectGroup) -> None:
        from routing import UNBOUND_TARGET, RoutingMemoryHost

        assert isinstance(controller, RoutingMemoryHost)
        await controller.open_routed(group, {0: UNBOUND_TARGET})


def _routed(cls: type[MemoryEffectHost], env: FactoryEnv) -> HostUnderTest:
    return RoutedMemoryHostUnderTest(cls(conformance_resolver(env.lab_path)), cls())


_RECORD = ("_groups", "_retired", "_replay_keys", "_encoded")
"""What a memory host records; the rest (its child tasks) dies with its process."""


class DurableMemoryHostUnderTest(MemoryHostUnderTest):
    """Memory host objects over a record that survives :meth:`restart`.

    The wired and unwired hosts of one incarnation share the record and the child tasks
    (one process); a restart cancels every task without recording (the memory host's
    ``aclose``) and builds new host objects, of the same class, over the same record. A
    host class may define ``_after_restart()`` to model what its process lost.
    """

    capabilities = HostCapabilities(restart=True, durable_timers=True, waiter_probe=True)
    timeout = MUTANT_TIMEOUT

    def __init__(self, cls: type[MemoryEffectHost], env: FactoryEnv) -> None:
        self._cls = cls
        self._env = env
        self._record: dict[str, Any] | None = None
        super().__init__(*self._incarnation())

    def _incarnation(self) -> tuple[MemoryEffectHost, MemoryEffectHost]:
        resolver = conformance_resolver(self._env.lab_path)
        self._lab_client = resolver._lab = _MortalLabClient(self._env.lab_path)
        wired = self._cls(resolver)
        unwired = self._cls()
        if self._record is None:
            self._record = {name: getattr(wired, name) for name in _RECORD}
        for host in (wired, unwired):
            for name, value in self._record.items():
                setattr(host, name, value)
        unwired._tasks = wired._tasks
        return wired, unwired

    async def restart(self) -> None:
        self._lab_client.dead = True
        await self._wired.aclose()
        await self._unwired.aclose()
        self._wired, self._unwired = self._incarnation()
        after = getattr(self._wired, "_after_restart", None)
        if after is not None:
            after()


class _MortalLabClient(LabClient):
    """The lab as the children of one incarnation see it: once the incarnation is dead
    they report nothing and wait on no gate, as children of a killed process would (the
    harness cancels their tasks, and a step reports its cancellation)."""

    dead = False

    async def report(self, kind: str, tag: str, **data: Any) -> None:
        if self.dead:
            raise asyncio.CancelledError
        await super().report(kind, tag, **data)

    async def wait_gate(self, gate: str) -> None:
        if self.dead:
            raise asyncio.CancelledError
        await super().wait_gate(gate)


def _durable(cls: type[MemoryEffectHost], env: FactoryEnv) -> HostUnderTest:
    return DurableMemoryHostUnderTest(cls, env)


# -- the verdict ----------------------------------------------------------------------------


def cites(check: Check, ident: str) -> bool:
    """Whether ``check`` names ``ident``, as ``--explain`` reads it: an obligation among
    its ids, a ruling among its ids or in its docstring (the sentence it tests)."""
    return rule_cites(check.ids, check.doc, ident)


def killers(report: SuiteReport, ident: str) -> list[str]:
    """The failed checks that cite ``ident``."""
    return [r.check.node_name for r in report.by_status("failed") if cites(r.check, ident)]


# Ids without a mutant yet, with why and the tier tests that hold them (the tier
# obligations G-31…G-46 have their mutants in ``tier_mutants.py``).
NOT_COVERED: dict[str, str] = {}
