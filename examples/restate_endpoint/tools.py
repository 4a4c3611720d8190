"""The example's tools and resolver: the same resolver is registered in the endpoint
process and in every caller (a first open resolves every child locally, G-10)."""

from __future__ import annotations

import asyncio
from typing import Any

from effecthost.contract import ToolRegistry

tools = ToolRegistry()


@tools.tool("lookup")
async def lookup(query: Any) -> Any:
    """A tool that takes as long as it is told to (``{"q": ..., "seconds": ...}``)."""
    await asyncio.sleep(float(query.get("seconds", 0.0)))
    return {"q": query.get("q"), "answer": len(str(query.get("q")))}


def resolver() -> ToolRegistry:
    return tools
