"""Traces and metrics of groups and children through OpenTelemetry (the ``otel`` extra).

Off until :func:`instrument` is called: nothing here imports OpenTelemetry before then, and
no controller, drain or executor method runs any extra code per call. :func:`instrument`
wraps, in one place for every tier, the controller methods every tier implements (open,
await, close), every drain pass and the one method every child's tool runs through
(:meth:`~effecthost.contract.EffectExecutor.execute`). Call it in every process that opens
groups or runs children (a caller, a Restate endpoint, a Temporal worker, an ``effecthost
drain``). Span and metric names are in ``docs/operators.md``.

A host whose children run in another process carries the caller's trace context with the
group (:func:`carrier`) and runs each child under it (:func:`attached`). A host that keeps
groups in a database stores it with the group (:func:`group_context`) and a drain pass in
whatever process starts a child it took over under it (:func:`taken_over`). A host that
learns a child's rank in the process that ran it says so (:func:`rank_later`,
:func:`ranked`), so the child's span carries its rank. All of them do nothing while
telemetry is off.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "attached",
    "carrier",
    "group_context",
    "instrument",
    "instrumented",
    "rank_later",
    "ranked",
    "taken_over",
    "tracer_provider",
    "uninstrument",
]

_active: Any = None
"""The running instrumentation (``effecthost.telemetry._otel``), or ``None``."""


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Switch tracing and metrics on for this process; idempotent. Without providers the
    global ones apply (``opentelemetry.trace.set_tracer_provider``): with none set, the
    API's no-op spans and instruments.

    Raises:
        MissingExtra: ``opentelemetry-api`` is not installed.
    """
    global _active
    try:
        from . import _otel
    except ImportError as exc:
        from ..hosts import MissingExtra

        raise MissingExtra("telemetry", "otel", "opentelemetry-api") from exc
    _otel.install(tracer_provider, meter_provider)
    _active = _otel


def uninstrument() -> None:
    """Switch it off again: the wrapped methods are restored; spans of groups still open
    are ended."""
    global _active
    if _active is not None:
        _active.uninstall()
    _active = None


def instrumented() -> bool:
    return _active is not None


def tracer_provider() -> Any:
    """The tracer provider :func:`instrument` was given, or ``None`` (the global one); for
    an engine's own tracing (Temporal's interceptor) to report into the same place."""
    return None if _active is None else _active.tracer_provider()


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, ``tracestate``) to store
    or send with a group or child; empty while telemetry is off."""
    if _active is None:
        return {}
    return _active.inject()  # type: ignore[no-any-return]


@contextlib.contextmanager
def attached(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Run the body under the trace context ``headers`` carry (what :func:`carrier` gave in
    the caller's process), so a child's span and its tool's spans join the caller's trace.
    A no-op while telemetry is off or when ``headers`` carry none."""
    if _active is None or not headers:
        yield
        return
    with _active.attached(headers):
        yield


def group_context() -> str | None:
    """The current trace context (at an open: the group's span) as text to store with the
    group (the W3C headers as JSON), for :func:`taken_over` in the process that later runs
    its children; ``None`` while telemetry is off or no span is current."""
    if _active is None:
        return None
    headers = _active.inject()
    return json.dumps(headers, sort_keys=True, separators=(",", ":")) if headers else None


@contextlib.contextmanager
def taken_over(stored: str | None) -> Iterator[None]:
    """Run the body (a drain pass starting a child it took over, in any process) under the
    trace context :func:`group_context` stored with the child's group: the child's span
    (and its tool's spans) join the caller's trace under its group span, linked to the span
    current before (the drain pass's). A no-op while telemetry is off, for ``None``, and
    for text that is not such a context."""
    if _active is None or not stored:
        yield
        return
    try:
        headers = json.loads(stored)
    except ValueError:
        headers = None
    if not isinstance(headers, dict):
        yield
        return
    with _active.attached({str(k): str(v) for k, v in headers.items()}):
        yield


def rank_later(within: float | None = None) -> None:
    """Called in a child's task before its tool runs, by a host that learns the child's
    rank in this process after the run (the SQL tier's finalize, a Restate child's
    ``settle`` reply): the child's span is then kept, with its settlement as its end time,
    until :func:`ranked` names the rank. A host that may learn it elsewhere (a Temporal
    worker whose group workflow runs in another worker) gives ``within``: after that many
    seconds the span ends without a rank."""
    if _active is not None:
        _active.rank_later(within)


def ranked(group_key: str, position: int, rank: int | None) -> None:
    """The rank the child at ``position`` of ``group_key`` got here (``None``: it got none
    here, e.g. its lease was lost): ends the span :func:`rank_later` kept. Safe from any
    thread (a Temporal workflow's) and a no-op when no such span is kept here."""
    if _active is not None:
        _active.ranked(group_key, position, rank)
