"""A tool that writes a lot to its process's stdout and stderr, for the pipe test: the
worker resolves it by ``--resolver noisy_tools:registry --resolver-arg BYTES`` (this
directory on ``PYTHONPATH``)."""

from __future__ import annotations

import os
from typing import Any

from effecthost.contract import ToolRegistry

NOISY = "noisy"


def registry(size: str) -> ToolRegistry:
    total = int(size)
    line = b"x" * 1023 + b"\n"

    async def noisy(arg: Any) -> Any:
        """Write ``total`` bytes to fd 1 and to fd 2 (blocking writes, as the SDK's core
        does), then return ``arg``."""
        for fd in (1, 2):
            written = 0
            while written < total:
                written += os.write(fd, line)
        return arg

    return ToolRegistry({NOISY: noisy})
