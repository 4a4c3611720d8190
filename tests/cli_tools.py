"""Tools a CLI subprocess in the tests resolves by ``--resolver cli_tools:registry``."""

from typing import Any

from effecthost.contract import ToolRegistry


async def _echo(value: Any) -> Any:
    return value


registry = ToolRegistry({"echo": _echo, "hold": _echo})
