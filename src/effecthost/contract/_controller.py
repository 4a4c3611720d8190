"""Executors, the resolver seam and the controller base with loud defaults."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ._errors import (
    EffectGroupUnsupported,
    ExecutorConsumed,
    GroupShapeError,
    InvalidEnvelope,
    MembershipUnsupported,
    NoExecutor,
    NotInChild,
)
from ._kinds import is_host_kind
from ._types import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
)


class ToolError(Exception):
    """Raise from a tool to record a structured failure (type, message, data, code)."""

    def __init__(self, type: str, message: str, data: Any = None, code: int | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.data = data
        self.code = code


@dataclass(frozen=True)
class ExecutionInput:
    """What a host hands an executor: the envelope and which attempt this is."""

    envelope: EffectEnvelope
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class ChildInfo:
    """Who the running tool is, for side effects that must be idempotent across attempts.

    ``replay_key`` (with ``group_key`` and ``position``) is the same on every attempt of a
    child; ``attempt`` is 1 on the first run and grows on each re-run the engine makes
    (after a crash, a lost lease or an activity retry). ``group_key`` and ``position`` are
    ``None`` for an ungrouped envelope.
    """

    replay_key: str
    group_key: str | None
    position: int | None
    attempt: int
    kind: str
    name: str


_CURRENT: ContextVar[ExecutionInput] = ContextVar("effecthost_current_child")


def current_child() -> ChildInfo:
    """The identity of the child whose tool is running in this context (like Temporal's
    ``activity.info()``). Tasks and ``asyncio.to_thread`` calls the tool starts copy it.

    Raises:
        NotInChild: called outside a child's tool.
    """
    call = _CURRENT.get(None)
    if call is None:
        raise NotInChild("current_child() is only available while a child's tool runs")
    envelope, membership = call.envelope, call.envelope.membership
    return ChildInfo(
        replay_key=envelope.replay_key,
        group_key=membership.group_key if membership is not None else None,
        position=membership.position if membership is not None else None,
        attempt=call.attempt,
        kind=envelope.kind,
        name=envelope.name,
    )


class EffectExecutor(ABC):
    """Runs one child once. ``execute`` consumes it: a retry resolves a fresh one (G-09).

    Subclasses implement :meth:`run`; a returned value is a success, a raised
    :class:`ToolError` (or any exception) is an error outcome. Cancellation propagates.
    """

    # one executor per child is alive until the child runs; subclasses may still add a dict
    __slots__ = ("_used",)

    def __init__(self) -> None:
        self._used = False

    async def execute(self, call: ExecutionInput) -> Outcome:
        """Run the child and turn its result into an :class:`Outcome`.

        Raises:
            ExecutorConsumed: this executor already ran (G-09).
            asyncio.CancelledError: the host cancelled the child.
        """
        if self._used:
            raise ExecutorConsumed(
                f"executor for {call.envelope.replay_key!r} already ran",
                replay_key=call.envelope.replay_key,
            )
        self._used = True
        key = call.envelope.replay_key
        token = _CURRENT.set(call)  # the input itself: a ChildInfo is built only when asked
        try:
            value = await self.run(call)
        except ToolError as exc:
            return _recorded(key, Outcome.failure, exc.type, exc.message, exc.data, exc.code)
        except Exception as exc:  # a tool's own bug is still the child's outcome
            return _recorded(key, _failure_of, exc)
        finally:
            _CURRENT.reset(token)
        return _recorded(key, Outcome.success, value)

    @abstractmethod
    async def run(self, call: ExecutionInput) -> Any:
        """The child's work; return a JSON value or raise."""


def _failure_of(exc: Exception) -> Outcome:
    return Outcome.failure(type(exc).__name__, str(exc))


