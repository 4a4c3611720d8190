"""A combinator cancelled from outside at every step of its life: ruling R-9 (G-25, G-26),
beyond the one cancellation ``an_outer_cancellation_closes_the_group`` sends.

The host is wrapped in a controller that holds the open or the close at a gate the check
opens, so a further cancellation lands while the combinator's own open or close is under
way, and that can make the host's await report a cancellation its own way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from effecthost.combinators import Call, Scope, next_group_key, race, tool
from effecthost.contract import (
    EffectController,
    EffectGroup,
    EngineUnavailable,
    GroupClosed,
    GroupHandle,
    LoserPolicy,
    ReplayMismatch,
    WakePolicy,
)

from .._context import CheckContext
from .._registry import check
from .._tools import STEP, step_input
from ._recording import Recording
from .closing import ranks_complete

COMBINATOR_LOG = "effecthost.combinators"
"""The logger a combinator reports a failed shielded close on (docs/contract.md, R-9)."""

CANCELLATIONS = 3
"""Further cancellations sent while the combinator's open or close is held."""


class _Held(Recording):
    """Delegates to a host; holds the open or the close at a gate, and can make the
    await report a cancellation as an engine client might (an error of its own)."""

    def __init__(
        self,
        inner: EffectController,
        *,
        hold_open: bool = False,
        hold_close: bool = False,
        close_error: Exception | None = None,
        cancel_as: Exception | None = None,
    ) -> None:
        super().__init__(inner)
        self.closes: list[LoserPolicy | None] = []
        self.opening, self.open_gate = asyncio.Event(), asyncio.Event()
        self.closing, self.close_gate = asyncio.Event(), asyncio.Event()
        if not hold_open:
            self.open_gate.set()
        if not hold_close:
            self.close_gate.set()
        self.close_error = close_error
        self.cancel_as = cancel_as

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self.opened.append(group)
        self.opening.set()
        await self.open_gate.wait()
        return await self.inner.open_effect_group(group)

    async def await_next_settlement(self, handle: GroupHandle) -> Any:
        try:
            return await super().await_next_settlement(handle)
        except asyncio.CancelledError:
            if self.cancel_as is None:
                raise
            raise self.cancel_as from None

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        self.closes.append(disposition)
        self.closing.set()
        await self.close_gate.wait()
        if self.close_error is not None:
            raise self.close_error
        await super().close_effect_group(handle, disposition)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _combinator_log() -> Iterator[list[logging.LogRecord]]:
    """The records the combinators log meanwhile."""
    logger = logging.getLogger(COMBINATOR_LOG)
    handler = _Records()
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _about(records: list[logging.LogRecord], key: str) -> list[str]:
    """The rendered messages of ``records`` that name group ``key``; a record that cannot
    be rendered is reported as such (it names nothing)."""
    found = []
    for record in records:
        try:
            text = record.getMessage()
        except (TypeError, ValueError) as exc:
            text = f"<unrenderable log record: {exc}>"
        if repr(key) in text or key in str(record.args):
            found.append(text)
    return found


def _call(t: CheckContext, label: str) -> Call:
    return tool(STEP, step_input(t.tag(label)))


async def _ended_cancelled(t: CheckContext, task: asyncio.Task[Any], what: str) -> None:
    """``task`` must end within the timeout with the caller's own cancellation."""
    await asyncio.wait({task}, timeout=t.timeout)
    t.expect(task.done(), f"{what} did not return within {t.timeout}s")
    if not task.cancelled():
        raise AssertionError(f"{what} ended with {task.exception()!r}, not its cancellation")


