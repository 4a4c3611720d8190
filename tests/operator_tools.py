"""Two tool names backed by the conformance lab's gated step, so a test can look for tool
names where an operator looks: an endpoint or worker resolves them by
``--resolver operator_tools:resolver`` with the lab path as argument (this
directory on ``PYTHONPATH``)."""

from __future__ import annotations

import os

from effecthost.conformance import STEP, conformance_resolver
from effecthost.contract import EffectEnvelope, EffectExecutor, GroupExecutors

TOOLS = ("lookup.fast", "lookup.slow")


class _Named(GroupExecutors):
    def __init__(self, lab_path: str | os.PathLike[str]) -> None:
        self._steps = conformance_resolver(lab_path)

    def resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        if envelope.name not in TOOLS:
            return None
        return self._steps.resolve(envelope.model_copy(update={"name": STEP}))


def resolver(lab_path: str) -> GroupExecutors:
    return _Named(lab_path)
