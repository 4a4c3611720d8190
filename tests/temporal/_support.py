"""Shared helpers of the Temporal tests: a lab, a dev server and a worker process."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from effecthost.conformance import STEP, FactoryEnv, step_input
from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
)
from effecthost.hosts.temporal import EffectGroupWorkflow, TemporalEffectHost, workflow_runner
from effecthost.hosts.temporal.testing import (
    TemporalHostUnderTest,
    factory,
    temporal_cli,
)


def require_cli() -> None:
    """Fail (never skip) when the dev server binary is missing: the test command installs it."""
    temporal_cli()


@contextlib.asynccontextmanager
async def running_host(
    root: Path,
    *,
    restart_server: bool = False,
    make: Callable[..., Awaitable[TemporalHostUnderTest]] = factory,
) -> AsyncIterator[tuple[TemporalHostUnderTest, Lab]]:
    """A dev server and a worker process (``make``: the conformance factory, or the
    sealed one), with a lab its children talk to."""
    require_cli()
    lab = Lab(root / "lab")
    await lab.start()
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    host = await make(FactoryEnv(lab_path=lab.path, work_dir=work), restart_server=restart_server)
    try:
        yield host, lab
    finally:
        lab.open_all("")
        await host.aclose()
        await lab.stop()
        shutil.rmtree(work, ignore_errors=True)


async def temporal_controller(host: TemporalHostUnderTest) -> TemporalEffectHost:
    """The host's controller, typed as the Temporal one."""
    ctl = await host.controller()
    assert isinstance(ctl, TemporalEffectHost)
    return ctl


Hosting = Callable[[Path], AbstractAsyncContextManager[tuple[Any, Lab]]]


def on_host(
    hosting: Hosting = running_host,
) -> Callable[[Callable[[Any, Lab], Awaitable[None]]], Callable[[Path], None]]:
    """Makes ``async def test_x(host, lab)`` a test of ``tmp_path`` that runs its body on
    ``hosting`` (a dev server and a worker, by default) in an event loop of its own, as
    every Temporal test here does (``asyncio.run``)."""

    def wrap(body: Callable[[Any, Lab], Awaitable[None]]) -> Callable[[Path], None]:
        def test(tmp_path: Path) -> None:
            async def run() -> None:
                async with hosting(tmp_path) as (host, lab):
                    await body(host, lab)

            asyncio.run(run())

        # pytest collects the test by its name; no ``__wrapped__``, so that pytest reads
        # the signature ``(tmp_path)`` and not the body's.
        test.__name__ = test.__qualname__ = body.__name__
        test.__doc__ = body.__doc__
        return test

    return wrap


def step(
    tag: str, *, gate: bool = True, result: object = None, hold_cancel: bool = False
) -> EffectEnvelope:
    return EffectEnvelope(
        replay_key=tag,
        kind=EffectKind.TOOL_CALL,
        name=STEP,
        input=step_input(tag, gate=gate, result=result, hold_cancel=hold_cancel),
    )


class _Capture(Interceptor):
    """Keeps what ``run`` returns on replay: the ranks the current code derives."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        results = self.results

        class _Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                result = await super().execute_workflow(input)
                results.append(result)
                return result

        return _Inbound


async def replays_clean(history: Any) -> None:
    """The group's history replays in the sandbox without a failure."""
    replayed = await Replayer(
        workflows=[EffectGroupWorkflow], workflow_runner=workflow_runner()
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def rederived(history: Any) -> Any:
    """What the current code's run derives from the history (after a clean replay)."""
    await replays_clean(history)
    capture = _Capture()
    await Replayer(workflows=[EffectGroupWorkflow], interceptors=[capture]).replay_workflow(history)
    return capture.results[0]
