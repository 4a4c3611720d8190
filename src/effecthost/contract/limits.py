"""The one limits policy for JSON values and keys (R-8), the same on every tier.

Every tier can store what these limits allow: PostgreSQL ``jsonb``/``text`` refuses NUL,
pydantic's JSON reader refuses nesting past 200 levels (the stored forms wrap a value a
few levels deep), a Temporal payload at most 2 MiB (a wide group's children are sent in parts), a
signed 64-bit integer is what every engine and driver round-trips. The contract applies
them at construction (envelope inputs, keys, event payloads through
:func:`~effecthost.contract.normalize_json`) and in :meth:`EffectExecutor.execute` (a tool
result or failure over them becomes the child's typed failure), so hosts inherit them;
a host may call :func:`check_json` and :func:`check_key` for values that reach it
another way.

A refusal is :class:`~effecthost.contract.InvalidEnvelope`, or
:class:`~effecthost.contract.PayloadTooLarge` (a subclass) for a size; its message names
ids and the limit, never the value.
"""

from __future__ import annotations

import math
from typing import Any

from ._errors import InvalidEnvelope, PayloadTooLarge

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects in one value (a scalar is depth 0)."""

MIN_INT = -(2**63)
MAX_INT = 2**63 - 1
"""Integers are signed 64-bit; floats must be finite."""

MAX_STRING_BYTES = 1024 * 1024
"""Longest string (UTF-8) anywhere in a value, and longest failure message."""

MAX_JSON_BYTES = 1024 * 1024
"""Largest value (canonical JSON, UTF-8): an input, a result, an event payload, failure
data."""

MAX_GROUP_BYTES = 16 * 1024 * 1024
"""Largest group: the children's canonical envelopes together (room for
:data:`MAX_CHILDREN` children with long keys)."""

MAX_KEY_BYTES = 512
"""Longest group key or replay key (UTF-8)."""

MAX_NAME_BYTES = 256
"""Longest effect kind, effect name, event name or failure type (UTF-8)."""

MAX_CHILDREN = 10_000
"""Widest group: every tier runs a group this wide (issue targets: cost per child
within 1.3x of a 1,000-child group)."""

MAX_ENVELOPE_BYTES = MAX_JSON_BYTES + 16 * 1024
"""An upper bound of one envelope's canonical bytes (its input plus its bounded keys)."""

MAX_OUTCOME_BYTES = 2 * MAX_JSON_BYTES + MAX_STRING_BYTES + 4 * 1024
"""An upper bound of one outcome's JSON (value or failure data, message, type)."""


def check_text(text: Any, *, what: str, limit: int = MAX_STRING_BYTES, **ids: Any) -> str:
    """``text`` if it is a string every tier can store: no NUL, valid UTF-8 (no lone
    surrogate), at most ``limit`` bytes.

    Raises:
        InvalidEnvelope: not a string, a NUL, a lone surrogate; ``PayloadTooLarge`` when
            over ``limit``.
    """
    reason = _text_problem(text, limit)
    if reason is None:
        return str(text)
    error = PayloadTooLarge if reason.startswith("is over") else InvalidEnvelope
    raise error(f"{what} {reason}", **ids)


def check_key(key: Any, *, what: str, limit: int = MAX_KEY_BYTES, **ids: Any) -> str:
    """``key`` if it is a non-empty string within the key limits (:func:`check_text`).

    Raises:
        InvalidEnvelope: empty, not a string, over ``limit`` bytes, NUL, lone surrogate.
    """
    if not isinstance(key, str) or not key:
        raise InvalidEnvelope(f"{what} must be a non-empty string", **ids)
    reason = _text_problem(key, limit)
    if reason is not None:
        raise InvalidEnvelope(f"{what} {reason}", **ids)
    return key


def _text_problem(text: Any, limit: int) -> str | None:
    if not isinstance(text, str):
        return "is not a string"
    if len(text) > limit:  # at least one byte per character
        return f"is over the limit of {limit} bytes"
    if "\x00" in text:
        return "contains NUL, which not every tier can store"
    if text.isascii():
        return None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    if size > limit:
        return f"is over the limit of {limit} bytes"
    return None


def json_problem(value: Any) -> tuple[str, bool] | None:
    """Why ``value`` is not a JSON value within the limits, and whether the reason is a
    size; ``None`` when it is. Iterative: a value nested any depth cannot recurse here,
    and a cyclic one is stopped by the depth limit."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    budget = MAX_JSON_BYTES  # a lower bound of the encoded size, spent as we walk
    while stack:
        item, depth = stack.pop()
        if item is None or item is True or item is False:
            budget -= 4
        elif isinstance(item, str):
            reason = _text_problem(item, MAX_STRING_BYTES)
            if reason is not None:
                return (f"has a string that {reason}", reason.startswith("is over"))
            budget -= len(item) + 2
        elif isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                return ("has an integer outside the signed 64-bit range", False)
            budget -= 1
        elif isinstance(item, float):
            if not math.isfinite(item):
                return ("has a number that is not finite", False)
            budget -= 1
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return (f"nests deeper than {MAX_DEPTH} levels", False)
            # brackets, and a separator between items (one fewer than the items)
            budget -= 2 + max(len(item) - 1, 0)
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return ("has an object key that is not a string", False)
                    reason = _text_problem(key, MAX_STRING_BYTES)
                    if reason is not None:
                        return (f"has an object key that {reason}", reason.startswith("is over"))
                    budget -= len(key) + 3  # its quotes and colon
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        else:
            return (f"is not JSON (a {type(item).__name__})", False)
        if budget < 0:
            return (f"is over the limit of {MAX_JSON_BYTES} bytes", True)
    return None


def check_json(value: Any, *, what: str = "value", **ids: Any) -> None:
    """Refuse ``value`` unless it is strict JSON within the limits (depth, integer range,
    strings, total size once encoded).

    Raises:
        InvalidEnvelope: over a limit or not JSON; ``PayloadTooLarge`` for a size.
    """
    from ._types import canonical_json  # the encoder lives with the types

    problem = json_problem(value)
    if problem is None:
        size = len(canonical_json(value))
        if size <= MAX_JSON_BYTES:
            return
        problem = (f"encodes to {size} bytes, over the limit of {MAX_JSON_BYTES}", True)
    reason, too_large = problem
    raise (PayloadTooLarge if too_large else InvalidEnvelope)(f"{what} {reason}", **ids)