def _recorded(replay_key: str, build: Callable[..., Outcome], *args: Any) -> Outcome:
    """``build(*args)``, or — when what the tool produced is over the limits (R-8) or cannot be
    turned into an outcome at all — the child's typed failure naming the limit, so the
    child always settles (never a hang, never a rank no reader can decode)."""
    try:
        return build(*args)
    except InvalidEnvelope as exc:
        reason = str(exc).removeprefix(f"[{exc.code.value}] ")
        return Outcome.failure(type(exc).__name__, f"result of child {replay_key!r}: {reason}")
    except Exception as exc:  # e.g. a tool error whose __str__ raises
        return Outcome.failure(
            "InvalidEnvelope",
            f"result of child {replay_key!r} cannot be recorded ({type(exc).__name__})",
        )


ToolFunction = Callable[[Any], Awaitable[Any]]


class FunctionExecutor(EffectExecutor):
    """An executor around an ``async def tool(input)``."""

    __slots__ = ("_fn",)

    def __init__(self, fn: ToolFunction) -> None:
        super().__init__()
        self._fn = fn

    def run(self, call: ExecutionInput) -> Coroutine[Any, Any, Any]:
        # the tool's own awaitable, not a coroutine around it: one frame less per child
        return self._fn(call.envelope.input)  # type: ignore[return-value]


class GroupExecutors(ABC):
    """The resolver: the only way a host finds a child's runner (G-09).

    ``resolve`` returns a *fresh* executor each call, or ``None`` when this deployment
    cannot run the envelope (a routing fact, never an outcome: G-10, G-11).
    """

    @abstractmethod
    def resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None: ...


class ToolRegistry(GroupExecutors):
    """A resolver over named ``async def`` tools for ``tool_call`` children.

    ``sleep`` and ``await_event`` children are run by the host itself (G-51), so a registry
    only answers tool calls.
    """

    def __init__(self, tools: Mapping[str, ToolFunction] | None = None) -> None:
        self._tools: dict[str, ToolFunction] = dict(tools or {})

    def tool(self, name: str) -> Callable[[ToolFunction], ToolFunction]:
        """Decorator registering ``fn`` under ``name``."""

        def register(fn: ToolFunction) -> ToolFunction:
            self._tools[name] = fn
            return fn

        return register

    def add(self, name: str, fn: ToolFunction) -> None:
        self._tools[name] = fn

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._tools)

    def resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        if envelope.kind != EffectKind.TOOL_CALL:
            return None
        fn = self._tools.get(envelope.name)
        return FunctionExecutor(fn) if fn is not None else None


@dataclass(frozen=True)
class DrainReport:
    """What one drain pass did (G-11, G-12, G-29, G-34).

    ``no_executor`` lists children this host cannot run; they stay unfinished and their
    groups stay visible, so a pass that reports them is never "empty".
    """

    resumed: tuple[tuple[str, str], ...] = ()
    cancelled: tuple[tuple[str, str], ...] = ()
    no_executor: tuple[NoExecutor, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.resumed or self.cancelled or self.no_executor)


