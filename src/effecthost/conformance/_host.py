"""What a factory hands the suite: a host under test and its declared capabilities."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from pathlib import Path

from effecthost.contract import EffectController, EffectGroup


@dataclass(frozen=True)
class HostCapabilities:
    """What a host claims beyond SPEC §2's baseline. Conservative: everything False.

    A check that needs an undeclared capability is a printed skip, never a silent branch.

    Attributes:
        restart: :meth:`HostUnderTest.restart` drops every in-process object (and kills
            worker processes) and rebuilds from durable state.
        durable_timers: a ``sleep`` child fires at its recorded due time after a restart.
        unroutable_children: the host can open a group whose child targets a handler no
            deployment binds (:meth:`HostUnderTest.open_unroutable`, G-14).
    """

    restart: bool = False
    durable_timers: bool = False
    unroutable_children: bool = False

    def declared(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


@dataclass(frozen=True)
class FactoryEnv:
    """What the suite gives a factory.

    Attributes:
        lab_path: register ``conformance_resolver(lab_path)`` in every process that runs
            children of this host.
        work_dir: a private temp directory for databases, server data and logs.
    """

    lab_path: Path
    work_dir: Path


class HostUnderTest(ABC):
    """A host as the suite drives it. One per run; checks share it and use fresh keys."""

    capabilities: HostCapabilities = HostCapabilities()
    timeout: float = 10.0
    """Seconds a check may wait for one settlement before failing."""

    @abstractmethod
    async def controller(self, *, wired: bool = True) -> EffectController:
        """A controller for this host. ``wired``: with the conformance resolver
        registered; otherwise none (G-07, G-12). Invalid after :meth:`restart`."""

    async def restart(self) -> None:
        """Drop every in-process object and rebuild from durable state, as a crashed and
        restarted process would. Only called when ``capabilities.restart``."""
        raise NotImplementedError(f"{type(self).__name__} declares no restart")

    async def open_unroutable(self, controller: EffectController, group: EffectGroup) -> None:
        """Open ``group`` whose first child targets a handler no deployment binds (G-14).
        Only called when ``capabilities.unroutable_children``."""
        raise NotImplementedError(f"{type(self).__name__} declares no unroutable children")

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to stop by default
        """Stop whatever the factory started."""
