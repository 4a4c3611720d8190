"""The registered checks; importing this package registers them all."""

from . import (
    attempts,
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
    "attempts",
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
