"""The instrumentation itself: imported only by :func:`effecthost.telemetry.instrument`.

It wraps methods rather than asking each tier to call it, so the five tiers share one
implementation and pay nothing while it is off. Metric attributes are bounded sets (host
class, wake, disposition, kind, status, action), never a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import _internal as _global_meters
from opentelemetry.trace import Status, StatusCode

from .. import __version__
from ..contract import _controller
from ..contract._controller import EffectController, EffectExecutor, ExecutionInput, GroupDrain
from ..contract._types import EffectGroup, GroupHandle, LoserPolicy, Outcome, Settlement, WakePolicy

_global_tracers = trace

SCOPE = "effecthost"

GROUP_SPAN = "effecthost.group"
CHILD_SPAN = "effecthost.child"
AWAIT_SPAN = "effecthost.await"
DRAIN_SPAN = "effecthost.drain"
TAKEN_OVER = "effecthost.taken_over"

MAX_OPEN_SPANS = 10_000
"""Group spans held per process until their close; past it the oldest is ended (marked
``effecthost.group.abandoned``) so a caller that never closes cannot grow it unbounded."""

_in_call: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "effecthost_otel_call", default=False
)
_draining: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "effecthost_otel_drain", default=False
)
_via: contextvars.ContextVar[trace.SpanContext | None] = contextvars.ContextVar(
    "effecthost_otel_via", default=None
)
"""The span that was current when :func:`attached` switched to a carried context (a drain
pass's): a child span started under the carried context links to it."""
_later: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "effecthost_otel_rank_later", default=None
)
"""Set in a child's task by a host that reports the child's rank here (:func:`ranked`): how
long, in seconds, its span waits for it (``math.inf``: until :func:`ranked`)."""


@dataclass
class _Group:
    span: trace.Span
    context: otel_context.Context
    host: str
    wake: WakePolicy
    width: int
    deciding_rank: int | None = None
    consumed: int = 0

    @property
    def trace_id(self) -> int:
        return self.span.get_span_context().trace_id


@dataclass
class _Instruments:
    tracer: trace.Tracer
    opened: metrics.Counter
    closed: metrics.Counter
    retired: metrics.Counter
    open_groups: metrics.UpDownCounter
    settled: metrics.Counter
    settle_latency: metrics.Histogram
    rank_wait: metrics.Histogram
    drain_passes: metrics.Counter
    taken_over: metrics.Counter


_inst: _Instruments | None = None
_fixed: bool | None = None
"""Whether the providers ``install`` was given record anything; ``None`` when one of them
is the global provider, which may be set later (then asked per call)."""
_NO_OP = {"NoOpTracerProvider", "ProxyTracerProvider", "NoOpMeterProvider", "_ProxyMeterProvider"}


def _silent(provider: Any) -> bool:
    return type(provider).__name__ in _NO_OP


def _live() -> _Instruments | None:
    """The instruments, or ``None`` while no provider records anything (nothing is set
    globally, or both given are no-ops): then the wrappers only pass the call through.
    The API's globals are read directly (``get_tracer_provider`` reads the environment on
    every call) and only until one is set: once set, a global provider stays."""
    global _fixed
    inst = _inst
    if inst is None or _fixed is False:
        return None
    if _fixed is None:
        if _global_tracers._TRACER_PROVIDER is None and _global_meters._METER_PROVIDER is None:
            return None
        _fixed = True
    return inst


_groups: OrderedDict[tuple[int, str], _Group] = OrderedDict()
_by_key: dict[str, _Group] = {}
_unranked: dict[tuple[str, int], tuple[trace.Span, int]] = {}
"""Child spans of groups held here, settled and waiting for the await that serves their rank
(with the time they settled): (group key, position) -> (span, end time in ns)."""
"""The group spans held here by group key: a child a drain pass of this process starts
(outside the caller's trace) still hangs under its group's span."""
_patched: list[tuple[type, str, Any]] = []


_provider: Any = None


def tracer_provider() -> Any:
    return _provider


