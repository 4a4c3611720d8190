"""What a factory hands the suite: a host under test and its declared capabilities."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from effecthost.contract import EffectController, EffectGroup

if TYPE_CHECKING:
    from effecthost.payloads import StoredOutcome

FaultedStep = Literal["settle", "guard"]
"""The steps :meth:`HostUnderTest.inject_faults` can make fail."""

KeySetting = Literal["none", "wrong", "right"]
"""The key stores :meth:`HostUnderTest.reader` configures a reader with."""


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
        payload_refs: outcomes above the inline threshold (below 64 KiB) are recorded by
            reference in a payload store, and :meth:`HostUnderTest.stored_outcome`
            returns the recorded form (G-47).
        sealing: outcomes are sealed (AES-256-GCM, bound to their slot) and the host
            implements :meth:`HostUnderTest.reader`, :meth:`HostUnderTest.stored_outcome`,
            :meth:`HostUnderTest.transplant_outcome` and :meth:`HostUnderTest.destroy_keys`
            (G-48…G-50).
        waiter_probe: :meth:`HostUnderTest.awaiting` tells when an await is parked inside
            the host (for an engine: its waiting request is in flight at the engine), so a
            check can cancel exactly then (G-19).
        second_incarnation: ``controller(wired=False)`` is another live incarnation over
            the same recorded state as the wired controller (as another process of the
            deployment would be): its drain sees the wired controller's groups and must
            judge their owner live (R-1).
        payload_limit: the host is configured with a byte limit below the contract's
            (:attr:`HostUnderTest.max_payload_bytes`): a child whose input encodes (as
            canonical JSON) to more is refused at the open with ``PayloadTooLarge`` and
            nothing is recorded, one of exactly the limit is accepted; a tool result whose
            outcome is over it settles as the child's ``PayloadTooLarge`` failure; an event
            payload encoding to more is refused with ``PayloadTooLarge`` and settles
            nothing, one of exactly the limit is delivered (§7, R-8).
        transient_faults: :meth:`HostUnderTest.inject_faults` makes the host's next writes
            fail as a transient outage or a lost optimistic race would (R-12), so a check
            can see that the host retries them up to its bound and then gives up without
            losing or doubling anything.
    """

    restart: bool = False
    durable_timers: bool = False
    unroutable_children: bool = False
    payload_refs: bool = False
    sealing: bool = False
    waiter_probe: bool = False
    second_incarnation: bool = False
    payload_limit: bool = False
    transient_faults: bool = False

    def declared(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


@dataclass(frozen=True)
class FactoryEnv:
    """What the suite gives a factory.

    Attributes:
        lab_path: register ``conformance_resolver(lab_path)`` in every process that runs
            children of this host.
        work_dir: a private temp directory for databases, server data and logs. Write
            each process's output to a ``NAME.log`` file in it or in a directory directly
            under it (a directory that must live elsewhere can be linked into it):
            ``--keep`` prints every such file.
        keep: the run keeps ``work_dir`` for a post-mortem (``--keep``): leave in place
            what the factory wrote, a server's data and log included, when it stops.
    """

    lab_path: Path
    work_dir: Path
    keep: bool = False


class HostUnderTest(ABC):
    """A host as the suite drives it. One per run; checks share it and use fresh keys."""

    capabilities: HostCapabilities = HostCapabilities()
    timeout: float = 10.0
    """Seconds a check may wait for one settlement before failing."""
    max_payload_bytes: int | None = None
    """The byte limit the host was built with, when it declares ``payload_limit``."""

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

    async def reader(self, *, keys: KeySetting) -> EffectController:
        """A wired controller over this host's recorded state (another process of the same
        deployment) whose payload settings differ only in the key store: ``"none"`` no
        key store at all, ``"wrong"`` a key store that never held this host's keys,
        ``"right"`` this host's own key store. It may share the recorded state but must
        not change it by reading. Only called when ``capabilities.sealing``."""
        raise NotImplementedError(f"{type(self).__name__} declares no sealing")

    async def stored_outcome(self, group_key: str, replay_key: str) -> StoredOutcome:
        """The recorded form of the settled child ``replay_key`` of ``group_key``, exactly as
        the rank record holds it. Only called when ``capabilities.payload_refs`` or
        ``capabilities.sealing``."""
        raise NotImplementedError(f"{type(self).__name__} declares no payload references")

    async def transplant_outcome(self, *, source: tuple[str, str], target: tuple[str, str]) -> None:
        """Overwrite the recorded outcome of the settled child ``target`` (group key,
        replay key) with the recorded outcome of the settled child ``source``, byte for
        byte (what an attacker with write access to the records could do; G-48). Only
        called when ``capabilities.sealing``."""
        raise NotImplementedError(f"{type(self).__name__} declares no sealing")

    async def destroy_keys(self, group_key: str) -> None:
        """Destroy, in this host's own key store, every key of the scope ``group_key``
        belongs to (crypto-erasure, G-50). Only called when ``capabilities.sealing``."""
        raise NotImplementedError(f"{type(self).__name__} declares no sealing")

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """Whether an ``await_next_settlement`` of ``rank`` of ``group_key`` is parked
        inside the host right now (past every read that precedes the wait). Only called
        when ``capabilities.waiter_probe``."""
        raise NotImplementedError(f"{type(self).__name__} declares no waiter probe")

    async def inject_faults(self, operation: FaultedStep, count: int) -> int:
        """Make the next ``count`` attempts of ``operation`` in the wired controller fail
        transiently, replacing any faults still pending for it, and return the host's bound:
        how many attempts of one such step it makes before it gives up. ``"settle"``: the
        write that settles a child fails (an outage). ``"guard"``: the atomic step of an
        open or a close loses its race (an optimistic engine's conflict) before it
        writes anything. Only called when ``capabilities.transient_faults``."""
        raise NotImplementedError(f"{type(self).__name__} declares no transient faults")

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to stop by default
        """Stop whatever the factory started."""
