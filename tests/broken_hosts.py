"""Deliberately broken memory hosts the conformance suite must fail, and two control hosts
it must pass.

Each broken host is a small subclass of the reference host (or of its adversarial
variant) that overrides one hook, and its docstring says which obligation it breaks and
how. Each has a factory of the same shape as ``effecthost.hosts.memory.testing.factory``,
with a short timeout so that a check waiting for a rank that never comes fails fast.

The controls are the adversarial host with a chosen seed, and a dense adversarial host
that legitimately looks rank ``n`` up as sequence ``n`` (SPEC G-16 allows it for a host
whose numbers are dense by construction). They show that what fails below is the bug, not
the hostile timing or the lookup.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from effecthost.conformance import FactoryEnv, conformance_resolver
from effecthost.contract import (
    EffectExecutor,
    EffectGroup,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
)
from effecthost.hosts.memory import AdversarialMemoryHost, MemoryEffectHost
from effecthost.hosts.memory._host import _Child, _Group
from effecthost.hosts.memory.testing import MemoryHostUnderTest

BROKEN_TIMEOUT = 1.0
"""Seconds a check waits for one settlement from a broken host before failing."""

BROKEN_SEED = 7
"""Seed of the adversarial hosts below, so that a broken run is reproducible."""


def _by_sequence(record: _Group, rank: int) -> _Child | None:
    """The child whose settlement sequence equals ``rank``."""
    return next((child for child in record.settled if child.seq == rank), None)


# -- controls: the suite must pass these ------------------------------------------------


class DenseAdversarialHost(AdversarialMemoryHost):
    """Correct. Hostile delivery (late, shuffled, twice each), but sequences are dense by
    construction — the counter moves only on a fenced, accepted finalize — so this host
    may, and here does, look rank ``n`` up as sequence ``n`` (G-16)."""

    def _next_sequence(self, record: _Group) -> int:
        return record.counter + 1

    def _settled_at_rank(self, record: _Group, rank: int) -> _Child | None:
        return _by_sequence(record, rank)


def seeded_adversarial_factory(seed: int) -> Callable[[FactoryEnv], MemoryHostUnderTest]:
    """A factory for the adversarial reference host with ``seed``."""

    def factory(env: FactoryEnv) -> MemoryHostUnderTest:
        return MemoryHostUnderTest(
            AdversarialMemoryHost(conformance_resolver(env.lab_path), seed=seed),
            AdversarialMemoryHost(seed=seed),
        )

    factory.__name__ = f"adversarial_factory_seed_{seed}"
    return factory


def dense_adversarial_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return MemoryHostUnderTest(
        DenseAdversarialHost(conformance_resolver(env.lab_path), seed=BROKEN_SEED),
        DenseAdversarialHost(seed=BROKEN_SEED),
    )


# -- broken hosts: the suite must fail each on the obligation it breaks -----------------


class SequenceEqualityHost(AdversarialMemoryHost):
    """Breaks G-16: serves rank ``n`` as the settlement whose sequence is ``n``, although
    its sequences have gaps (the adversarial ``_next_sequence`` burns numbers). Rank ``n``
    is then another child, or never found."""

    def _settled_at_rank(self, record: _Group, rank: int) -> _Child | None:
        return _by_sequence(record, rank)


class BumpBeforeFenceHost(DenseAdversarialHost):
    """Breaks G-17 (the G-31 bug pattern): finalize bumps the group counter before the
    fence check and does not undo it when the fence rejects. Every redelivered settlement
    (the adversarial delivery sends each twice) burns a number, so the counter is no
    longer a gap-free allocation, and the dense ``seq == rank`` lookup this host relies
    on never finds rank 2 (also G-16)."""

    def _finalize(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> bool:
        record.counter = self._next_sequence(record)  # the bug: bumped before the fence
        if child.state == "settled" or child.fence != fence:
            return False  # a rejected finalize keeps the number it burned
        child.seq = record.counter
        child.outcome = outcome
        child.state = "settled"
        bisect.insort(record.settled, child, key=lambda c: c.seq or 0)
        self._notify(record)
        self._maybe_retire(record)
        return True


class ClampingCursorHost(MemoryEffectHost):
    """Breaks G-20: a handle that has consumed every child is clamped back to the last
    rank and served it again, instead of being refused with ``CursorExhausted``. (The
    reference host fences the cursor outside its hooks, so this host overrides the await
    itself.)"""

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        record = self._groups.get(handle.group_key)
        if record is not None and handle.consumed >= record.child_count:
            handle.consumed = record.child_count - 1  # the bug: clamp rather than refuse
        return await super().await_next_settlement(handle)


class RecordsRefusedOpenHost(MemoryEffectHost):
    """Breaks G-10: on a first open it writes the group record before resolving the
    children, so an open refused for a child with no executor leaves the group recorded;
    the same open repeated is then taken for a reopen and accepted."""

    def _resolve_all(self, group: EffectGroup) -> list[EffectExecutor]:
        self._record_group(group)  # the bug: recorded before every child is resolved
        return super()._resolve_all(group)


class WidensCancelHost(MemoryEffectHost):
    """Breaks G-26: a close may only narrow, but this host accepts a
    ``RUN_TO_COMPLETION`` close on a group that declared ``CANCEL`` and lets its losers
    run on."""

    def _check_narrowing(
        self, group_key: str, current: LoserPolicy, requested: LoserPolicy | None
    ) -> LoserPolicy:
        return requested or current  # the bug: no DispositionWidened


class RanksByPositionHost(MemoryEffectHost):
    """Breaks G-21 (and G-15, G-16): serves the child at position ``rank - 1`` once it
    has settled, so a waiter for rank 1 sleeps until the first-positioned child settles
    however many others settled before it, and rank ``n`` names a position, not an
    order of settlement."""

    def _settled_at_rank(self, record: _Group, rank: int) -> _Child | None:
        child = record.children[rank - 1]
        return child if child.state == "settled" else None


class ReopensClosedHost(MemoryEffectHost):
    """Breaks R-4 (checked under G-26): a reopen of a closed group that has not retired
    yet returns a handle (every await then says ``GroupClosed``), as the SQL tiers did
    before the ruling."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        record = self._groups.get(group.key)
        if record is not None and record.closed:
            self._fence_reopen(record, group)
            return group.handle()  # the bug: a closed key is served a handle
        return await super().open_effect_group(group)


