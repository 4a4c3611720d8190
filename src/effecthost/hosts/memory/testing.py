"""Conformance factories for the memory tier.

``effecthost conformance effecthost.hosts.memory.testing:factory`` runs the suite against
the reference host; ``adversarial_factory`` against the hostile-timing variant.
"""

from __future__ import annotations

from effecthost.conformance import FactoryEnv, HostCapabilities, HostUnderTest, conformance_resolver
from effecthost.contract import EffectController

from ._adversarial import AdversarialMemoryHost
from ._host import MemoryEffectHost


class MemoryHostUnderTest(HostUnderTest):
    """Memory declares no restart: nothing of it survives its process."""

    capabilities = HostCapabilities()
    timeout = 5.0

    def __init__(self, wired: MemoryEffectHost, unwired: MemoryEffectHost) -> None:
        self._wired = wired
        self._unwired = unwired

    async def controller(self, *, wired: bool = True) -> EffectController:
        return self._wired if wired else self._unwired

    async def aclose(self) -> None:
        await self._wired.aclose()
        await self._unwired.aclose()


def factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return MemoryHostUnderTest(
        MemoryEffectHost(conformance_resolver(env.lab_path)), MemoryEffectHost()
    )


def adversarial_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return MemoryHostUnderTest(
        AdversarialMemoryHost(conformance_resolver(env.lab_path)), AdversarialMemoryHost()
    )
