"""Deployment: register an endpoint with a Restate server and validate it (G-42)."""

from __future__ import annotations

from typing import Any

from effecthost.contract import EffectGroupUnsupported
from effecthost.hosts import require

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


async def register_deployment(admin_url: str, endpoint_uri: str, *, force: bool = True) -> Any:
    """Register (``force``: re-discover) ``endpoint_uri`` with the admin API, then check
    that the server now routes every handler the contract needs.

    Raises:
        EffectGroupUnsupported: the registered deployment lacks a needed handler.
        httpx.HTTPStatusError: the admin API refused the registration.
    """
    (httpx,) = require("restate", "restate", "httpx")
    admin = admin_url.rstrip("/")
    async with httpx.AsyncClient(timeout=30.0) as client:
        response = await client.post(
            f"{admin}/deployments", json={"uri": endpoint_uri, "force": force}
        )
        response.raise_for_status()
        registered = response.json()
        await validate_registered(admin, client)
    return registered


async def validate_registered(admin_url: str, client: Any = None) -> None:
    """Check through the admin API that every needed handler is bound (G-42).

    Raises:
        EffectGroupUnsupported: names every missing ``Service/handler``.
    """
    (httpx,) = require("restate", "restate", "httpx")
    own = client is None
    http = client or httpx.AsyncClient(timeout=30.0)
    try:
        missing = []
        for service, handlers in REQUIRED_HANDLERS.items():
            for handler in handlers:
                answer = await http.get(f"{admin_url}/services/{service}/handlers/{handler}")
                if answer.status_code == 404:
                    missing.append(f"{service}/{handler}")
                else:
                    answer.raise_for_status()
    finally:
        if own:
            await http.aclose()
    if missing:
        raise EffectGroupUnsupported(
            "deployment check failed: the server binds no " + ", ".join(missing)
        )
