"""``race``, ``any_``, ``all_`` and ``all_settled`` over any :class:`EffectController`.

Each combinator turns a list of :class:`Call` into one group (batch id = content hash of
the calls, occurrence from the caller's :class:`Scope`), consumes settlements in rank
order and closes the group — also when the caller cancels it from outside (R-9: the close
runs shielded before the cancellation propagates). The decision rules (G-23, G-24) are caller-side loops over
ranks, so they are the same on every tier; the loser policy is declared at open (G-25).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ConfigDict, Field

from effecthost.contract import (
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    EmptyGroup,
    ErrorInfo,
    GroupHandle,
    InvalidEnvelope,
    JsonValue,
    LoserPolicy,
    OccurrenceCounter,
    Outcome,
    RuntimeErrorCode,
    Settlement,
    WakePolicy,
    batch_id,
    group_key,
    limits,
    normalize_json,
    sleep_input,
)
from effecthost.contract._keys import SAVED_LIMIT, counter_of
from effecthost.contract._types import (
    _build,
    _membership,
    _Model,
    _normalized,
    _plain_text,
    _text_of_string,
    _Unusual,
    saved_object,
)

log = logging.getLogger(__name__)

__all__ = [
    "AllEffectsFailed",
    "Call",
    "DeadlineExceeded",
    "EffectFailed",
    "Scope",
    "all_",
    "all_settled",
    "any_",
    "build_group",
    "first_success",
    "next_group_key",
    "race",
    "settlements",
    "sleep",
    "tool",
    "wait_event",
    "wait_event_or_deadline",
    "with_deadline",
]


class EffectFailed(EffectHostError):
    """A child's error (or cancellation) surfaced by a combinator; ids as attributes."""

    code = RuntimeErrorCode.EFFECT_FAILED

    def __init__(self, settlement: Settlement, group_key: str) -> None:
        outcome = settlement.outcome
        self.error = outcome.error or ErrorInfo(type="Cancelled", message="child was cancelled")
        super().__init__(
            f"child {settlement.replay_key!r} (position {settlement.position}, rank "
            f"{settlement.rank}) of group {group_key!r} failed: {self.error.type}",
            group_key=group_key,
            replay_key=settlement.replay_key,
            position=settlement.position,
            rank=settlement.rank,
        )
        self.settlement = settlement


class AllEffectsFailed(EffectHostError):
    """``any_`` saw every child fail; ``failures`` holds each, in position order (G-24)."""

    code = RuntimeErrorCode.ALL_EFFECTS_FAILED

    def __init__(self, failures: Sequence[EffectFailed], group_key: str) -> None:
        super().__init__(
            f"all {len(failures)} children of group {group_key!r} failed", group_key=group_key
        )
        self.failures = sorted(failures, key=lambda f: f.position or 0)


class DeadlineExceeded(EffectHostError):
    """The deadline arm of a select settled first (G-52)."""

    code = RuntimeErrorCode.DEADLINE_EXCEEDED


