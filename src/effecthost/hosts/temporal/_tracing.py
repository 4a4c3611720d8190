"""Temporal's own OpenTelemetry interceptor, added when effecthost's telemetry is on, so a
group's trace context crosses to the worker's children through Temporal's headers."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client

from ... import telemetry


def traced_client(client: Client) -> Client:
    """``client`` (same connection, namespace and converter) with
    ``temporalio.contrib.opentelemetry.TracingInterceptor`` when telemetry is instrumented
    and the client has none; ``client`` itself otherwise. A worker built on it inherits the
    interceptor: the child activities then run under the caller's trace context."""
    if not telemetry.instrumented():
        return client
    from temporalio.contrib.opentelemetry import TracingInterceptor

    config: Any = client.config()
    interceptors = list(config.get("interceptors") or ())
    if any(isinstance(i, TracingInterceptor) for i in interceptors):
        return client
    provider = telemetry.tracer_provider()
    tracer = provider.get_tracer("temporalio") if provider is not None else None
    config["interceptors"] = [*interceptors, TracingInterceptor(tracer)]
    return Client(**config)