async def _cancel_again(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` :data:`CANCELLATIONS` times, each delivered before the next: a
    cancellation wakes the task through the loop's ready queue, which runs in order, so
    one yield of this task lets it land (an ordering of the loop, not of time)."""
    for _ in range(CANCELLATIONS):
        task.cancel()
        await asyncio.sleep(0)


def _race(t: CheckContext, held: _Held) -> asyncio.Task[Any]:
    """A ``race`` of children ``a`` and ``b`` declaring ``CANCEL``, through ``held``."""
    calls = [_call(t, "a"), _call(t, "b")]
    return asyncio.ensure_future(
        race(held, Scope(scope_id=t.scope), calls, disposition=LoserPolicy.CANCEL)
    )


async def _cancelled_while_running(
    t: CheckContext, held: _Held
) -> tuple[asyncio.Task[Any], EffectGroup]:
    """:func:`_race`, cancelled from outside once both children run; returns its task
    and its group."""
    task = _race(t, held)
    await t.started("a")
    await t.started("b")
    group = held.opened[0]
    t.remember(group.handle())
    task.cancel()
    return task, group


async def _is_closed(t: CheckContext, ctl: EffectController, group: EffectGroup) -> None:
    t.expect(group.key not in await ctl.open_group_keys(), f"group {group.key!r} is still open")
    await t.refuses(
        GroupClosed, ctl.await_next_settlement(group.handle()), f"an await of {group.key!r}"
    )


@check("G-26", "G-27")
async def check_a_cancellation_during_the_close_still_closes(t: CheckContext) -> None:
    """Ruling R-9: the close a combinator makes after a cancellation from outside runs to
    its end however often the caller is cancelled again meanwhile. A ``race`` declaring
    ``CANCEL`` is cancelled while both children run, then cancelled again while its close
    is still under way: it must not return before the close has, must end with the
    caller's cancellation, and leaves the group closed with both losers cancelled (G-27).
    A close that succeeded is not reported as a failure in the log."""
    ctl = await t.ctl()
    held = _Held(ctl, hold_close=True)
    with _combinator_log() as records:
        task, group = await _cancelled_while_running(t, held)
        await t.within(held.closing.wait(), "the close after the outer cancellation")
        await _cancel_again(task)
        t.expect(not task.done(), "the cancelled race returned before its close did")
        held.close_gate.set()
        await _ended_cancelled(t, task, "the race cancelled during its close")
    t.expect(
        held.closes[:1] in ([None], [LoserPolicy.CANCEL]),
        f"the close asked for {held.closes[:1]}, not the disposition in force (R-3)",
    )
    await _is_closed(t, ctl, group)
    await t.cancelled("a")
    await t.cancelled("b")
    logged = _about(records, group.key)
    t.expect(not logged, f"a close that succeeded was logged as failed: {logged}")


@check("G-26", "G-08")
async def check_a_cancellation_during_the_open_closes_what_it_recorded(
    t: CheckContext,
) -> None:
    """Ruling R-9 (docs/contract.md): a cancellation that arrives while the group is being
    opened lets the open finish, then closes the group, however often it is repeated. A
    ``race`` declaring ``CANCEL`` is cancelled while the host's open is held, and again;
    then the open is let through and records the group (G-08). The race must not return
    before its open has, must end with the caller's cancellation, and leaves the group
    closed, every child taking a rank (cancelled before it could finish)."""
    ctl = await t.ctl()
    held = _Held(ctl, hold_open=True)
    task = _race(t, held)
    await t.within(held.opening.wait(), "the race's open")
    group = held.opened[0]
    t.remember(group.handle())
    await _cancel_again(task)
    t.expect(not task.done(), "the race cancelled during its open returned before the open did")
    held.open_gate.set()
    await _ended_cancelled(t, task, "the race cancelled during its open")
    await _is_closed(t, ctl, group)
    await ranks_complete(t, ctl, group.key, 2)
    finished = t.count("finished", "a") + t.count("finished", "b")
    t.expect(finished == 0, "a child of the closed CANCEL group ran to its end")


@check("G-26", "G-30")
async def check_an_open_refused_during_a_cancellation_closes_nothing(t: CheckContext) -> None:
    """Ruling R-9 closes the group a combinator opened; an open the host refused opened
    nothing, so nothing is closed. Another caller holds a ``CANCEL`` group under the key
    a ``race`` will use, with other inputs; the race is cancelled while its open is held,
    and the open, let through, is refused (``ReplayMismatch``, R-6). The race must end
    with the caller's cancellation, and close nothing: the other caller's group stays
    open (G-30: only an entitled caller closes it) and its children run on."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    calls = [_call(t, "a"), _call(t, "b")]
    key = next_group_key(scope, calls)
    children = [
        t.step(label).model_copy(update={"replay_key": f"{key}:{n}"})
        for n, label in enumerate(("x", "y"))
    ]
    theirs = EffectGroup(
        key=key, wake=WakePolicy.FIRST, disposition=LoserPolicy.CANCEL, children=children
    )
    handle = await t.open(ctl, theirs)
    await t.started("x")
    held = _Held(ctl, hold_open=True)
    task = asyncio.ensure_future(race(held, scope, calls, disposition=LoserPolicy.CANCEL))
    await t.within(held.opening.wait(), "the race's open")
    await _cancel_again(task)
    held.open_gate.set()
    await _ended_cancelled(t, task, "the race whose open was refused")
    await t.refuses(ReplayMismatch, ctl.open_effect_group(held.opened[0]), "the race's group")
    t.expect(held.closes == [], f"the race closed a group it never opened: {held.closes}")
    t.expect(key in await ctl.open_group_keys(), "the other caller's group was closed")
    t.release("x")
    settlement = await t.next(ctl, handle)
    t.expect(
        settlement.replay_key == f"{key}:0" and settlement.outcome.ok,
        f"the other caller's group served {settlement.replay_key!r} "
        f"({settlement.outcome.status}), not its running child",
    )


@check("G-26", "G-19")
async def check_a_cancellation_reported_by_the_host_its_own_way_still_closes(
    t: CheckContext,
) -> None:
    """Ruling R-9 is about the caller being cancelled, not about the exception the host's
    await ends with: an engine client may report its cancelled request as an error of its
    own (here ``EngineUnavailable``) while the caller's task is being cancelled. A
    ``race`` declaring ``CANCEL`` cancelled from outside, its await ending that way, must
    still close its group and cancel both children."""
    ctl = await t.ctl()
    reported = EngineUnavailable("the request was cancelled", operation="await")
    held = _Held(ctl, cancel_as=reported)
    task, group = await _cancelled_while_running(t, held)
    await asyncio.wait({task}, timeout=t.timeout)
    t.expect(task.done(), "the cancelled race did not return")
    if not task.cancelled():
        task.exception()  # the host's own report of the cancellation, retrieved
    t.expect(held.closes != [], "the cancelled race did not close its group")
    await _is_closed(t, ctl, group)
    await t.cancelled("a")
    await t.cancelled("b")


@check("G-26", "G-30")
async def check_a_failed_close_after_a_cancellation_is_logged(t: CheckContext) -> None:
    """Ruling R-9 (docs/contract.md): when the close a combinator makes after a
    cancellation from outside fails, the caller still sees its own cancellation, not the
    close's error, and the failure is logged as a warning on ``effecthost.combinators``
    naming the group key, the error's type and its message, so an operator can find the
    group left open (G-30) and why. Here the host's close gives up with
    ``EngineUnavailable`` (R-12)."""
    ctl = await t.ctl()
    scope = Scope(scope_id=t.scope)
    calls = [_call(t, "a"), _call(t, "b")]
    key = next_group_key(scope, calls)
    refusal = EngineUnavailable("the engine is away", group_key=key, operation="close")
    held = _Held(ctl, close_error=refusal)
    with _combinator_log() as records:
        task = asyncio.ensure_future(race(held, scope, calls, disposition=LoserPolicy.CANCEL))
        await t.started("a")
        t.remember(held.opened[0].handle())
        task.cancel()
        await _ended_cancelled(t, task, "the race whose close failed")
    warned = [r for r in records if r.levelno == logging.WARNING]
    logged = _about(warned, key)
    named = ("EngineUnavailable", "the engine is away", repr(key))
    t.expect(
        len(logged) == 1 and all(part in logged[0] for part in named),
        f"the failed close of {key!r} was logged as {logged} (warnings: "
        f"{[r.msg for r in warned]}), not once naming the group, EngineUnavailable and "
        "its message",
    )
