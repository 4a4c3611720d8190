"""Inputs of the host-run child kinds, parsed the same way on every tier (G-51)."""

from __future__ import annotations

import math

from ._errors import InvalidEnvelope
from ._types import EffectEnvelope, EffectGroup, EffectKind, JsonValue


def _finite(seconds: object) -> bool:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return False
    try:
        return math.isfinite(seconds) and seconds >= 0 and math.isfinite(float(seconds))
    except OverflowError:  # an int beyond any float
        return False


def sleep_input(seconds: float) -> dict[str, JsonValue]:
    """The input of a ``sleep`` child lasting ``seconds``.

    Raises:
        InvalidEnvelope: ``seconds`` is negative, not a number or not finite as a float.
    """
    if not _finite(seconds):
        raise InvalidEnvelope("sleep needs a finite, non-negative number of seconds")
    return {"seconds": float(seconds)}


def sleep_seconds(envelope: EffectEnvelope) -> float:
    """The duration of a ``sleep`` child.

    Raises:
        InvalidEnvelope: the envelope is not a well-formed sleep (the message names the
            replay key, never the input).
    """
    data = envelope.input
    value = data.get("seconds") if isinstance(data, dict) else None
    if envelope.kind != EffectKind.SLEEP or not _finite(value):
        raise InvalidEnvelope(
            f"envelope {envelope.replay_key!r} is not a sleep with a finite, non-negative "
            "'seconds' input",
            replay_key=envelope.replay_key,
        )
    assert isinstance(value, int | float)
    return float(value)


def sleep_durations(group: EffectGroup) -> list[float | None]:
    """Each child's sleep duration (``None`` for other kinds): what a host checks before
    it records anything of an open, so a malformed sleep refuses the open whole (G-10).

    Raises:
        InvalidEnvelope: a ``sleep`` child is malformed; names the group key, the
            position and the replay key.
    """
    durations: list[float | None] = []
    for position, child in enumerate(group.children):
        if child.kind != EffectKind.SLEEP:
            durations.append(None)
            continue
        try:
            durations.append(sleep_seconds(child))
        except InvalidEnvelope:
            raise InvalidEnvelope(
                f"child {child.replay_key!r} at position {position} of group {group.key!r} "
                "is not a sleep with a finite, non-negative 'seconds' input",
                group_key=group.key,
                replay_key=child.replay_key,
                position=position,
            ) from None
    return durations


def is_host_kind(envelope: EffectEnvelope) -> bool:
    """Whether the host (not the user's resolver) supplies this child's executor."""
    return envelope.kind in (EffectKind.SLEEP, EffectKind.AWAIT_EVENT)
