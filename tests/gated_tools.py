"""Tools the unit tests control: a ``step`` child waits on the gate named by its label."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

from effecthost.contract import EffectGroup, EffectKind, LoserPolicy, ToolRegistry, WakePolicy


class Lab:
    def __init__(self) -> None:
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.finished: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.runs: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()

    async def step(self, spec: dict[str, Any]) -> Any:
        label = spec["label"]
        self.runs[label] += 1
        self.started[label].set()
        if spec.get("gate", True):
            try:
                await self.gates[label].wait()
            except asyncio.CancelledError:
                self.cancelled[label] += 1
                raise
        self.finished[label].set()
        return spec.get("result", label)

    def registry(self, *names: str) -> ToolRegistry:
        return ToolRegistry({name: self.step for name in names or ("step", "other")})


def step(label: str, *, gate: bool = True, name: str = "step", **spec: Any) -> dict[str, Any]:
    return {
        "replay_key": label,
        "kind": EffectKind.TOOL_CALL,
        "name": name,
        "input": {"label": label, "gate": gate, **spec},
    }


def group(
    key: str,
    *children: dict[str, Any],
    wake: WakePolicy = WakePolicy.ALL,
    disposition: LoserPolicy = LoserPolicy.RUN_TO_COMPLETION,
) -> EffectGroup:
    stamped = [{**c, "replay_key": f"{key}:{c['replay_key']}"} for c in children]
    return EffectGroup(key=key, wake=wake, disposition=disposition, children=stamped)
