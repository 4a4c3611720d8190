"""The conformance resolver: the children every check is made of.

Import it wherever a host under test runs children (a worker, an endpoint) and register
``conformance_resolver(lab_path)`` as that process's ``GroupExecutors``. Only the contract
and the standard library are imported, so any worker can load it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectExecutor,
    EffectKind,
    ExecutionInput,
    GroupExecutors,
    ToolError,
)

from ._lab import LabClient

STEP = "conformance.step"
"""A child that reports ``started``, waits on its gate, reports ``finished`` and returns."""

UNROUTABLE = "conformance.unroutable"
"""A tool name the conformance resolver never resolves (G-10)."""


def step_input(
    tag: str,
    *,
    gate: bool = True,
    result: Any = None,
    error: str | None = None,
    hold_cancel: bool = False,
    over_limits: bool = False,
    result_bytes: int | None = None,
) -> dict[str, Any]:
    """Input of a ``conformance.step`` child.

    ``gate``: wait for the lab gate named ``tag`` before finishing. ``error``: fail with a
    ``ToolError`` of that type. ``hold_cancel``: on cancellation, report ``cancelled`` and
    hold until gate ``{tag}/release`` opens, so a check can prove a close did not wait.
    ``over_limits``: return an integer past the signed 64-bit range (R-8), a result no
    input could carry. ``result_bytes``: return a string of that many bytes, a result
    larger than the input that asks for it.
    """
    spec = {"tag": tag, "gate": gate, "result": result, "error": error, "hold_cancel": hold_cancel}
    if over_limits:
        spec["over_limits"] = True
    if result_bytes is not None:
        spec["result_bytes"] = result_bytes
    return spec


class StepExecutor(EffectExecutor):
    def __init__(self, lab: LabClient) -> None:
        super().__init__()
        self._lab = lab
        self.executor_id = uuid.uuid4().hex

    async def run(self, call: ExecutionInput) -> Any:
        spec = call.envelope.input
        tag = str(spec["tag"])
        try:
            await self._lab.report(
                "started", tag, attempt=call.attempt, executor=self.executor_id, pid=os.getpid()
            )
            if spec.get("gate"):
                await self._lab.wait_gate(tag)
        except asyncio.CancelledError:
            await self._lab.report("cancelled", tag, pid=os.getpid())
            if spec.get("hold_cancel"):
                await self._lab.wait_gate(f"{tag}/release")
            raise
        await self._lab.report("finished", tag, pid=os.getpid())
        if spec.get("error"):
            raise ToolError(
                str(spec["error"]),
                f"step {tag} failed on purpose",
                failure_data(tag),
                STEP_ERROR_CODE,
            )
        if spec.get("over_limits"):
            return {"n": 2**63}
        if spec.get("result_bytes") is not None:
            return "r" * int(spec["result_bytes"])
        return spec.get("result")


STEP_ERROR_CODE = 422
"""The code every failing step raises: a check reads it back from the settlement."""


def failure_data(tag: str) -> Any:
    """The data a failing step raises, nested so a host that flattens, stringifies or drops
    part of it is seen."""
    return {"tag": tag, "detail": [1, {"deep": True, "none": None}], "why": "on purpose"}


class ConformanceResolver(GroupExecutors):
    """Resolves ``conformance.step`` tool calls to fresh :class:`StepExecutor` objects;
    ``None`` for :data:`UNROUTABLE`, for steps the lab denies, and for anything else."""

    def __init__(self, lab_path: str | os.PathLike[str]) -> None:
        self._lab = LabClient(lab_path)

    def resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        if envelope.kind != EffectKind.TOOL_CALL or envelope.name != STEP:
            return None
        spec = envelope.input
        if not isinstance(spec, dict) or self._lab.denied(str(spec.get("tag"))):
            return None
        return StepExecutor(self._lab)


def conformance_resolver(lab_path: str | os.PathLike[str]) -> ConformanceResolver:
    """The resolver a host under test registers wherever its children run."""
    return ConformanceResolver(lab_path)