class GroupDrain(ABC):
    """Finishes children whose caller is gone, applying the group's recorded disposition."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _on_subclass is not None:
            _on_subclass(cls)

    @abstractmethod
    async def run_pass(self) -> DrainReport:
        """One pass over unfinished children of open (or abandoned) groups."""


_on_subclass: Callable[[type], None] | None = None
"""Called with each controller or drain class defined after instrumentation was switched on
(``effecthost.telemetry.instrument``), so a tier imported later is instrumented too; ``None``
otherwise: nothing runs per call when telemetry is off."""


class EffectController(ABC):  # noqa: B024 - loud defaults, nothing abstract (G-07)
    """The seam a caller talks to. Group methods refuse loudly until wired (G-07).

    A subclass implementing groups overrides every group method and answers
    :meth:`supports_effect_groups` from whether a resolver is registered — not a constant.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _on_subclass is not None:
            _on_subclass(cls)

    def supports_concurrent_effects(self) -> bool:
        """Whether ungrouped effects may run concurrently on this controller."""
        return False

    async def execute_effect(self, envelope: EffectEnvelope, executor: EffectExecutor) -> Outcome:
        """Run one ungrouped effect with a caller-supplied executor.

        Raises:
            MembershipUnsupported: the envelope carries group membership; this path has no
                slot for it and never strips it (G-06, G-53).
        """
        refuse_membership(envelope)
        return await executor.execute(ExecutionInput(envelope=envelope))

    def supports_effect_groups(self) -> bool:
        """True if and only if a ``GroupExecutors`` resolver is registered (G-07)."""
        return False

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        """Record ``group`` durably and start its children; return a handle with
        ``consumed = 0`` once recorded, not once a child settles (G-08).

        Raises:
            EffectGroupUnsupported: no resolver registered (G-07); nothing recorded.
            GroupShapeError: first open and the resolver returned ``None`` for a child;
                names its position and replay key; nothing recorded (G-10).
            GroupShapeMismatch: the key is recorded with another child count, wake or
                disposition (G-13).
            ReplayMismatch: a recorded child's envelope hash differs (G-02).
            GroupClosed: the key names a group this host has closed.
        """
        raise EffectGroupUnsupported(
            f"{type(self).__name__} has no GroupExecutors resolver registered",
            group_key=group.key,
        )

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        """Return rank ``handle.consumed + 1`` and advance ``handle`` by exactly one
        (G-18). Wakes on that rank, not on group completion (G-21). Cancelling the await
        leaves the handle and every rank untouched (G-19).

        Raises:
            EffectGroupUnsupported: no resolver registered (G-07).
            CursorExhausted: ``handle.consumed == child_count``; never clamped (G-20).
            HandleMismatch: the handle's child count, wake or disposition disagrees with
                the recorded group (G-20).
            UnknownGroup: no group is recorded under ``handle.group_key``.
            GroupClosed: the group was closed.
        """
        raise EffectGroupUnsupported(
            f"{type(self).__name__} has no GroupExecutors resolver registered",
            group_key=handle.group_key,
        )

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        """Release the caller's interest. Idempotent; may only narrow the declared
        disposition (G-26). Under ``CANCEL`` returns once one cancel per unsettled child is
        durably issued, without waiting for the losers (G-27).

        Raises:
            EffectGroupUnsupported: no resolver registered (G-07).
            DispositionWidened: ``CANCEL`` declared (or closed with) and
                ``RUN_TO_COMPLETION`` asked (G-26); nothing changes.
            HandleMismatch: the handle disagrees with the recorded group.
            UnknownGroup: no group is (or was) recorded under the key.
        """
        raise EffectGroupUnsupported(
            f"{type(self).__name__} has no GroupExecutors resolver registered",
            group_key=handle.group_key,
        )

    async def open_group_keys(self) -> list[str]:
        """Keys of groups not yet closed, so orphans can be counted (G-30)."""
        return []

    async def settlement_order(self, group_key: str) -> list[int]:
        """Positions in rank order so far: observability only (G-22).

        Raises:
            EffectGroupUnsupported: no resolver registered.
            UnknownGroup: no such group.
        """
        raise EffectGroupUnsupported(
            f"{type(self).__name__} has no GroupExecutors resolver registered",
            group_key=group_key,
        )

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        """Deliver event ``name`` to the unsettled ``await_event`` children of a group
        (G-51); returns how many children it reached.

        Raises:
            EffectGroupUnsupported: no resolver registered.
            UnknownGroup: no such group.
            InvalidEnvelope: ``payload`` is not strict JSON.
        """
        raise EffectGroupUnsupported(
            f"{type(self).__name__} has no GroupExecutors resolver registered",
            group_key=group_key,
        )

    def drain(self) -> GroupDrain:
        """A drain over this host's unfinished children; handed out even without a
        resolver, whose passes then report every unfinished child as ``NoExecutor`` (G-12).
        """
        return _EmptyDrain()


class _EmptyDrain(GroupDrain):
    async def run_pass(self) -> DrainReport:
        return DrainReport()