class Call(_Model):
    """One child to run: a tool call, a sleep or an event wait. Bad fields are
    ``InvalidEnvelope`` (SPEC §7), as for every contract model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    name: str
    input: JsonValue = None

    def document(self) -> dict[str, JsonValue]:
        return {"input": self.input, "kind": self.kind, "name": self.name}


def tool(name: str, input: JsonValue = None) -> Call:
    """A ``tool_call`` child run by the registered resolver."""
    value = normalize_json(input)
    if type(name) is str:  # what the model would check
        return _build(Call, {"kind": EffectKind.TOOL_CALL, "name": name, "input": value})
    return Call(kind=EffectKind.TOOL_CALL, name=name, input=value)


def sleep(seconds: float) -> Call:
    """A ``sleep`` child: a durable timer of the tier (G-51)."""
    return Call(kind=EffectKind.SLEEP, name="sleep", input=sleep_input(seconds))


def wait_event(name: str) -> Call:
    """An ``await_event`` child, settled by ``deliver_event(group_key, name, payload)``."""
    return Call(kind=EffectKind.AWAIT_EVENT, name=name, input=None)


class Scope(_Model):
    """Where group keys come from: a scope id and its occurrence counter (G-05).

    Part of the caller's continuation: save it (``to_json``) with the handle cursors, so
    identical batches before and after a restart get distinct keys.
    """

    model_config = ConfigDict(extra="forbid")

    scope_id: str = Field(min_length=1)
    counter: OccurrenceCounter = Field(default_factory=OccurrenceCounter)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Scope:
        """Decode a saved scope, as strictly as :func:`build_group` checks what it builds.

        Raises:
            InvalidEnvelope: not an object ``{"scope_id", "counter"}``, a repeated key, a
                scope id that is not a key (empty, NUL, over ``MAX_KEY_BYTES``), a counter
                :meth:`OccurrenceCounter.from_json` refuses, over ``MAX_JSON_BYTES``. The
                message names no part of the text.
        """
        document = saved_object(text, "scope", InvalidEnvelope, SAVED_LIMIT)
        if set(document) - {"scope_id", "counter"} or "scope_id" not in document:
            raise InvalidEnvelope("a saved scope has exactly the fields scope_id and counter")
        limits.check_key(document["scope_id"], what="the scope id of a saved scope")
        counter = document.get("counter", {})
        if not isinstance(counter, dict):
            raise InvalidEnvelope("a saved scope's counter is an object")
        return cls.model_construct(
            scope_id=document["scope_id"], counter=counter_of(counter, "scope's counter")
        )


def build_group(
    scope: Scope, calls: Sequence[Call], wake: WakePolicy, disposition: LoserPolicy
) -> EffectGroup:
    """The group for ``calls``: key ``{scope}:group:{content hash}:{occurrence}``.

    Raises:
        EmptyGroup: ``calls`` is empty (G-04).
    """
    if not calls:
        raise EmptyGroup("a group needs at least one call")
    parts = _plain_calls(calls)
    group = None if parts is None else _plain_group(scope, parts, wake, disposition)
    if group is not None:
        return group
    batch = batch_id([call.document() for call in calls])
    key = group_key(scope.scope_id, batch, scope.counter.next(batch))
    children = [
        EffectEnvelope(
            replay_key=f"{key}:{index}", kind=call.kind, name=call.name, input=call.input
        )
        for index, call in enumerate(calls)
    ]
    return EffectGroup(key=key, wake=wake, disposition=disposition, children=children)


def _plain_calls(calls: Sequence[Call]) -> list[tuple[str, str, JsonValue, str]] | None:
    """Each call's kind, name, input (a fresh normalised copy) and the input's canonical
    JSON, when every call is plain JSON within the limits, its kind and name text; else
    ``None`` and :func:`build_group` takes the general path (and its refusals)."""
    parts = []
    for call in calls:
        if type(call) is not Call:
            return None
        fields = call.__dict__
        kind, name = fields.get("kind"), fields.get("name")
        if type(kind) is not str or type(name) is not str:
            return None
        value = _normalized(fields.get("input"))
        if isinstance(value, _Unusual):
            return None
        parts.append((kind, name, value, _plain_text(value)))
    return parts


def _plain_group(
    scope: Scope,
    parts: list[tuple[str, str, JsonValue, str]],
    wake: WakePolicy,
    disposition: LoserPolicy,
) -> EffectGroup | None:
    """:func:`build_group` from :func:`_plain_calls`' parts: each input is encoded once,
    for the batch id and the child's canonical envelope both (the same bytes and hashes
    as the general path). ``None``, with nothing counted, for a kind or name that is not
    valid Unicode (the general path refuses it)."""
    documents = ",".join(
        f'{{"input":{text},"kind":{_text_of_string(kind)},"name":{_text_of_string(name)}}}'
        for kind, name, _value, text in parts
    )
    try:
        batch = hashlib.sha256(f"[{documents}]".encode()).hexdigest()[:24]
    except UnicodeEncodeError:
        return None
    key = group_key(scope.scope_id, batch, scope.counter.next(batch))
    if limits._text_problem(key, limits.MAX_KEY_BYTES) is not None:
        children: list[EffectEnvelope] = [
            EffectEnvelope(replay_key=f"{key}:{index}", kind=kind, name=name, input=value)
            for index, (kind, name, value, _text) in enumerate(parts)
        ]
        return EffectGroup(key=key, wake=wake, disposition=disposition, children=children)
    children = []
    keys_fit = _fits(f"{key}:{len(parts) - 1}", limits.MAX_KEY_BYTES)  # the longest replay key
    names_fit: set[str] = set()  # kinds and names checked (a group repeats a few)
    size = 0
    grouped = EffectEnvelope._grouped
    for index, (kind, name, value, text) in enumerate(parts):
        replay_key = f"{key}:{index}"
        if not (
            (keys_fit or _fits(replay_key, limits.MAX_KEY_BYTES))
            and (kind in names_fit or _fits(kind, limits.MAX_NAME_BYTES))
            and (name in names_fit or _fits(name, limits.MAX_NAME_BYTES))
        ):  # the constructor refuses it with its message
            EffectEnvelope(replay_key=replay_key, kind=kind, name=name, input=value)
        names_fit.add(kind)
        names_fit.add(name)
        envelope = grouped(
            replay_key, kind, name, value, text, _membership(key, index, wake, disposition)
        )
        size += envelope.canonical_size()
        children.append(envelope)
    if (
        len(children) <= limits.MAX_CHILDREN
        and size <= limits.MAX_GROUP_BYTES
        and type(wake) is WakePolicy
        and type(disposition) is LoserPolicy
    ):
        # what the constructor checks, checked: distinct replay keys, stamped memberships
        return _build(
            EffectGroup,
            {"key": key, "wake": wake, "disposition": disposition, "children": tuple(children)},
        )
    return EffectGroup(key=key, wake=wake, disposition=disposition, children=children)


def _fits(text: str, limit: int) -> bool:
    return bool(text) and limits._text_problem(text, limit) is None


def next_group_key(scope: Scope, calls: Sequence[Call]) -> str:
    """The key :func:`build_group` will give ``calls`` next, without counting it; lets a
    caller tell an event sender where to deliver before the group is opened."""
    batch = batch_id([call.document() for call in calls])
    return group_key(scope.scope_id, batch, scope.counter.counts.get(batch, 0))


async def settlements(
    controller: EffectController, handle: GroupHandle
) -> AsyncIterator[Settlement]:
    """Settlements of ``handle`` in rank order until its cursor is exhausted."""
    while not handle.exhausted:
        yield await controller.await_next_settlement(handle)


@asynccontextmanager
async def _opened(controller: EffectController, group: EffectGroup) -> AsyncIterator[GroupHandle]:
    """Open ``group`` for a combinator's body. When the body (or the open) is cancelled
    from outside, the group is closed with its declared disposition, shielded from the
    cancellation, before the cancellation propagates (R-9): otherwise the group stays open
    and a ``CANCEL`` group's losers run on while the caller lives."""
    opening = asyncio.ensure_future(controller.open_effect_group(group))
    try:
        handle = await asyncio.shield(opening)
    except asyncio.CancelledError:
        # the open may record the group after all: let it finish, then close what it made
        if await _settle_shielded(opening):
            await _close_shielded(controller, group.handle())
        raise
    try:
        yield handle
    except BaseException as exc:
        # also an engine client that reports a cancelled request its own way while the
        # task is being cancelled
        if isinstance(exc, asyncio.CancelledError) or _being_cancelled():
            await _close_shielded(controller, handle)
        raise


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _settle_shielded(opening: asyncio.Future[GroupHandle]) -> bool:
    """Wait out ``opening`` through further cancellations; whether it recorded a group."""
    while not opening.done():
        try:
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            continue
        except Exception:  # its refusal is not the caller's error now
            break
    return opening.done() and not opening.cancelled() and opening.exception() is None


