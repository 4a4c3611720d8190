"""A tool whose work a stopping process cannot cut short, for shutdown tests: it waits
in a worker thread, which cancelling the tool does not stop (as a blocking client call
would). The worker or endpoint resolves it by ``--resolver stubborn_tools:registry
--resolver-arg LAB_DIR`` (this directory on ``PYTHONPATH``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from effecthost.conformance import LabClient
from effecthost.contract import ToolRegistry

STUBBORN = "stubborn"


def registry(lab_path: str) -> ToolRegistry:
    lab = LabClient(lab_path)

    def hold(tag: str) -> None:
        asyncio.run(lab.wait_gate(tag))

    async def stubborn(spec: Any) -> Any:
        """Report ``started``; wait for gate ``tag`` in a thread; report ``finished``. A
        cancel is reported (``cancelled``) and leaves the thread waiting."""
        tag = str(spec["tag"])
        await lab.report("started", tag, pid=os.getpid())
        try:
            await asyncio.to_thread(hold, tag)
        except asyncio.CancelledError:
            await lab.report("cancelled", tag, pid=os.getpid())
            raise
        await lab.report("finished", tag, pid=os.getpid())
        return spec.get("result")

    return ToolRegistry({STUBBORN: stubborn})
