"""The registered checks; importing this package registers them all."""

from . import (
    closing,
    combinators,
    decided,
    faults,
    identity,
    inputs,
    kinds,
    lifecycle,
    owners,
    payloads,
    resuming,
    retiring,
    waiters,
)

__all__ = [
    "closing",
    "combinators",
    "decided",
    "faults",
    "identity",
    "inputs",
    "kinds",
    "lifecycle",
    "owners",
    "payloads",
    "resuming",
    "retiring",
    "waiters",
]
