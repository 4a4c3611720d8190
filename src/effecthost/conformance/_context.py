"""What a check works with: the host, the lab, fresh keys and small helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from effecthost.contract import (
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    EffectKind,
    GroupHandle,
    LoserPolicy,
    Settlement,
    WakePolicy,
    group_key,
    sleep_input,
)

from ._host import HostUnderTest
from ._lab import Lab
from ._tools import STEP, UNROUTABLE, step_input

E = TypeVar("E", bound=BaseException)
T = TypeVar("T")


INPUT_MARKER = "conformance-input-bytes"
"""Carried in the input of every step a check builds: a refusal whose message or
attributes contain it carries payload bytes, where it may name ids only."""


class CheckFailed(AssertionError):
    """A check observed behaviour the contract forbids."""


class CheckContext:
    """Per-check state. Keys and tags are prefixed with ``scope`` so checks sharing one
    host never see each other's groups."""

    def __init__(self, host: HostUnderTest, lab: Lab, scope: str) -> None:
        self.host = host
        self.lab = lab
        self.scope = scope
        self.timeout = host.timeout
        self._controllers: dict[bool, EffectController] = {}
        self._opened: list[GroupHandle] = []

    # -- host access --------------------------------------------------------------------

    async def ctl(self, *, wired: bool = True) -> EffectController:
        """The host's controller (cached until :meth:`restart`)."""
        if wired not in self._controllers:
            self._controllers[wired] = await self.host.controller(wired=wired)
        return self._controllers[wired]

    async def restart(self) -> None:
        """Restart the host; controllers obtained before are dropped."""
        self._controllers.clear()
        await self.host.restart()

    async def open(self, controller: EffectController, group: EffectGroup) -> GroupHandle:
        """Open ``group`` and remember it for :meth:`cleanup`. Awaited in this task (no
        ``wait_for`` task between): the check's next statement runs before the loop turns
        again, so an event delivered right after the open finds no waiter started yet."""
        async with asyncio.timeout(self.timeout):
            handle = await controller.open_effect_group(group)
        self.remember(handle)
        return handle

    def remember(self, handle: GroupHandle) -> None:
        """Have :meth:`cleanup` close the group of ``handle`` (a check that opened it
        without :meth:`open`)."""
        self._opened.append(handle.copy_cursor())

    async def cleanup(self) -> None:
        """Release every gate of this check and cancel what it left open."""
        self.lab.open_all(f"{self.scope}.")
        for tag in list(self.lab.denied_tags(self.scope)):
            self.lab.allow(tag)
        if not self._opened:
            return
        try:
            controller = await self.ctl()
            for handle in self._opened:
                try:
                    await asyncio.wait_for(
                        controller.close_effect_group(handle, LoserPolicy.CANCEL), self.timeout
                    )
                except (EffectHostError, TimeoutError):
                    pass
        except EffectHostError:
            pass

    # -- building children --------------------------------------------------------------

    def tag(self, label: str) -> str:
        return f"{self.scope}.{label}"

    def key(self, label: str) -> str:
        return group_key(self.scope, label, 0)

    def step(
        self,
        label: str,
        *,
        gate: bool = True,
        result: Any = None,
        error: str | None = None,
        hold_cancel: bool = False,
    ) -> EffectEnvelope:
        """A gated tool child: reports ``started``, waits for gate ``tag(label)``."""
        tag = self.tag(label)
        return EffectEnvelope(
            replay_key=tag,
            kind=EffectKind.TOOL_CALL,
            name=STEP,
            input={
                **step_input(tag, gate=gate, result=result, error=error, hold_cancel=hold_cancel),
                "note": INPUT_MARKER,
            },
        )

    def unroutable(self, label: str) -> EffectEnvelope:
        return EffectEnvelope(
            replay_key=self.tag(label),
            kind=EffectKind.TOOL_CALL,
            name=UNROUTABLE,
            input={"note": INPUT_MARKER},
        )

    def sleep(self, label: str, seconds: float) -> EffectEnvelope:
        return EffectEnvelope(
            replay_key=self.tag(label),
            kind=EffectKind.SLEEP,
            name="sleep",
            input=sleep_input(seconds),
        )

    def event(self, label: str, name: str) -> EffectEnvelope:
        return EffectEnvelope(
            replay_key=self.tag(label), kind=EffectKind.AWAIT_EVENT, name=name, input=None
        )

    def group(
        self,
        label: str,
        children: Sequence[EffectEnvelope],
        *,
        wake: WakePolicy = WakePolicy.ALL,
        disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION,
    ) -> EffectGroup:
        return EffectGroup(
            key=self.key(label), wake=wake, disposition=disposition, children=list(children)
        )

    # -- driving children ---------------------------------------------------------------

    def release(self, *labels: str) -> None:
        """Open the gates of the steps ``labels``."""
        for label in labels:
            self.lab.open(self.tag(label))

    async def started(self, label: str, count: int = 1) -> None:
        """Wait until step ``label`` has started ``count`` times."""
        await self.lab.wait_for("started", self.tag(label), count, self.timeout)

    async def cancelled(self, label: str, count: int = 1) -> None:
        await self.lab.wait_for("cancelled", self.tag(label), count, self.timeout)

    async def finished(self, label: str, count: int = 1) -> None:
        await self.lab.wait_for("finished", self.tag(label), count, self.timeout)

    def count(self, kind: str, label: str) -> int:
        return self.lab.count(kind, self.tag(label))

    # -- reading ranks ------------------------------------------------------------------

    async def next(
        self, controller: EffectController, handle: GroupHandle, *, rank: int | None = None
    ) -> Settlement:
        """Await the next settlement, failing the check if it takes longer than the
        host's timeout; checks the rank served is ``consumed + 1`` (G-18)."""
        expected = handle.consumed + 1
        try:
            settlement = await asyncio.wait_for(
                controller.await_next_settlement(handle), self.timeout
            )
        except TimeoutError:
            raise CheckFailed(
                f"rank {expected} of {handle.group_key!r} was not served within {self.timeout}s"
            ) from None
        self.expect(
            settlement.rank == expected,
            f"asked for rank {expected}, got a settlement labelled rank {settlement.rank}",
        )
        self.expect(
            handle.consumed == expected,
            f"handle advanced to {handle.consumed}, expected exactly {expected}",
        )
        if rank is not None:
            self.expect(settlement.rank == rank, f"expected rank {rank}")
        return settlement

    async def settled(
        self, controller: EffectController, handle: GroupHandle, count: int
    ) -> dict[str, Settlement]:
        """The next ``count`` settlements (:meth:`next`), by replay key."""
        served = [await self.next(controller, handle) for _ in range(count)]
        return {settlement.replay_key: settlement for settlement in served}

    async def next_is(
        self, controller: EffectController, handle: GroupHandle, label: str
    ) -> Settlement:
        """The next settlement must be step ``label``."""
        settlement = await self.next(controller, handle)
        self.expect(
            settlement.replay_key == self.tag(label),
            f"rank {settlement.rank} should be {self.tag(label)!r}, got {settlement.replay_key!r}",
        )
        return settlement

    # -- assertions ---------------------------------------------------------------------

    async def within(self, action: Awaitable[T], what: str) -> T:
        """Await ``action``, failing the check with ``what`` if it outlasts the timeout."""
        try:
            return await asyncio.wait_for(action, self.timeout)
        except TimeoutError:
            raise CheckFailed(f"{what} did not finish within {self.timeout}s") from None

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            raise CheckFailed(message)

    async def refuses(
        self,
        error: type[E],
        action: Awaitable[Any],
        what: str,
        *,
        names: Mapping[str, object] | None = None,
    ) -> E:
        """``action`` must raise ``error`` (a typed :class:`EffectHostError`) whose message
        and attributes name ids only: none carries the input of a step (:data:`INPUT_MARKER`).
        ``names``: the ids the error must carry as attributes (``group_key``, ...); its
        message must name the group key among them (SPEC §7: an error names its ids)."""
        try:
            await asyncio.wait_for(action, self.timeout)
        except error as exc:
            self.ids_only(exc, what)
            for field, expected in (names or {}).items():
                found = getattr(exc, field, None)
                if found != expected:
                    raise CheckFailed(
                        f"{what}: the {type(exc).__name__} carries {field}={found!r}, not "
                        f"{expected!r} (an error carries the ids it is about)"
                    ) from None
            key = (names or {}).get("group_key")
            if isinstance(key, str) and key not in str(exc):
                raise CheckFailed(
                    f"{what}: the {type(exc).__name__}'s message does not name group {key!r}: {exc}"
                ) from None
            return exc
        except TimeoutError:
            raise CheckFailed(f"{what}: expected {error.__name__}, but it hung") from None
        except EffectHostError as exc:
            raise CheckFailed(
                f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}"
            ) from None
        raise CheckFailed(f"{what}: expected {error.__name__}, but it was accepted")

    def ids_only(self, error: BaseException, what: str) -> None:
        """``error`` (raised, or reported by a drain) names ids only: neither its message
        nor its attributes carry the input of a step (:data:`INPUT_MARKER`)."""
        text = f"{error!s} {error!r} {vars(error)!r}"
        if INPUT_MARKER in text:
            raise CheckFailed(
                f"{what}: the {type(error).__name__} carries a child's input bytes"
            ) from None

    async def eventually(
        self, probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], what: str
    ) -> T:
        """Re-read host state until ``accept`` holds; for facts with no event to wait on
        (a group retiring). Not an ordering device: nothing is released by it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        delay = 0.005
        while True:
            value = await probe()
            if accept(value):
                return value
            if loop.time() > deadline:
                raise CheckFailed(f"timed out after {self.timeout}s waiting for {what}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