class WiredController(EffectController):
    """A controller whose group capability is exactly "a resolver is registered" (G-07).

    Hosts inherit the wiring (:meth:`register_executors`, :meth:`supports_effect_groups`,
    :meth:`require_wired`) and the first-open resolution rule (:meth:`first_unresolvable`,
    G-10) from here, so every tier answers these the same way. The kit's
    :class:`~effecthost.contract.kit.KitController` builds the group methods on it.
    """

    _resolver: GroupExecutors | None = None

    def register_executors(self, resolver: GroupExecutors | None) -> None:
        """Register (or, with ``None``, unregister) the resolver (G-07, G-09)."""
        self._resolver = resolver

    def supports_effect_groups(self) -> bool:
        return self._resolver is not None

    def require_wired(self, group_key: str) -> GroupExecutors:
        """The registered resolver. A host calls it first in every group method, after
        ``require_handle`` on await and close (R-2), so an unwired host refuses before it
        reads anything.

        Raises:
            EffectGroupUnsupported: none is registered; the caller records nothing (G-07).
        """
        if self._resolver is None:
            raise EffectGroupUnsupported(
                f"{type(self).__name__} has no GroupExecutors resolver registered "
                f"(group {group_key!r})",
                group_key=group_key,
            )
        return self._resolver

    def first_unresolvable(
        self, group: EffectGroup, *, skip: Callable[[int, EffectEnvelope], bool] | None = None
    ) -> tuple[int, EffectEnvelope] | None:
        """The first child the registered resolver cannot run, skipping the kinds the
        host runs itself (and whatever ``skip`` excludes); ``None`` when every child
        resolves (G-10). For a host that must decide a first open's refusal before it
        can tell whether the key is recorded (an engine tier)."""
        resolver = self._resolver
        if resolver is None:
            return first_unresolvable(group, lambda _child: None, skip=skip)
        return first_unresolvable(group, resolver.resolve, skip=skip)

    def _require_wired(self, group_key: str) -> GroupExecutors:
        """:meth:`require_wired`, under the name the tiers used before it was public."""
        return self.require_wired(group_key)

    def _first_unresolvable(
        self, group: EffectGroup, *, skip: Callable[[int, EffectEnvelope], bool] | None = None
    ) -> tuple[int, EffectEnvelope] | None:
        """:meth:`first_unresolvable`, under its earlier name."""
        return self.first_unresolvable(group, skip=skip)


def group_shape_error(group: EffectGroup, position: int, child: EffectEnvelope) -> GroupShapeError:
    """The refusal of a first open whose child at ``position`` has no executor (G-10)."""
    where = f"child {child.replay_key!r} at position {position} of group {group.key!r}"
    return GroupShapeError(
        f"no executor for {where} ({child.kind} {child.name!r}); nothing recorded",
        group_key=group.key,
        replay_key=child.replay_key,
        position=position,
    )


def first_unresolvable(
    group: EffectGroup,
    resolve: Callable[[EffectEnvelope], object | None],
    *,
    skip: Callable[[int, EffectEnvelope], bool] | None = None,
) -> tuple[int, EffectEnvelope] | None:
    """The first child (in position order) ``resolve`` answers ``None`` for, skipping
    the kinds a host runs itself (``sleep``, ``await_event``: G-51) and what ``skip``
    excludes; ``None`` when every child resolves (G-10)."""
    for position, child in enumerate(group.children):
        if is_host_kind(child) or (skip is not None and skip(position, child)):
            continue
        if resolve(child) is None:
            return position, child
    return None


def refuse_membership(envelope: EffectEnvelope) -> None:
    """Refuse a grouped envelope on a path with no slot for membership (G-06).

    Raises:
        MembershipUnsupported: ``envelope.membership`` is set.
    """
    if envelope.membership is not None:
        raise MembershipUnsupported(
            f"envelope {envelope.replay_key!r} belongs to group "
            f"{envelope.membership.group_key!r}; this path cannot carry membership",
            group_key=envelope.membership.group_key,
            replay_key=envelope.replay_key,
            position=envelope.membership.position,
        )


def validate_deployment(controller: EffectController) -> None:
    """Fail at start-up, not at the first group: call after wiring (G-07).

    Raises:
        EffectGroupUnsupported: the controller has no resolver registered.
    """
    if not controller.supports_effect_groups():
        raise EffectGroupUnsupported(
            f"deployment check failed: {type(controller).__name__} has no GroupExecutors "
            "resolver registered, so it cannot open groups"
        )
