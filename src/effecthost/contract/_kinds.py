"""Inputs of the host-run child kinds, parsed the same way on every tier (G-51)."""

from __future__ import annotations

import math

from ._errors import InvalidEnvelope
from ._types import EffectEnvelope, EffectKind, JsonValue


def sleep_input(seconds: float) -> dict[str, JsonValue]:
    """The input of a ``sleep`` child lasting ``seconds``.

    Raises:
        InvalidEnvelope: ``seconds`` is negative or not finite.
    """
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise InvalidEnvelope(f"sleep needs a finite, non-negative duration, got {seconds!r}")
    return {"seconds": float(seconds)}


def sleep_seconds(envelope: EffectEnvelope) -> float:
    """The duration of a ``sleep`` child.

    Raises:
        InvalidEnvelope: the envelope is not a well-formed sleep.
    """
    data = envelope.input
    value = data.get("seconds") if isinstance(data, dict) else None
    if envelope.kind != EffectKind.SLEEP or not isinstance(value, int | float):
        raise InvalidEnvelope(
            f"envelope {envelope.replay_key!r} is not a sleep with a 'seconds' input",
            replay_key=envelope.replay_key,
        )
    return float(sleep_input(value)["seconds"])


def is_host_kind(envelope: EffectEnvelope) -> bool:
    """Whether the host (not the user's resolver) supplies this child's executor."""
    return envelope.kind in (EffectKind.SLEEP, EffectKind.AWAIT_EVENT)
