"""The registered checks; importing this package registers them all."""

from . import (
    building,
    cancellation,
    closing,
    combinators,
    decided,
    failures,
    identity,
    kinds,
    lifecycle,
    owners,
    payloads,
    retiring,
)

__all__ = [
    "building",
    "cancellation",
    "closing",
    "combinators",
    "decided",
    "failures",
    "identity",
    "kinds",
    "lifecycle",
    "owners",
    "payloads",
    "retiring",
]
