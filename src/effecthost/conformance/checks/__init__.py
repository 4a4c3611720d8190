"""The registered checks; importing this package registers them all."""

from . import (
    closing,
    combinators,
    decided,
    drains,
    events,
    identity,
    kinds,
    lifecycle,
    limits,
    owners,
    payloads,
    refusals,
    retiring,
)

__all__ = [
    "closing",
    "combinators",
    "decided",
    "drains",
    "events",
    "identity",
    "kinds",
    "lifecycle",
    "limits",
    "owners",
    "payloads",
    "refusals",
    "retiring",
]