def install(tracer_provider: Any, meter_provider: Any) -> None:
    global _inst, _fixed, _provider
    if _inst is not None:
        return
    _provider = tracer_provider
    if tracer_provider is not None and meter_provider is not None:
        _fixed = not (_silent(tracer_provider) and _silent(meter_provider))
    else:
        _fixed = None
        trace.get_tracer_provider()  # loads one the environment names (OTEL_PYTHON_*)
        metrics.get_meter_provider()
    tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
    meter = metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
    _inst = _Instruments(
        tracer=tracer,
        opened=meter.create_counter("effecthost.groups.opened", "{group}", "groups opened"),
        closed=meter.create_counter("effecthost.groups.closed", "{group}", "groups closed"),
        retired=meter.create_counter(
            "effecthost.groups.retired", "{group}", "groups retired by their caller's close"
        ),
        open_groups=meter.create_up_down_counter(
            "effecthost.groups.open", "{group}", "groups opened and not yet closed here"
        ),
        settled=meter.create_counter(
            "effecthost.children.settled", "{child}", "children whose run ended, by status"
        ),
        settle_latency=meter.create_histogram(
            "effecthost.child.duration", "s", "a child's start to its settlement"
        ),
        rank_wait=meter.create_histogram(
            "effecthost.rank.wait", "s", "how long await_next_settlement waited for its rank"
        ),
        drain_passes=meter.create_counter("effecthost.drain.passes", "{pass}", "drain passes"),
        taken_over=meter.create_counter(
            "effecthost.children.taken_over", "{child}", "children a drain pass took over"
        ),
    )
    if _fixed is False:
        return  # both providers given are no-ops: nothing can ever be recorded
    _patch(EffectExecutor, "execute", _wrap_execute)
    for cls in _all_subclasses(EffectController) | _all_subclasses(GroupDrain):
        _patch_class(cls)
    _controller._on_subclass = _patch_class


def uninstall() -> None:
    global _inst, _fixed, _provider
    _fixed = None
    _provider = None
    _controller._on_subclass = None
    for cls, name, original in reversed(_patched):
        setattr(cls, name, original)
    _patched.clear()
    while _groups:
        _key, group = _groups.popitem(last=False)
        group.span.end()
    _by_key.clear()
    _end_unranked()
    _running.clear()
    _early.clear()
    _inst = None


def inject() -> dict[str, str]:
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextlib.contextmanager
def attached(headers: Mapping[str, str]) -> Iterator[None]:
    before = trace.get_current_span().get_span_context()
    via = _via.set(before if before.is_valid else None)
    token = otel_context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        otel_context.detach(token)
        _via.reset(via)


# -- patching ---------------------------------------------------------------------------------

_CONTROLLER_METHODS: dict[str, Callable[[Any], Any]] = {}
_DRAIN_METHODS: dict[str, Callable[[Any], Any]] = {}


def _all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    stack = [cls]
    while stack:
        sub: type
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def _patch(cls: type, name: str, wrap: Callable[[Any], Any]) -> None:
    original = cls.__dict__.get(name)
    if original is None or getattr(original, "__effecthost_otel__", False):
        return
    wrapper = wrap(original)
    wrapper.__effecthost_otel__ = True
    setattr(cls, name, wrapper)
    _patched.append((cls, name, original))


def _patch_class(cls: type) -> None:
    if issubclass(cls, EffectController):
        for name, wrap in _CONTROLLER_METHODS.items():
            _patch(cls, name, wrap)
    if issubclass(cls, GroupDrain):
        for name, wrap in _DRAIN_METHODS.items():
            _patch(cls, name, wrap)


def _instruments() -> _Instruments:
    assert _inst is not None
    return _inst


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


# -- the group: open, await, close ------------------------------------------------------------


