"""The in-memory reference host (SPEC §2), durable only for the life of the process."""

from ._adversarial import AdversarialMemoryHost
from ._host import DEFAULT_MAX_PAYLOAD_BYTES, MemoryEffectHost

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "AdversarialMemoryHost", "MemoryEffectHost"]
