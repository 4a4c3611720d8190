"""The fixture stack the Restate tests share: a lab, a restate-server with one endpoint
process and a controller, torn down in the reverse order; plus the envelope and polling
helpers the tests build groups and read engine facts with."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from effecthost.conformance import Lab, conformance_resolver, step_input
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupExecutors,
    LoserPolicy,
    WakePolicy,
)
from effecthost.hosts.restate import RestateController
from effecthost.hosts.restate.testing import LocalRestate
from effecthost.payloads import PayloadPolicy

T = TypeVar("T")
S = TypeVar("S", bound="Stack")
RESOLVER = "effecthost.conformance:conformance_resolver"


@dataclass
class Stack:
    lab: Lab
    local: LocalRestate
    controller: RestateController
    resolver: GroupExecutors | None = None
    payloads: PayloadPolicy | None = None
    owner: str = "tests"

    def connect(self) -> RestateController:
        """A new controller on the same server and endpoint (it becomes ``controller``)."""
        self.controller = self.local.controller(
            self.resolver, owner=self.owner, payloads=self.payloads
        )
        return self.controller

    async def reconnect(self) -> RestateController:
        """Close the controller and connect a new one: a new incarnation of the caller."""
        await self.controller.aclose()
        return self.connect()

    async def crash_endpoint(self) -> RestateController:
        """SIGKILL the endpoint, start the server and the endpoint again; a new caller."""
        self.local.kill_endpoint()
        await self.local.restart(server=True)
        return await self.reconnect()

    async def crash_server(self) -> RestateController:
        """SIGKILL the restate-server, start it again on its data; a fresh controller."""
        await self.controller.aclose()
        await self.local.restart_server()
        return self.connect()


@contextlib.asynccontextmanager
async def running_stack(
    tmp_path: Path,
    *,
    resolver: str = RESOLVER,
    endpoint_args: list[str] | None = None,
    payloads: PayloadPolicy | None = None,
    owner: str = "tests",
    executors: GroupExecutors | None = None,
    before_start: Callable[[LocalRestate], None] | None = None,
    stack: type[S] = Stack,  # type: ignore[assignment]
) -> AsyncIterator[S]:
    """A lab, a server and an endpoint serving ``resolver`` (with the lab's path as its
    argument), and a controller resolving through ``executors`` (the conformance
    resolver on the lab by default), as a ``stack`` (a subclass adds a file's helpers)."""
    lab = Lab(tmp_path / "lab")
    await lab.start()
    local = LocalRestate(
        tmp_path / "restate", resolver, [str(lab.path)], endpoint_args=endpoint_args
    )
    if before_start is not None:
        before_start(local)
    try:
        await local.start()
        built = stack(
            lab,
            local,
            local.controller(
                executors or conformance_resolver(lab.path), owner=owner, payloads=payloads
            ),
            executors or conformance_resolver(lab.path),
            payloads,
            owner,
        )
        try:
            yield built
        finally:
            await built.controller.aclose()
    finally:
        lab.open_all("")
        await local.stop()
        await lab.stop()


def step(tag: str, **options: Any) -> EffectEnvelope:
    """A ``conformance.step`` child with replay key ``tag``."""
    return EffectEnvelope(
        replay_key=tag,
        kind=EffectKind.TOOL_CALL,
        name="conformance.step",
        input=step_input(tag, **options),
    )


def numbered_group(key: str, prefix: str, n: int) -> tuple[list[str], EffectGroup]:
    """An ``all`` group of ``n`` gated steps tagged ``{prefix}{i}``, child ``i`` returning
    ``{"i": i}``; and the tags."""
    tags = [f"{prefix}{i}" for i in range(n)]
    children = [step(tag, result={"i": i}) for i, tag in enumerate(tags)]
    return tags, EffectGroup(
        key=key, wake=WakePolicy.ALL, disposition=LoserPolicy.RUN_TO_COMPLETION, children=children
    )


async def eventually(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    what: str,
    timeout: float = 20.0,
) -> T:
    """Re-read an engine fact until ``accept`` holds (a retirement or a re-run has no
    event to wait on; nothing is ordered by this)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {value!r}")
        await asyncio.sleep(0.05)