def _wrap_open(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def open_effect_group(self: Any, group: EffectGroup, *args: Any, **kw: Any) -> Any:
        inst = _live()
        if inst is None or _in_call.get():
            return await original(self, group, *args, **kw)
        key = (id(self), group.key)
        known = _groups.get(key)
        host = type(self).__name__
        if known is None:
            span = inst.tracer.start_span(
                GROUP_SPAN,
                attributes={
                    "effecthost.host": host,
                    "effecthost.group.key": group.key,
                    "effecthost.group.wake": _value(group.wake),
                    "effecthost.group.disposition": _value(group.disposition),
                    "effecthost.group.width": group.child_count,
                },
            )
            known = _Group(
                span,
                trace.set_span_in_context(span),
                host,
                WakePolicy(group.wake),
                group.child_count,
            )
            fresh = True
        else:
            fresh = False
        token = otel_context.attach(known.context)
        busy = _in_call.set(True)
        try:
            handle = await original(self, group, *args, **kw)
        except BaseException as exc:
            if fresh:
                known.span.record_exception(exc)
                known.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                known.span.end()
            raise
        finally:
            _in_call.reset(busy)
            otel_context.detach(token)
        if fresh:
            _hold(key, known)
            attrs = {
                "effecthost.host": host,
                "effecthost.group.wake": _value(group.wake),
                "effecthost.group.disposition": _value(group.disposition),
            }
            inst.opened.add(1, attrs)
            inst.open_groups.add(1, {"effecthost.host": host})
        else:
            known.span.add_event("effecthost.reopen")
        return handle

    return open_effect_group


def _hold(key: tuple[int, str], group: _Group) -> None:
    _groups[key] = group
    _by_key[key[1]] = group
    while len(_groups) > MAX_OPEN_SPANS:
        _old, dropped = _groups.popitem(last=False)
        _release(_old, dropped)
        dropped.span.set_attribute("effecthost.group.abandoned", True)
        dropped.span.end()
        _instruments().open_groups.add(-1, {"effecthost.host": dropped.host})


def _release(key: tuple[int, str], group: _Group) -> None:
    if _by_key.get(key[1]) is group:
        del _by_key[key[1]]


def _wrap_await(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def await_next_settlement(self: Any, handle: GroupHandle, *args: Any, **kw: Any) -> Any:
        inst = _live()
        if inst is None or _in_call.get():
            return await original(self, handle, *args, **kw)
        group = _groups.get((id(self), handle.group_key))
        rank = handle.consumed + 1
        host = type(self).__name__
        started = time.perf_counter()
        busy = _in_call.set(True)
        try:
            with inst.tracer.start_as_current_span(
                AWAIT_SPAN,
                context=group.context if group is not None else None,
                attributes={
                    "effecthost.host": host,
                    "effecthost.group.key": handle.group_key,
                    "effecthost.rank": rank,
                },
            ) as span:
                settlement: Settlement = await original(self, handle, *args, **kw)
                waited = time.perf_counter() - started
                status = settlement.outcome.status
                span.set_attributes(
                    {
                        "effecthost.position": settlement.position,
                        "effecthost.replay_key": settlement.replay_key,
                        "effecthost.status": status,
                        "effecthost.wait_seconds": waited,
                    }
                )
        finally:
            _in_call.reset(busy)
        inst.rank_wait.record(waited, {"effecthost.host": host, "effecthost.status": status})
        if _unranked:
            _ranked(handle.group_key, settlement.position, settlement.rank)
        if group is not None:
            group.consumed = max(group.consumed, settlement.rank)
            if group.deciding_rank is None and _decides(group, settlement):
                group.deciding_rank = settlement.rank
                group.span.set_attributes(
                    {
                        "effecthost.group.deciding_rank": settlement.rank,
                        "effecthost.group.deciding_position": settlement.position,
                    }
                )
        return settlement

    return await_next_settlement


def _decides(group: _Group, settlement: Settlement) -> bool:
    """Whether this rank meets the group's wake policy (the combinator's answer is known)."""
    if group.wake is WakePolicy.FIRST:
        return True
    if group.wake is WakePolicy.FIRST_SUCCESS and settlement.outcome.status == "success":
        return True
    return settlement.rank == group.width


def _wrap_close(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def close_effect_group(
        self: Any,
        handle: GroupHandle,
        disposition: LoserPolicy | None = None,
        *args: Any,
        **kw: Any,
    ) -> Any:
        inst = _live()
        if inst is None or _in_call.get():
            return await original(self, handle, disposition, *args, **kw)
        key = (id(self), handle.group_key)
        group = _groups.get(key)
        token = otel_context.attach(group.context) if group is not None else None
        busy = _in_call.set(True)
        try:
            result = await original(self, handle, disposition, *args, **kw)
        except BaseException as exc:
            if group is not None:
                group.span.add_event(
                    "effecthost.close_refused", {"effecthost.error": type(exc).__name__}
                )
            raise
        finally:
            _in_call.reset(busy)
            if token is not None:
                otel_context.detach(token)
        host = type(self).__name__
        in_force = _value(disposition) if disposition is not None else None
        if group is not None and _groups.pop(key, None) is not None:
            _release(key, group)
            _end_unranked(handle.group_key)
            consumed = max(group.consumed, handle.consumed)
            retired = consumed == group.width
            attrs: dict[str, Any] = {
                "effecthost.group.consumed": consumed,
                "effecthost.group.retired_at_close": retired,
            }
            if in_force is not None:
                attrs["effecthost.group.closed_with"] = in_force
            group.span.set_attributes(attrs)
            group.span.end()
            inst.open_groups.add(-1, {"effecthost.host": host})
            if retired:
                inst.retired.add(1, {"effecthost.host": host})
        inst.closed.add(
            1, {"effecthost.host": host, "effecthost.group.closed_with": in_force or "declared"}
        )
        return result

    return close_effect_group


_CONTROLLER_METHODS.update(
    open_effect_group=_wrap_open,
    await_next_settlement=_wrap_await,
    close_effect_group=_wrap_close,
)


# -- drain passes -----------------------------------------------------------------------------


def _wrap_run_pass(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def run_pass(self: Any, *args: Any, **kw: Any) -> Any:
        inst = _live()
        if inst is None or _draining.get():
            return await original(self, *args, **kw)
        host = type(self).__name__
        draining = _draining.set(True)
        try:
            with inst.tracer.start_as_current_span(
                DRAIN_SPAN, attributes={"effecthost.host": host}
            ) as span:
                report = await original(self, *args, **kw)
                span.set_attributes(
                    {
                        "effecthost.drain.resumed": len(report.resumed),
                        "effecthost.drain.cancelled": len(report.cancelled),
                        "effecthost.drain.no_executor": len(report.no_executor),
                    }
                )
                for action, done in (("resumed", report.resumed), ("cancelled", report.cancelled)):
                    for group_key, replay_key in done:
                        span.add_event(
                            TAKEN_OVER,
                            {
                                "effecthost.group.key": group_key,
                                "effecthost.replay_key": replay_key,
                                "effecthost.action": action,
                            },
                        )
        finally:
            _draining.reset(draining)
        inst.drain_passes.add(1, {"effecthost.host": host})
        for action, done in (("resumed", report.resumed), ("cancelled", report.cancelled)):
            if done:
                inst.taken_over.add(
                    len(done), {"effecthost.host": host, "effecthost.action": action}
                )
        return report

    return run_pass


_DRAIN_METHODS["run_pass"] = _wrap_run_pass


# -- the child --------------------------------------------------------------------------------


def _wrap_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def execute(self: Any, call: ExecutionInput) -> Outcome:
        inst = _live()
        if inst is None:
            return await original(self, call)  # type: ignore[no-any-return]
        envelope = call.envelope
        membership = envelope.membership
        attrs: dict[str, Any] = {
            "effecthost.replay_key": envelope.replay_key,
            "effecthost.kind": envelope.kind,
            "effecthost.tool": envelope.name,
            "effecthost.attempt": call.attempt,
        }
        if membership is not None:
            attrs["effecthost.group.key"] = membership.group_key
            attrs["effecthost.position"] = membership.position
        taken_over = _draining.get()
        later = _later.get()
        if taken_over:
            attrs["effecthost.child.taken_over"] = True
        parent = None
        links: list[trace.Link] = []
        current = trace.get_current_span().get_span_context()
        if membership is not None and _by_key:
            group = _by_key.get(membership.group_key)
            if group is not None and current.trace_id != group.trace_id:
                parent = group.context  # started outside its caller's trace (a drain pass)
                if current.is_valid:
                    links.append(trace.Link(current))
        via = _via.get()
        if via is not None and via.trace_id != current.trace_id:
            links.append(trace.Link(via))  # under a carried context: who started it
        started = time.perf_counter()
        status = "cancelled"
        span = inst.tracer.start_span(CHILD_SPAN, context=parent, links=links, attributes=attrs)
        # the tool starts afresh: a group it opens itself gets its own spans
        inside, draining, carried = _in_call.set(False), _draining.set(False), _via.set(None)
        reporting = _later.set(None)
        slot = None
        if later is not None and membership is not None:
            slot = (membership.group_key, membership.position)
            _running[slot] = _running.get(slot, 0) + 1
        with trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            if taken_over:
                span.add_event(TAKEN_OVER)
            try:
                outcome: Outcome = await original(self, call)
                status = outcome.status
                if status == "error" and outcome.error is not None:
                    span.set_status(Status(StatusCode.ERROR, outcome.error.type))
            except asyncio.CancelledError:
                span.set_attribute("effecthost.child.cancelled_loser", True)
                raise
            finally:
                span.set_attribute("effecthost.status", status)
                kind = envelope.kind
                inst.settled.add(1, {"effecthost.kind": kind, "effecthost.status": status})
                inst.settle_latency.record(
                    time.perf_counter() - started,
                    {"effecthost.kind": kind, "effecthost.status": status},
                )
                _settled(span, membership, later)
                if slot is not None:
                    _ran(slot)
                _later.reset(reporting)
                _via.reset(carried)
                _draining.reset(draining)
                _in_call.reset(inside)
        return outcome

    return execute


def _settled(span: trace.Span, membership: Any, later: float | None = None) -> None:
    """End a child's span at its settlement, or, when a caller of this process holds its
    group open or its host reports the rank here (``later``), keep it (with that end time)
    until the caller's await serves its rank or the host names it, so the span carries the
    rank too; the group's close ends the ones never served, and a span whose host may not
    learn the rank here (``later`` finite) ends without it after that many seconds."""
    ended = time.time_ns()
    if membership is not None:
        group = _by_key.get(membership.group_key)
        if later is not None or (
            group is not None and span.get_span_context().trace_id == group.trace_id
        ):
            slot = (membership.group_key, membership.position)
            if later is not None and slot in _early:
                rank = _early.pop(slot)
                if rank is not None:
                    span.set_attribute("effecthost.rank", rank)
                span.end(end_time=ended)
                return
            earlier = _unranked.pop(slot, None)
            if earlier is not None:
                earlier[0].end(end_time=earlier[1])
            _unranked[slot] = (span, ended)
            if later is not None and later != math.inf:
                asyncio.get_running_loop().call_later(later, _expire, slot, span)
            if len(_unranked) > MAX_OPEN_SPANS:
                # a snapshot: ``ranked`` may pop from another thread (a workflow's)
                for oldest in list(_unranked)[: len(_unranked) - MAX_OPEN_SPANS]:
                    dropped = _unranked.pop(oldest, None)
                    if dropped is not None:
                        dropped[0].end(end_time=dropped[1])
            return
    span.end(end_time=ended)


_running: dict[tuple[str, int], int] = {}
"""Children of this process whose host reports their rank here (``later``), still running:
(group key, position) -> how many runs."""
_early: dict[tuple[str, int], int | None] = {}
"""Ranks named while their child still ran (a Restate loser whose settle was answered
before its cancelled tool ended): its span ends with it when the run ends."""


def _ranked(group_key: str, position: int, rank: int | None) -> None:
    entry = _unranked.pop((group_key, position), None)
    if entry is not None:
        if rank is not None:
            entry[0].set_attribute("effecthost.rank", rank)
        entry[0].end(end_time=entry[1])


def _ran(slot: tuple[str, int]) -> None:
    left = _running.pop(slot, 1) - 1
    if left > 0:
        _running[slot] = left
    else:
        _early.pop(slot, None)


def _expire(slot: tuple[str, int], span: trace.Span) -> None:
    entry = _unranked.get(slot)
    if entry is not None and entry[0] is span and _unranked.pop(slot, None) is entry:
        span.end(end_time=entry[1])


def rank_later(within: float | None = None) -> None:
    _later.set(math.inf if within is None else within)


def ranked(group_key: str, position: int, rank: int | None) -> None:
    slot = (group_key, position)
    if slot in _unranked:
        _ranked(group_key, position, rank)
    elif slot in _running:
        _early[slot] = rank


def _end_unranked(group_key: str | None = None) -> None:
    for slot in [s for s in list(_unranked) if group_key is None or s[0] == group_key]:
        entry = _unranked.pop(slot, None)
        if entry is not None:
            entry[0].end(end_time=entry[1])