async def _close_shielded(controller: EffectController, handle: GroupHandle) -> None:
    """Close ``handle``'s group with its disposition in force (R-3), to completion even if
    cancelled again meanwhile; a refusal is logged (the cancellation is what propagates)."""
    closing = asyncio.ensure_future(controller.close_effect_group(handle))
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            continue
        except Exception:  # logged below
            break
    if not closing.cancelled() and (error := closing.exception()) is not None:
        log.warning(
            "closing group %r after an outer cancellation failed: %s: %s",
            handle.group_key,
            type(error).__name__,
            error,
        )


def _value(settlement: Settlement, key: str) -> Any:
    if not settlement.outcome.ok:
        raise EffectFailed(settlement, key)
    return settlement.outcome.value


async def race(
    controller: EffectController,
    scope: Scope,
    calls: Sequence[Call],
    *,
    disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION,
) -> Any:
    """The first settlement in rank order, success or failure (G-24). Losers run on
    unless ``disposition`` is ``CANCEL`` (G-25).

    Raises:
        EmptyGroup: no calls: ``race([])`` could never settle (G-04); no host is touched.
        EffectFailed: the first settlement is an error or a cancellation.
    """
    if not calls:
        raise EmptyGroup("race([]) never settles; refused without touching a host")
    group = build_group(scope, calls, WakePolicy.FIRST, disposition)
    del calls  # as in ``all_``
    async with _opened(controller, group) as handle:
        first = await controller.await_next_settlement(handle)
        await controller.close_effect_group(handle)
    return _value(first, group.key)


