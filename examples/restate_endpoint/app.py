"""The deployed endpoint: this tier's services for the example's tools, plus a user
service whose handler races a tool against a deadline through a group.

Serve it with ``python app.py --bind 127.0.0.1:9080`` (see README.md).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import restate
from tools import resolver

from effecthost.combinators import DeadlineExceeded, Scope, tool, with_deadline
from effecthost.hosts.restate import HandlerController, build_services, serve, validate_services

agent = restate.Service("Agent")


@agent.handler()
async def lookup_with_deadline(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """Race the ``lookup`` tool against ``deadline`` seconds: a two-child FIRST group
    declaring CANCEL; the loser is cancelled by the close."""
    controller = HandlerController(ctx, resolver(), owner="agent")
    scope = Scope(scope_id=ctx.request().id)  # the invocation id: stable across replays
    try:
        value = await with_deadline(
            controller,
            scope,
            tool("lookup", {"q": req["q"], "seconds": req.get("seconds", 0.0)}),
            float(req.get("deadline", 1.0)),
        )
    except DeadlineExceeded:
        return {"status": "deadline"}
    return {"status": "ok", "value": value}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", default="127.0.0.1:9080")
    parser.add_argument(
        "--admin",
        action="append",
        default=None,
        help="the admin URL: the cancel guard (repeat for every node of a cluster)",
    )
    options = parser.parse_args()
    services = build_services(resolver(), admin_url=options.admin)
    validate_services(services)  # refuse to start without a needed handler (G-42)
    asyncio.run(serve(restate.app([*services, agent]), options.bind))


if __name__ == "__main__":
    main()
