"""The endpoint server keeps serving one HTTP/2 connection past hypercorn's request cap.

Restate keeps one HTTP/2 connection to an endpoint and sends every invocation on it. With
hypercorn's default ``keep_alive_max_requests`` (1,000) the server sent GOAWAY after the
thousandth request and dropped the replies still owed on it: the request that crossed the
cap hung until the connection died (34–43 s), and every later ``settle`` of the group queued
behind it on the exclusive handler. G-15 (every settlement reaches the group) and G-42
(the endpoint serves its bindings) rest on the endpoint answering every request.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

from effecthost.hosts.restate._serve import endpoint_config, serve_config

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

REQUESTS = 5_200
IN_FLIGHT = 40


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Counting:
    """An ASGI app that answers every request and counts the connections it saw."""

    def __init__(self) -> None:
        self.connections: set[tuple[Any, ...]] = set()
        self.served = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": f"{message['type']}.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.connections.add(tuple(scope["client"]))
        while (await receive()).get("more_body", False):
            pass
        self.served += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_one_connection_serves_past_the_request_cap() -> None:
    """G-15, G-42: 5,200 requests on one HTTP/2 connection all get their reply, and the
    connection is never closed under them (no request waits on a dropped reply)."""
    app = _Counting()
    bind = f"127.0.0.1:{_free_port()}"
    stop = asyncio.Event()
    server = asyncio.create_task(serve_config(app, endpoint_config(bind), stop))
    try:
        async with httpx.AsyncClient(
            http1=False, http2=True, base_url=f"http://{bind}", timeout=10.0
        ) as client:
            for _ in range(100):
                try:
                    await client.get("/health")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.05)  # a bounded wait for the listener, not ordering
            gate = asyncio.Semaphore(IN_FLIGHT)

            async def one(i: int) -> int:
                async with gate:
                    answer = await client.post(f"/invoke/{i}", content=b"x")
                    return answer.status_code

            statuses = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
        assert statuses.count(200) == REQUESTS
        assert app.served == REQUESTS + 1
        assert len(app.connections) == 1, f"the server closed its connection: {app.connections}"
    finally:
        stop.set()
        await asyncio.wait_for(server, 10.0)


def test_endpoint_config_lifts_every_per_connection_cap() -> None:
    """G-15: the endpoint's server config has no request cap per connection, and keeps
    idle HTTP/2 connections open long enough that Restate does not reconnect between
    bursts of a wide group."""
    config = endpoint_config("127.0.0.1:9080")
    assert config.keep_alive_max_requests >= 2**62
    assert config.keep_alive_timeout >= 60
