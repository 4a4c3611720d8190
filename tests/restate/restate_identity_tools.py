"""A tool that reports the identity ``current_child()`` gives it (issue 25): its first run
records that it started and never returns (the test SIGKILLs the endpoint under it); a
later run returns the identity it sees. The endpoint resolves it by ``--resolver
restate_identity_tools:registry`` (this directory on ``PYTHONPATH``)."""

import asyncio
from pathlib import Path
from typing import Any

from effecthost.contract import ToolRegistry, current_child

WHO = "who"


async def _who(spec: Any) -> Any:
    child = current_child()
    identity = {
        "replay_key": child.replay_key,
        "group_key": child.group_key,
        "position": child.position,
        "attempt": child.attempt,
    }
    started = Path(spec["dir"]) / f"{spec['tag']}.started"
    if not started.exists():
        started.write_text(str(child.attempt))
        await asyncio.Event().wait()  # cut off by the SIGKILL
    return identity


registry = ToolRegistry({WHO: _who})
