"""A deployment-process builder whose process and tools write a lot to stdout and stderr:
a parent that reads such a child's pipe once and never again blocks it after ~64 KiB."""

from __future__ import annotations

import sys
from typing import Any

from effecthost.conformance import Deployment
from effecthost.contract import EffectController, ToolRegistry
from effecthost.hosts.memory import MemoryEffectHost

NOISE = 1536 * 1024
"""Bytes written to each stream, at build time and again by each tool call."""


def shout(size: int = NOISE) -> None:
    line = "x" * 1023 + "\n"
    for stream in (sys.stdout, sys.stderr):
        for _ in range(size // len(line)):
            stream.write(line)
        stream.flush()


async def loud(value: Any) -> Any:
    shout()
    return value


def build(deployment: Deployment) -> EffectController:
    shout()
    if deployment.resolver is None:
        return MemoryEffectHost()
    return MemoryEffectHost(ToolRegistry({"loud": loud}))
