"""Broken library code: the contract, the combinators and sealing as a contributor would
break them, each patched in for one suite run over the correct reference host.

These ids (G-01, G-03…G-05, R-8…R-10) bind code every host shares rather than a host's
own; the suite still checks them on every host, so a release that breaks them must fail
there. Each function below patches one mistake into the library (its docstring names the
id and the mistake); ``@library_mutant(id)`` registers it in the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import types
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from catalog import library_mutant

import effecthost.combinators as combinators
from effecthost.contract import (
    EffectController,
    EffectEnvelope,
    EffectGroup,
    GroupHandle,
    GroupMembership,
    LoserPolicy,
    OccurrenceCounter,
    Outcome,
    WakePolicy,
    limits,
)
from effecthost.contract import _controller as controller_module
from effecthost.contract import _types as types_module
from effecthost.payloads import _sealing as sealing_module


def _everywhere(mp: pytest.MonkeyPatch, module: Any, name: str, value: Any) -> None:
    """Replace ``module.name`` and every loaded effecthost module's binding of the same
    object (a ``from … import name``), as a broken release would ship it."""
    original = getattr(module, name)
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("effecthost") and (
            getattr(loaded, name, None) is original
        ):
            mp.setattr(loaded, name, value)


# -- G-01 ---------------------------------------------------------------------------------------


@library_mutant("G-01", select="G-01")
def null_membership_encoding(mp: pytest.MonkeyPatch) -> None:
    """G-01: the canonical encoding writes ``"membership": null`` for an ungrouped
    envelope (the model dumped with its defaults), so every hash recorded before groups
    existed changes."""
    original = EffectEnvelope.canonical_dict

    def canonical_dict(self: EffectEnvelope) -> dict[str, Any]:
        doc = original(self)
        doc.setdefault("membership", None)
        return doc

    mp.setattr(EffectEnvelope, "canonical_dict", canonical_dict)
    compose = types_module._compose

    def composed(text: str, kind: str, name: str, replay_key: str, membership: Any) -> bytes:
        data = compose(text, kind, name, replay_key, membership)
        if membership is None:
            doc = json.loads(data)
            doc["membership"] = None
            return types_module._encode_canonical(doc)
        return data

    mp.setattr(types_module, "_compose", composed)


@library_mutant("G-01", select="G-01")
def ascii_escaped_encoding(mp: pytest.MonkeyPatch) -> None:
    """G-01: the canonical encoding is ``json.dumps`` with its default ``ensure_ascii``, so
    non-ASCII text is escaped and the bytes differ from the golden vectors."""

    def encode(value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

    mp.setattr(types_module, "_encode_canonical", encode)
    compose = types_module._compose

    def composed(text: str, kind: str, name: str, replay_key: str, membership: Any) -> bytes:
        return encode(json.loads(compose(text, kind, name, replay_key, membership)))

    mp.setattr(types_module, "_compose", composed)


# -- G-03 ---------------------------------------------------------------------------------------


@library_mutant("G-03", select="G-03")
def restamps_foreign_membership(mp: pytest.MonkeyPatch) -> None:
    """G-03: the constructor stamps every child from its index, overwriting a membership
    the child already carried, instead of refusing one that names another group or
    position."""
    original = types_module._child

    def child(key: str, index: int, raw: Any) -> EffectEnvelope:
        return original(key, index, raw).with_membership(None)

    mp.setattr(types_module, "_child", child)


@library_mutant("G-03", select="G-03")
def membership_equality_ignores_policies(mp: pytest.MonkeyPatch) -> None:
    """G-03: a child's membership is compared with the group's on group key and position
    only, so a child stamped with another wake or loser policy is accepted."""

    def eq(self: GroupMembership, other: object) -> bool:
        if not isinstance(other, GroupMembership):
            return NotImplemented
        return (self.group_key, self.position) == (other.group_key, other.position)

    mp.setattr(GroupMembership, "__eq__", eq)


# -- G-04 ---------------------------------------------------------------------------------------


@library_mutant("G-04", select="G-04")
def empty_group_constructed(mp: pytest.MonkeyPatch) -> None:
    """G-04: the group constructor accepts no children (the emptiness check lives in the
    combinators only), so an empty group reaches a host that would wait on it forever."""
    original = EffectGroup.__init__

    def init(self: EffectGroup, /, **data: Any) -> None:
        if data.get("children") not in ([], ()):
            original(self, **data)
            return
        built = EffectGroup.model_construct(
            key=data["key"],
            wake=WakePolicy(data["wake"]),
            disposition=LoserPolicy(data["disposition"]),
            children=(),
        )
        for name in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__"):
            object.__setattr__(self, name, getattr(built, name))
        object.__setattr__(self, "__pydantic_private__", None)

    mp.setattr(EffectGroup, "__init__", init)


@library_mutant("G-04", select="G-04")
def all_of_nothing_is_refused(mp: pytest.MonkeyPatch) -> None:
    """G-04: ``all([])`` has no special case, so it is refused like ``race([])`` where it
    must be ``[]``."""
    original = combinators.all_

    async def all_(controller: EffectController, scope: Any, calls: Sequence[Any]) -> Any:
        if not calls:
            combinators.build_group(scope, calls, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
        return await original(controller, scope, calls)

    _everywhere(mp, combinators, "all_", all_)


# -- G-05 ---------------------------------------------------------------------------------------


@library_mutant("G-05", select="G-05")
def counter_not_saved(mp: pytest.MonkeyPatch) -> None:
    """G-05: a scope saves its id but not its occurrence counter, so after a restore the
    same batch gets an occurrence already used before the restart."""
    mp.setattr(combinators.Scope, "to_json", lambda self: json.dumps({"scope_id": self.scope_id}))


@library_mutant("G-05", select="G-05")
def counter_never_counts(mp: pytest.MonkeyPatch) -> None:
    """G-05: the occurrence counter reads a batch's count without bumping it, so two
    identical batches in one iteration share a group key."""
    mp.setattr(OccurrenceCounter, "next", lambda self, batch: self.counts.get(batch, 0))


# -- R-8 ----------------------------------------------------------------------------------------


@library_mutant("R-8", select="limits")
def depth_counted_from_the_scalar(mp: pytest.MonkeyPatch) -> None:
    """R-8: nesting is counted from the innermost scalar, one level off: an input nested
    65 levels deep is accepted where 64 is the limit."""
    mp.setattr(limits, "MAX_DEPTH", limits.MAX_DEPTH + 1)


@library_mutant("R-8", select="limits")
def unsigned_integer_range(mp: pytest.MonkeyPatch) -> None:
    """R-8: the integer bound is an unsigned 64-bit one, so ``2**63`` passes though a
    signed 64-bit column or engine cannot round-trip it."""
    mp.setattr(limits, "MAX_INT", 2**64 - 1)


@library_mutant("R-8", select="limits")
def results_trusted(mp: pytest.MonkeyPatch) -> None:
    """R-8: a tool's result is recorded as it came, unchecked (the executor is trusted),
    so a value over the limits settles as a success no other tier could store."""

    def recorded(replay_key: str, build: Any, *args: Any) -> Outcome:
        if build == Outcome.success:
            return Outcome.model_construct(status="success", value=args[0], error=None)
        outcome: Outcome = build(*args)
        return outcome

    mp.setattr(controller_module, "_recorded", recorded)


# -- R-9 ----------------------------------------------------------------------------------------


@library_mutant("R-9", select="outer_cancellation")
def no_close_on_cancel(mp: pytest.MonkeyPatch) -> None:
    """R-9: a combinator closes its group when its body returns or raises an error, but a
    cancellation from outside just propagates and leaves the group open."""

    @asynccontextmanager
    async def opened(controller: EffectController, group: EffectGroup) -> AsyncIterator[Any]:
        yield await controller.open_effect_group(group)

    mp.setattr(combinators, "_opened", opened)


@library_mutant("R-9", select="outer_cancellation")
def close_on_cancel_with_the_default(mp: pytest.MonkeyPatch) -> None:
    """R-9: on an outer cancellation the combinator closes with the default disposition
    (``RUN_TO_COMPLETION``) rather than the declared one; the host refuses the widening,
    the refusal is logged and the group stays open with its losers running."""

    async def close(controller: EffectController, handle: GroupHandle) -> None:
        try:
            await controller.close_effect_group(handle, LoserPolicy.RUN_TO_COMPLETION)
        except Exception:
            pass

    mp.setattr(combinators, "_close_shielded", close)


# -- R-10 ---------------------------------------------------------------------------------------


@library_mutant("R-10", harness="sealed", select="binds_the_position")
def aad_without_position(mp: pytest.MonkeyPatch) -> None:
    """R-10: the sealing's associated data binds the group key and replay key but not the
    position, so a value moved to another position of its slot opens."""
    original = sealing_module.associated_data

    def associated_data(
        envelope_ids: tuple[str, str, str], group_key: str, replay_key: str, position: int | None
    ) -> bytes:
        return original(envelope_ids, group_key, replay_key, None)

    mp.setattr(sealing_module, "associated_data", associated_data)


# -- R-9, further cancellations -------------------------------------------------------------


@library_mutant("R-9", select="cancellation_during_the_close")
def close_given_up_at_a_second_cancellation(mp: pytest.MonkeyPatch) -> None:
    """R-9: the close after an outer cancellation is shielded from that cancellation but
    not from the next one: a caller cancelled again while the close runs stops waiting
    for it, and the close is cancelled with it, so the group stays open."""

    async def close(controller: EffectController, handle: GroupHandle) -> None:
        await controller.close_effect_group(handle)

    mp.setattr(combinators, "_close_shielded", close)


@library_mutant("R-9", select="cancellation_during_the_open")
def open_given_up_at_a_second_cancellation(mp: pytest.MonkeyPatch) -> None:
    """R-9: a cancellation during the open waits for the open once, but a second one
    abandons it: the open records the group afterwards and nobody closes it."""

    async def settle(opening: asyncio.Future[GroupHandle]) -> bool:
        try:
            await asyncio.shield(opening)
        except BaseException:
            return False
        return True

    mp.setattr(combinators, "_settle_shielded", settle)


@library_mutant("R-9", select="open_refused_during")
def closes_after_a_refused_open(mp: pytest.MonkeyPatch) -> None:
    """R-9: after a cancellation during the open, the group is closed once the open has
    finished, whether it recorded the group or was refused, so a refused open closes the
    group another caller holds under that key."""
    original = combinators._settle_shielded

    async def settle(opening: asyncio.Future[GroupHandle]) -> bool:
        await original(opening)
        return opening.done() and not opening.cancelled()

    mp.setattr(combinators, "_settle_shielded", settle)


@library_mutant("R-9", select="its_own_way")
def closes_only_on_a_cancelled_error(mp: pytest.MonkeyPatch) -> None:
    """R-9: the combinator closes its group only when the body ends with
    ``CancelledError``; an engine client that reports the cancelled request as an error
    of its own leaves the group open with its losers running."""
    mp.setattr(combinators, "_being_cancelled", lambda: False)


@library_mutant("R-9", select="failed_close_after")
def failed_close_not_logged(mp: pytest.MonkeyPatch) -> None:
    """R-9: a close after an outer cancellation that fails is swallowed without a word,
    so nobody learns that the group was left open."""

    async def close(controller: EffectController, handle: GroupHandle) -> None:
        closing = asyncio.ensure_future(controller.close_effect_group(handle))
        while not closing.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(closing)

    mp.setattr(combinators, "_close_shielded", close)


# -- G-03, G-05, R-8: building a group from calls ---------------------------------------------


@library_mutant("G-05", select="foretold_and_refused")
def next_key_ignores_the_counter(mp: pytest.MonkeyPatch) -> None:
    """G-05: ``next_group_key`` always answers occurrence 0, so for a batch already
    reached it names a key the combinator will not use (an event sent there is lost)."""

    def next_group_key(scope: Any, calls: Sequence[Any]) -> str:
        from effecthost.contract import batch_id, group_key

        return group_key(scope.scope_id, batch_id([c.document() for c in calls]), 0)

    _everywhere(mp, combinators, "next_group_key", next_group_key)


@library_mutant("G-03", select="whatever_its_name_type")
def calls_refused_with_validation_errors(mp: pytest.MonkeyPatch) -> None:
    """G-03 (SPEC §7): ``Call`` is a plain pydantic model, so ``tool(5)`` raises pydantic's
    ``ValidationError`` rather than the contract's ``InvalidEnvelope``."""
    from pydantic import BaseModel

    def init(self: Any, /, **data: Any) -> None:
        BaseModel.__init__(self, **data)

    mp.setattr(combinators.Call, "__init__", init)


