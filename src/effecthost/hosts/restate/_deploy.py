"""Deployment: register an endpoint with a Restate server and validate it (G-42)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from effecthost.contract import EffectGroupUnsupported, EngineUnavailable
from effecthost.hosts import require

from ._nodes import Nodes, _Unreachable, url_list
from ._wire import REQUIRED_HANDLERS


def missing_handlers(services: list[Any]) -> list[str]:
    """``Service/handler`` names the contract needs that ``services`` do not bind."""
    bound = {(s.name, h) for s in services for h in getattr(s, "handlers", {})}
    return [
        f"{service}/{handler}"
        for service, handlers in REQUIRED_HANDLERS.items()
        for handler in handlers
        if (service, handler) not in bound
    ]


def validate_services(services: list[Any]) -> None:
    """Refuse, at start-up, an endpoint lacking a handler the contract needs (G-42).

    Raises:
        EffectGroupUnsupported: names every missing ``Service/handler``.
    """
    missing = missing_handlers(services)
    if missing:
        raise EffectGroupUnsupported(
            "deployment check failed: the endpoint does not bind " + ", ".join(missing)
        )


async def register_deployment(
    admin_url: str | Sequence[str],
    endpoint_uri: str,
    *,
    force: bool = True,
    leaders_within: float | None = None,
    outage_bound: float = 30.0,
) -> Any:
    """Register (``force``: re-discover) ``endpoint_uri`` with the admin API, then check
    that the server now routes every handler the contract needs.

    ``admin_url`` is one URL or the admin URLs of a cluster's nodes: each request fails
    over to the next node on a connection error or a 5xx and is retried for up to
    ``outage_bound`` seconds. With ``leaders_within`` it first waits up to that many
    seconds for every partition to be served: a cluster's ``/health`` answers long before
    its partitions have leaders, and invocations made before then are re-run.

    Raises:
        EffectGroupUnsupported: the admin API refused the registration, or the
            registered deployment lacks a needed handler.
        EngineUnavailable: no admin API answered in time, or the partitions got no
            leaders within ``leaders_within`` seconds.
    """
    (httpx,) = require("restate", "restate", "httpx")
    urls = url_list(admin_url, "admin API")
    async with httpx.AsyncClient(timeout=30.0) as client:
        nodes = Nodes(urls, client, (httpx.TransportError,))
        if leaders_within is not None:
            await wait_for_leaders(nodes, leaders_within)
        response = await _admin(
            nodes,
            "POST",
            "/deployments",
            "register_deployment",
            outage_bound,
            json={"uri": endpoint_uri, "force": force},
        )
        if response.status_code >= 300:
            raise EffectGroupUnsupported(
                f"the Restate admin API refused to register {endpoint_uri}: "
                f"HTTP {response.status_code} {response.text[:300]}"
            )
        registered = response.json()
        await _validate(nodes, outage_bound)
    return registered


async def wait_for_leaders(nodes: Nodes, within: float) -> None:
    """Wait until the admin SQL view answers over every partition, which it does only
    once each partition is served by a leader (``/cluster-health`` of server 1.7 lists
    the metadata members, not the partitions).

    Raises:
        EngineUnavailable: not within ``within`` seconds.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    why = "no answer"
    while True:
        try:
            response = await nodes.request(
                "POST",
                "/query",
                bound=max(within - (loop.time() - start), 0.0),
                json={"query": "SELECT count(*) AS n FROM sys_invocation"},
                headers={"Accept": "application/json"},
            )
        except _Unreachable as exc:
            why = str(exc)
        else:
            if response.status_code == 200:
                return
            why = f"HTTP {response.status_code} {response.text[:200]}"
        elapsed = loop.time() - start
        if elapsed >= within:
            raise EngineUnavailable(
                f"the Restate partitions got no leaders in {elapsed:.1f}s ({why})",
                operation="register_deployment",
                tried_for=elapsed,
            )
        await asyncio.sleep(0.2)  # polling the server's start-up, not ordering


async def _admin(
    nodes: Nodes, method: str, path: str, operation: str, bound: float, **kwargs: Any
) -> Any:
    try:
        return await nodes.request(method, path, bound=bound, **kwargs)
    except _Unreachable as exc:
        raise EngineUnavailable(
            f"no Restate admin API ({', '.join(nodes.urls)}) answered {operation} in "
            f"{exc.tried_for:.1f}s ({exc})",
            operation=operation,
            tried_for=exc.tried_for,
        ) from None


async def _validate(nodes: Nodes, bound: float) -> None:
    missing = []
    for service, handlers in REQUIRED_HANDLERS.items():
        for handler in handlers:
            path = f"/services/{service}/handlers/{handler}"
            answer = await _admin(nodes, "GET", path, "validate_registered", bound)
            if answer.status_code == 404:
                missing.append(f"{service}/{handler}")
            elif answer.status_code >= 300:
                raise EngineUnavailable(
                    f"the Restate admin API refused {path}: HTTP {answer.status_code}",
                    operation="validate_registered",
                )
    if missing:
        raise EffectGroupUnsupported(
            "deployment check failed: the server binds no " + ", ".join(missing)
        )


async def validate_registered(
    admin_url: str | Sequence[str], client: Any = None, *, outage_bound: float = 30.0
) -> None:
    """Check through the admin API that every needed handler is bound (G-42).

    Raises:
        EffectGroupUnsupported: names every missing ``Service/handler``.
        EngineUnavailable: no admin API answered in time.
    """
    (httpx,) = require("restate", "restate", "httpx")
    own = client is None
    http = client or httpx.AsyncClient(timeout=30.0)
    try:
        nodes = Nodes(url_list(admin_url, "admin API"), http, (httpx.TransportError,))
        await _validate(nodes, outage_bound)
    finally:
        if own:
            await http.aclose()
