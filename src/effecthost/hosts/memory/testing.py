"""Conformance factories for the memory tier.

``effecthost conformance effecthost.hosts.memory.testing:factory`` runs the suite against
the reference host; ``adversarial_factory`` against the hostile-timing variant;
``sealed_factory`` against the reference host with payload references and sealing.
"""

from __future__ import annotations

from typing import Literal

from effecthost.conformance import FactoryEnv, HostCapabilities, HostUnderTest, conformance_resolver
from effecthost.contract import EffectController, UnknownGroup
from effecthost.payloads import (
    AesGcmSealer,
    FilesystemPayloadStore,
    InMemoryKeyStore,
    PayloadPolicy,
    StoredOutcome,
    default_scope,
)

from ._adversarial import AdversarialMemoryHost
from ._host import MemoryEffectHost, _Child

PAYLOAD_LIMIT = 256 * 1024
"""The byte limit the shipped memory ``factory`` builds the host with (below the contract's,
above the payload checks' 64 KiB outcomes), so the ``payload_limit`` checks run."""


class MemoryHostUnderTest(HostUnderTest):
    """Memory declares no restart: nothing of it survives its process."""

    capabilities = HostCapabilities(waiter_probe=True)
    timeout = 5.0

    def __init__(self, wired: MemoryEffectHost, unwired: MemoryEffectHost) -> None:
        self._wired = wired
        self._unwired = unwired

    async def controller(self, *, wired: bool = True) -> EffectController:
        return self._wired if wired else self._unwired

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """Whether an await of ``rank`` waits on the group's wake-up (its read found no
        such rank yet)."""
        record = self._wired._groups.get(group_key)
        return record is not None and record.parked[rank] > 0

    async def aclose(self) -> None:
        await self._wired.aclose()
        await self._unwired.aclose()


class SealedMemoryHostUnderTest(MemoryHostUnderTest):
    """The reference host with a payload policy: a filesystem payload store, the default
    inline threshold and AES-256-GCM sealing with an in-memory key store."""

    capabilities = HostCapabilities(payload_refs=True, sealing=True, waiter_probe=True)

    def __init__(self, env: FactoryEnv) -> None:
        self._keys = InMemoryKeyStore()
        self._policy = PayloadPolicy(
            store=FilesystemPayloadStore(env.work_dir / "payloads"),
            sealer=AesGcmSealer(self._keys),
        )
        super().__init__(
            MemoryEffectHost(conformance_resolver(env.lab_path), payloads=self._policy),
            MemoryEffectHost(payloads=self._policy),
        )

    async def reader(self, *, keys: Literal["none", "wrong", "right"]) -> EffectController:
        if keys == "right":
            return self._wired.with_payloads(self._policy)
        sealer = None if keys == "none" else AesGcmSealer(InMemoryKeyStore())
        return self._wired.with_payloads(PayloadPolicy(store=self._policy.store, sealer=sealer))

    def _settled(self, group_key: str, replay_key: str) -> _Child:
        record = self._wired._groups.get(group_key)
        child = None
        if record is not None:
            child = next((c for c in record.settled if c.replay_key == replay_key), None)
        if child is None:
            raise UnknownGroup(
                f"no settled child {replay_key!r} in group {group_key!r}", group_key=group_key
            )
        return child

    async def stored_outcome(self, group_key: str, replay_key: str) -> StoredOutcome:
        stored = self._settled(group_key, replay_key).stored
        assert stored is not None
        return stored

    async def transplant_outcome(self, *, source: tuple[str, str], target: tuple[str, str]) -> None:
        self._settled(*target).stored = self._settled(*source).stored

    async def destroy_keys(self, group_key: str) -> None:
        self._keys.destroy(default_scope(group_key))


class LimitedMemoryHostUnderTest(MemoryHostUnderTest):
    """The reference host built with :data:`PAYLOAD_LIMIT`."""

    capabilities = HostCapabilities(waiter_probe=True, payload_limit=True)
    max_payload_bytes = PAYLOAD_LIMIT


def factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return LimitedMemoryHostUnderTest(
        MemoryEffectHost(conformance_resolver(env.lab_path), max_payload_bytes=PAYLOAD_LIMIT),
        MemoryEffectHost(max_payload_bytes=PAYLOAD_LIMIT),
    )


def adversarial_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return MemoryHostUnderTest(
        AdversarialMemoryHost(conformance_resolver(env.lab_path)), AdversarialMemoryHost()
    )


def sealed_factory(env: FactoryEnv) -> SealedMemoryHostUnderTest:
    """The reference host with payload references and sealing (G-47…G-50)."""
    return SealedMemoryHostUnderTest(env)
