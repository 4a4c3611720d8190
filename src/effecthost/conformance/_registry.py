"""Checks are plain async functions registered with the obligations they cover."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._context import CheckContext

CheckFunction = Callable[["CheckContext"], Awaitable[None]]

OBLIGATIONS: dict[str, str] = {
    "G-01": "membership omitted from the canonical encoding when absent",
    "G-02": "wake and loser policy are part of every grouped child's hash",
    "G-03": "one group constructor stamps and refuses memberships",
    "G-04": "empty groups refused; all([]) local, race([]) refused",
    "G-05": "group key with a saved occurrence counter",
    "G-06": "a grouped child on a path without a membership slot is refused",
    "G-07": "group capability iff a resolver is registered; loud defaults",
    "G-08": "open returns consumed=0 once recorded, not when a child settles",
    "G-09": "the registered resolver is the only executor seam; executors single-use",
    "G-10": "first open resolves all children first; a miss records nothing",
    "G-11": "reopen refuses nothing for a miss; drain reports NoExecutor",
    "G-12": "a host with no resolver still drains, reporting NoExecutor",
    "G-13": "reopen fenced on child count, wake and disposition",
    "G-14": "engine tiers: unbound target is a terminal 404, never retried",
    "G-15": "settlement n is a durable fact",
    "G-16": "served by rank, never by sequence equality",
    "G-17": "counter monotonic, append-only below consumed, group-atomic retirement",
    "G-18": "the handle is the only cursor; await advances it by exactly one",
    "G-19": "cancelling an await leaves cursor and ranks untouched",
    "G-20": "both sides of the cursor fenced: exhausted refused, mismatched handle refused",
    "G-21": "first-settlement wake",
    "G-22": "settlement_order is an observability projection",
    "G-23": "three wake policies; all stops at first rejection, allSettled consumes all",
    "G-24": "race, any, all, allSettled semantics",
    "G-25": "loser policy declared at open by the combinators",
    "G-26": "close idempotent and only narrows",
    "G-27": "close under CANCEL issues cancels and does not wait",
    "G-28": "RUN_TO_COMPLETION losers finish after the caller has gone and still rank",
    "G-29": "a crashed caller's declared disposition is applied by the drain",
    "G-30": "no TTL; open group keys are inspectable",
    "G-34": "the drain finishes what a gone caller left, never a live owner's (R-1)",
    "G-36": "a closed group retires only once no child can still rank (R-11)",
    "G-47": "outcomes above the inline threshold are recorded by reference",
    "G-48": "a sealed outcome is bound to its slot; moved elsewhere it fails typed",
    "G-49": "an unopenable sealed outcome is refused typed; cursor and records untouched",
    "G-50": "a destroyed scope key gives PayloadShredded, distinct from unreadable",
    "G-51": "tool_call, sleep and await_event children on every tier",
    "G-52": "deadline/signal select: two-child FIRST group with CANCEL",
    "G-53": "timer and event children carry membership",
}


@dataclass(frozen=True)
class Check:
    """One registered check: its function, the obligations it covers and what it needs."""

    name: str
    ids: tuple[str, ...]
    requires: tuple[str, ...]
    function: CheckFunction
    doc: str
    """The check's whole docstring: the sentence(s) of the spec it tests."""

    @property
    def node_name(self) -> str:
        """The name pytest and the CLI show; ``-k G-12`` matches it."""
        return f"{self.name}[{','.join(self.ids)}]"


REGISTRY: list[Check] = []


def check(*ids: str, requires: tuple[str, ...] = ()) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check covering obligation ``ids`` that needs capabilities ``requires``."""
    for obligation in ids:
        if obligation not in OBLIGATIONS and not obligation.startswith("G-"):
            raise ValueError(f"unknown obligation id {obligation!r}")

    def register(function: CheckFunction) -> CheckFunction:
        name = function.__name__.removeprefix("check_")
        if any(existing.name == name for existing in REGISTRY):
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY.append(
            Check(
                name=name,
                ids=tuple(ids),
                requires=tuple(requires),
                function=function,
                doc=inspect.cleandoc(function.__doc__ or ""),
            )
        )
        return function

    return register


def all_checks() -> list[Check]:
    from . import checks  # noqa: F401  (registers on import)

    return list(REGISTRY)