def _broken(
    host_type: type[MemoryEffectHost], env: FactoryEnv, **options: int
) -> MemoryHostUnderTest:
    under_test = MemoryHostUnderTest(
        host_type(conformance_resolver(env.lab_path), **options), host_type(**options)
    )
    under_test.timeout = BROKEN_TIMEOUT
    return under_test


def sequence_equality_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(SequenceEqualityHost, env, seed=BROKEN_SEED)


def seeded_sequence_equality_factory(seed: int) -> Callable[[FactoryEnv], MemoryHostUnderTest]:
    """``sequence_equality_factory`` with another seed, so other gaps."""

    def factory(env: FactoryEnv) -> MemoryHostUnderTest:
        return _broken(SequenceEqualityHost, env, seed=seed)

    factory.__name__ = f"sequence_equality_factory_seed_{seed}"
    return factory


def bump_before_fence_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(BumpBeforeFenceHost, env, seed=BROKEN_SEED)


def clamping_cursor_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(ClampingCursorHost, env)


def records_refused_open_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(RecordsRefusedOpenHost, env)


def widens_cancel_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(WidensCancelHost, env)


def ranks_by_position_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(RanksByPositionHost, env)


def reopens_closed_factory(env: FactoryEnv) -> MemoryHostUnderTest:
    return _broken(ReopensClosedHost, env)