@library_mutant("R-8", select="byte_limit")
def group_size_unchecked_on_the_fast_path(mp: pytest.MonkeyPatch) -> None:
    """R-8: ``build_group``'s fast path checks each child against the limits but not the
    group's total size, so a hundred children of 168 kB make a group every tier must
    refuse."""
    loose = types.SimpleNamespace(**vars(limits))
    loose.MAX_GROUP_BYTES = 2**62
    mp.setattr(combinators, "limits", loose)


# -- G-24: what a combinator's failure carries ------------------------------------------------


@library_mutant("G-24", select="name_their_group")
def aggregate_in_rank_order(mp: pytest.MonkeyPatch) -> None:
    """G-24: ``AllEffectsFailed`` keeps its failures in the order they ranked, not in
    position order."""
    original = combinators.AllEffectsFailed.__init__

    def init(self: Any, failures: Sequence[Any], group_key: str) -> None:
        original(self, failures, group_key)
        self.failures = list(failures)

    mp.setattr(combinators.AllEffectsFailed, "__init__", init)


@library_mutant("G-24", harness="durable", select="surfaces_as_a_cancellation")
def cancellation_returned_as_a_value(mp: pytest.MonkeyPatch) -> None:
    """G-24: a combinator treats only an error as a failure, so a first settlement that
    is a cancellation comes back from ``race`` as the value ``None``."""

    def value(settlement: Any, key: str) -> Any:
        if settlement.outcome.error is not None:
            raise combinators.EffectFailed(settlement, key)
        return settlement.outcome.value

    mp.setattr(combinators, "_value", value)


@library_mutant("G-04", select="empty_calls")
def empty_race_refused_without_a_message(mp: pytest.MonkeyPatch) -> None:
    """G-04: ``race([])`` is refused with a bare ``EmptyGroup()``: typed, but it says
    nothing of what was refused."""
    original = combinators.race

    async def race(
        controller: EffectController, scope: Any, calls: Sequence[Any], **kw: Any
    ) -> Any:
        if not calls:
            raise combinators.EmptyGroup(None)  # type: ignore[arg-type]
        return await original(controller, scope, calls, **kw)

    _everywhere(mp, combinators, "race", race)
