"""A tool that reports the identity ``current_child()`` gives it (issue 25): its first run
records that it started and never returns (the test SIGKILLs the worker under it); a later
run returns the identity it sees. The worker resolves it by ``--resolver
identity_tools:registry --resolver-arg MARKS`` (this directory on ``PYTHONPATH``)."""

import asyncio
from pathlib import Path
from typing import Any

from effecthost.contract import ToolRegistry, current_child

WHO = "who"


def registry(marks: str) -> ToolRegistry:
    async def who(tag: Any) -> Any:
        child = current_child()
        started = Path(marks) / f"{tag}.started"
        if not started.exists():
            started.write_text(str(child.attempt))
            await asyncio.Event().wait()  # cut off by the SIGKILL
        return {
            "replay_key": child.replay_key,
            "group_key": child.group_key,
            "position": child.position,
            "attempt": child.attempt,
        }

    return ToolRegistry({WHO: who})