async def any_(
    controller: EffectController,
    scope: Scope,
    calls: Sequence[Call],
    *,
    disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION,
) -> Any:
    """The first success in rank order; every failure aggregated if all fail (G-24).

    Raises:
        EmptyGroup: no calls (``any([])`` has no success to return).
        AllEffectsFailed: every child failed; carries each failure.
    """
    if not calls:
        raise EmptyGroup("any([]) has no child that could succeed")
    group = build_group(scope, calls, WakePolicy.FIRST_SUCCESS, disposition)
    del calls  # as in ``all_``
    failures: list[EffectFailed] = []
    async with _opened(controller, group) as handle:
        async for settlement in settlements(controller, handle):
            if settlement.outcome.ok:
                await controller.close_effect_group(handle)
                return settlement.outcome.value
            failures.append(EffectFailed(settlement, group.key))
        await controller.close_effect_group(handle)
    raise AllEffectsFailed(failures, group.key)


first_success = any_


async def all_(controller: EffectController, scope: Scope, calls: Sequence[Call]) -> list[Any]:
    """Values in position order, or the first rejection in *rank* order; losers run on
    (``RUN_TO_COMPLETION``) after an early rejection (G-23, G-24, G-25).

    Raises:
        EffectFailed: the rejection with the smallest rank.
    """
    if not calls:
        return []
    group = build_group(scope, calls, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
    del calls  # the group holds its own copies: calls passed inline are freed while it runs
    values: dict[int, Any] = {}
    async with _opened(controller, group) as handle:
        while not handle.exhausted:  # ``settlements`` inlined: no generator step per child
            settlement = await controller.await_next_settlement(handle)
            outcome = settlement.outcome
            if not outcome.ok:
                await controller.close_effect_group(handle)
                raise EffectFailed(settlement, group.key)
            values[settlement.position] = outcome.value
        await controller.close_effect_group(handle)
    return [values[position] for position in range(group.child_count)]


async def all_settled(
    controller: EffectController, scope: Scope, calls: Sequence[Call]
) -> list[Outcome]:
    """Every outcome, in position order (G-24)."""
    if not calls:
        return []
    group = build_group(scope, calls, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
    del calls  # as in ``all_``
    outcomes: dict[int, Outcome] = {}
    async with _opened(controller, group) as handle:
        async for settlement in settlements(controller, handle):
            outcomes[settlement.position] = settlement.outcome
        await controller.close_effect_group(handle)
    return [outcomes[position] for position in range(group.child_count)]


async def with_deadline(
    controller: EffectController, scope: Scope, call: Call, seconds: float
) -> Any:
    """Run ``call`` against a deadline: a two-child ``FIRST`` group declaring ``CANCEL``
    (G-25, G-52). The loser is cancelled either way.

    Raises:
        DeadlineExceeded: the timer settled first.
        EffectFailed: ``call`` failed first.
    """
    group = build_group(scope, [call, sleep(seconds)], WakePolicy.FIRST, LoserPolicy.CANCEL)
    async with _opened(controller, group) as handle:
        first = await controller.await_next_settlement(handle)
        await controller.close_effect_group(handle)
    if first.position == 1:
        raise DeadlineExceeded(
            f"deadline of {seconds}s passed before {call.kind} {call.name!r} settled",
            group_key=group.key,
            replay_key=first.replay_key,
            position=first.position,
            rank=first.rank,
        )
    return _value(first, group.key)


async def wait_event_or_deadline(
    controller: EffectController, scope: Scope, name: str, seconds: float
) -> tuple[str, Any]:
    """The signal/deadline select (G-52): ``("event", payload)`` when the event came
    first, ``("deadline", None)`` when the timer fired first. The group key to deliver the
    event to is ``next_group_key(scope, [wait_event(name), sleep(seconds)])`` taken before.

    Raises:
        EffectFailed: the first settlement is a cancelled arm (a drain applied the group's
            ``CANCEL`` after its caller's process died): no deadline passed.
    """
    group = build_group(
        scope, [wait_event(name), sleep(seconds)], WakePolicy.FIRST, LoserPolicy.CANCEL
    )
    async with _opened(controller, group) as handle:
        first = await controller.await_next_settlement(handle)
        await controller.close_effect_group(handle)
    value = _value(first, group.key)
    if first.position == 1:
        return ("deadline", None)
    return ("event", value)
