"""Group keys and the occurrence counter a caller keeps in its continuation (G-05)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from . import limits
from ._errors import InvalidEnvelope
from ._types import JsonValue, canonical_json, saved_object


def batch_id(calls: Sequence[JsonValue]) -> str:
    """Content hash of a batch's calls (the same calls give the same id).

    Raises:
        InvalidEnvelope: a call is not strict JSON.
    """
    return hashlib.sha256(canonical_json(list(calls))).hexdigest()[:24]


def group_key(scope_id: str, batch: str, occurrence: int) -> str:
    """``{scope_id}:group:{batch_id}:{occurrence}`` (G-05).

    Raises:
        InvalidEnvelope: an empty scope or batch id, or a negative occurrence.
    """
    if not scope_id or not batch or occurrence < 0:
        raise InvalidEnvelope(
            f"cannot build a group key from scope {scope_id!r}, batch {batch!r}, "
            f"occurrence {occurrence}"
        )
    return f"{scope_id}:group:{batch}:{occurrence}"


class OccurrenceCounter(BaseModel):
    """How many times each batch id was reached in a scope.

    Deterministic and serialisable: save it with the caller's continuation, so two
    identical batches — in one iteration or on either side of a restart — get distinct
    occurrences and therefore distinct group keys (G-05).
    """

    model_config = ConfigDict(extra="forbid")

    counts: dict[str, int] = Field(default_factory=dict)

    def next(self, batch: str) -> int:
        """Return this batch id's occurrence and count it."""
        occurrence = self.counts.get(batch, 0)
        self.counts[batch] = occurrence + 1
        return occurrence

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> OccurrenceCounter:
        """Decode a saved counter, as strictly as the rest of the contract.

        Raises:
            InvalidEnvelope: not an object ``{"counts": {batch id: count}}``, a repeated
                key, a batch id that is not a key (``check_key``), a count that is not an
                integer from 0 to ``MAX_INT``, over ``MAX_JSON_BYTES``.
        """
        return counter_of(saved_object(text, "occurrence counter", InvalidEnvelope, SAVED_LIMIT))


SAVED_LIMIT = limits.MAX_JSON_BYTES
"""Largest saved counter or scope."""


def counter_of(document: dict[str, object], what: str = "occurrence counter") -> OccurrenceCounter:
    """An :class:`OccurrenceCounter` from its decoded document, strictly.

    Raises:
        InvalidEnvelope: see :meth:`OccurrenceCounter.from_json`.
    """
    if set(document) - {"counts"}:
        raise InvalidEnvelope(f"a saved {what} has a field other than counts")
    counts = document.get("counts", {})
    if not isinstance(counts, dict):
        raise InvalidEnvelope(f"a saved {what}'s counts are an object")
    for batch, count in counts.items():
        limits.check_key(batch, what=f"a batch id of a saved {what}")
        if type(count) is not int or not 0 <= count <= limits.MAX_INT:
            raise InvalidEnvelope(
                f"a saved {what} has a count that is not an integer from 0 to {limits.MAX_INT}"
            )
    return OccurrenceCounter.model_construct(counts=dict(counts))
