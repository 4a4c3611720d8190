"""An engine's routing, modelled in memory so the catalog can break G-14.

On the engine tiers a child may be addressed to a handler of its own (a Restate service
handler, a Temporal activity); the engine, not the host, answers a call to a target no
deployment binds, with a terminal failure of code 404. :class:`RoutingMemoryHost` is the
reference host over such an engine: :meth:`~RoutingMemoryHost.open_routed` opens a group
with some children addressed to targets, and a routed child settles with what the engine
answers, an unbound target's 404 included, once. The ``routed`` harness of the catalog
runs it, declaring ``unroutable_children``, so the suite's G-14 check runs; the G-14
mutants subclass it.
"""

from __future__ import annotations

from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    ExecutionInput,
    GroupHandle,
    ToolError,
)
from effecthost.hosts.memory import MemoryEffectHost

UNBOUND_CODE = 404
UNBOUND_TARGET = "Nowhere/handler"
"""A target no deployment of the modelled engine binds."""


class Unbound(Exception):
    """The engine's answer to a call whose target no deployment binds: terminal, and
    every retry gets it again until a deployment binds the target."""

    code = UNBOUND_CODE


class Engine:
    """Deployments bind targets; a call to a bound target returns the call's input."""

    def __init__(self, bound: frozenset[str] = frozenset()) -> None:
        self.bound = bound
        self.calls = 0

    async def call(self, target: str, envelope: EffectEnvelope) -> Any:
        self.calls += 1
        if target not in self.bound:
            raise Unbound(f"no deployment binds {target}")
        return envelope.input


class RoutingMemoryHost(MemoryEffectHost):
    """The reference host with some children routed to engine targets (G-14)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = Engine()
        self._routes: dict[tuple[str, int], str] = {}

    async def open_routed(self, group: EffectGroup, targets: dict[int, str]) -> GroupHandle:
        """Open ``group`` with the children at the positions of ``targets`` addressed to
        those targets instead of the resolver."""
        self._routes.update(((group.key, position), t) for position, t in targets.items())
        return await self.open_effect_group(group)

    def _resolve(self, envelope: EffectEnvelope) -> EffectExecutor | None:
        membership = envelope.membership
        if membership is not None:
            target = self._routes.get((membership.group_key, membership.position))
            if target is not None:
                return _Routed(self, target)
        return super()._resolve(envelope)

    async def _call(self, target: str, envelope: EffectEnvelope) -> Any:
        """*hook*: one call of a routed child; the engine's 404 is the child's terminal
        failure, with its code, and is not retried."""
        try:
            return await self.engine.call(target, envelope)
        except Unbound as exc:
            raise ToolError("Unbound", str(exc), code=exc.code) from None


class _Routed(EffectExecutor):
    def __init__(self, host: RoutingMemoryHost, target: str) -> None:
        super().__init__()
        self._host = host
        self._target = target

    async def run(self, call: ExecutionInput) -> Any:
        return await self._host._call(self._target, call.envelope)
