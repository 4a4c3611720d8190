"""The tools of this example, shared by the worker and the caller: both register the
same resolver (the caller resolves every child before a group is recorded, G-10)."""

from __future__ import annotations

import asyncio
from typing import Any

from effecthost.contract import ToolRegistry

registry = ToolRegistry()


@registry.tool("fetch")
async def fetch(input: Any) -> Any:
    """Pretend to fetch ``input["url"]``, taking ``input["seconds"]``."""
    await asyncio.sleep(float(input.get("seconds", 0.1)))
    return {"url": input["url"], "status": 200}


@registry.tool("fail")
async def fail(input: Any) -> Any:
    raise ValueError(f"{input} failed on purpose")
