"""Traces and metrics of groups and children through OpenTelemetry (the ``otel`` extra).

Off until :func:`instrument` is called: nothing here imports OpenTelemetry before then, and
no controller, drain or executor method runs any extra code per call. :func:`instrument`
wraps, in one place for every tier, the controller methods every tier implements (open,
await, close), every drain pass and the one method every child's tool runs through
(:meth:`~effecthost.contract.EffectExecutor.execute`). Call it in every process that opens
groups or runs children (a caller, a Restate endpoint, a Temporal worker, an ``effecthost
drain``). Span and metric names are in ``docs/operators.md``.

A host whose children run in another process carries the caller's trace context with the
group (:func:`carrier`) and runs each child under it (:func:`attached`); both do nothing
while telemetry is off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "attached",
    "carrier",
    "instrument",
    "instrumented",
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
