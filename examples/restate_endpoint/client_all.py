"""An external client: ``all`` over three tool calls through ingress, then the deadline
race handler of the endpoint called like any Restate handler."""

from __future__ import annotations

import argparse
import asyncio
import uuid

import httpx
from tools import resolver

from effecthost.combinators import Scope, all_, tool
from effecthost.hosts.restate import RestateController


async def run(ingress: str, admin: str) -> None:
    controller = RestateController(ingress, admin, resolver(), owner="example-client")
    try:
        scope = Scope(scope_id=f"client-{uuid.uuid4().hex[:8]}")
        calls = [
            tool("lookup", {"q": q, "seconds": s})
            for q, s in (("a", 0.3), ("bb", 0.1), ("ccc", 0.2))
        ]
        print("all:", await all_(controller, scope, calls))
        print("open groups:", await controller.open_group_keys())
    finally:
        await controller.aclose()
    async with httpx.AsyncClient(timeout=30.0) as client:
        for seconds in (0.1, 5.0):
            answer = await client.post(
                f"{ingress}/Agent/lookup_with_deadline",
                json={"q": "deadline", "seconds": seconds, "deadline": 1.0},
            )
            print(f"race(lookup {seconds}s, deadline 1s):", answer.json())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ingress", default="http://127.0.0.1:8080")
    parser.add_argument("--admin", default="http://127.0.0.1:9070")
    options = parser.parse_args()
    asyncio.run(run(options.ingress, options.admin))


if __name__ == "__main__":
    main()
