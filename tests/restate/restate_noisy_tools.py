"""A tool that prints a lot to its process's stdout and stderr, so a test can show that
nothing the endpoint writes can block it: the endpoint resolves it by ``--resolver
restate_noisy_tools:registry`` (this directory on ``PYTHONPATH``)."""

import sys
from typing import Any

from effecthost.contract import ToolRegistry

NOISY = "noisy"


async def _noisy(spec: Any) -> Any:
    """Write ``bytes`` bytes to stdout and as many to stderr, in lines, flushed."""
    line = "n" * 1023 + "\n"
    for _ in range(int(spec["bytes"]) // len(line)):
        sys.stdout.write(line)
        sys.stderr.write(line)
    sys.stdout.flush()
    sys.stderr.flush()
    return spec["tag"]


registry = ToolRegistry({NOISY: _noisy})
