"""A host under test in a deployment process of its own, so that ``restart()`` is real.

A host whose children run in its own process cannot restart honestly inside the
suite's process: a child task of the dead incarnation would still be running, and a
restart check could pass on it. :class:`ProcessHostUnderTest` runs the hosts a builder
makes (``main`` of this module, run by ``python -c``), drives them over a unix
socket, and on ``restart()`` SIGKILLs that process and marks its pid killed in the lab,
so an event from the dead incarnation fails the check it arrives in.

The builder is a ``"module:function"`` called in the deployment process with a
:class:`Deployment`; it returns the controller (a ``WiredController`` subclass, say) for
``deployment.resolver`` — the conformance resolver, or ``None`` for the unwired host. A
controller with an ``awaiting(group_key, rank)`` method answers the waiter probe; one
with ``inject_faults(operation, count)`` (returning its bound) the fault hook; one
with ``aclose()`` is closed when the process is asked to stop (never on a restart); one
with an ``owner`` attribute (its incarnation's id, R-1) is listed in
:attr:`ProcessHostUnderTest.owners` until the next restart.

One connection per call: a JSON request line, a JSON reply line. Closing the connection
cancels the call in the deployment process (an await cancelled by its caller, G-19).
Typed errors travel as their class name and ids and are raised again on this side.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from effecthost import contract
from effecthost.contract import (
    DrainReport,
    EffectController,
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectHostError,
    GroupDrain,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
)

from ._host import FactoryEnv, FaultedStep, HostCapabilities, HostUnderTest
from ._lab import LabClient, exchange, mark_killed
from ._tools import conformance_resolver


@dataclass(frozen=True)
class Deployment:
    """What a builder gets in the deployment process.

    Attributes:
        name: ``"wired"`` or ``"unwired"``.
        resolver: register this (``None`` for the unwired host, G-07).
        work_dir: the run's private directory: put the host's durable state here.
        config: the ``config`` given to :class:`ProcessHostUnderTest`, as JSON.
    """

    name: str
    resolver: contract.GroupExecutors | None
    work_dir: Path
    config: Mapping[str, Any] = field(default_factory=dict)


class DeploymentGone(RuntimeError):
    """The deployment process is not answering (killed, or crashed)."""


class RemoteError(RuntimeError):
    """The deployment process failed a call with an untyped error (a host bug)."""


def _error_to_wire(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, EffectHostError):
        wire = {"type": type(exc).__name__, "message": str(exc.args[0]), "ids": exc.ids()}
        if isinstance(exc, contract.EngineUnavailable):  # which call gave up, and after how long
            wire["outage"] = {"operation": exc.operation, "tried_for": exc.tried_for}
        return wire
    return {"type": "RemoteError", "message": f"{type(exc).__name__}: {exc}", "ids": {}}


def _error_from_wire(wire: Mapping[str, Any]) -> Exception:
    cls = getattr(contract, str(wire["type"]), None)
    if not (isinstance(cls, type) and issubclass(cls, EffectHostError)):
        return RemoteError(str(wire["message"]))
    error: EffectHostError = cls.__new__(cls)
    Exception.__init__(error, wire["message"])
    ids = dict(wire["ids"])
    for name in ("group_key", "replay_key", "position", "rank"):
        setattr(error, name, ids.get(name))
    for name, value in dict(wire.get("outage") or {}).items():
        setattr(error, name, value)
    return error


async def _call(socket_path: str, op: str, host: str, **args: Any) -> Any:
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=2**26)
    except (FileNotFoundError, ConnectionError) as exc:
        raise DeploymentGone(f"deployment process at {socket_path}: {exc}") from None
    line = await exchange(reader, writer, {"op": op, "host": host, "args": args})
    if not line:
        raise DeploymentGone(f"deployment process at {socket_path} hung up during {op}")
    reply = json.loads(line)
    if "error" in reply:
        raise _error_from_wire(reply["error"])
    return reply["ok"]


class _RemoteDrain(GroupDrain):
    def __init__(self, controller: RemoteController) -> None:
        self._controller = controller

    async def run_pass(self) -> DrainReport:
        wire = await self._controller._call("drain_pass")
        missing = [_error_from_wire(e) for e in wire["no_executor"]]
        return DrainReport(
            resumed=tuple((g, r) for g, r in wire["resumed"]),
            cancelled=tuple((g, r) for g, r in wire["cancelled"]),
            no_executor=tuple(e for e in missing if isinstance(e, contract.NoExecutor)),
        )


class RemoteController(EffectController):
    """A controller whose host lives in the deployment process. ``execute_effect``
    resolves its executor there (one given here cannot cross the process boundary)."""

    def __init__(self, socket_path: str, host: str, *, wired: bool) -> None:
        self.socket_path = socket_path
        self.host = host
        self.wired = wired

    async def _call(self, op: str, **args: Any) -> Any:
        return await _call(self.socket_path, op, self.host, **args)

    def supports_concurrent_effects(self) -> bool:
        return True

    def supports_effect_groups(self) -> bool:
        return self.wired

    async def execute_effect(self, envelope: EffectEnvelope, executor: EffectExecutor) -> Outcome:
        wire = await self._call("execute_effect", envelope=envelope.model_dump(mode="json"))
        return Outcome.model_validate(wire)

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        wire = await self._call("open", group=group.model_dump(mode="json"))
        return GroupHandle.model_validate(wire)

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        wire = await self._call("await", handle=handle.model_dump(mode="json"))
        settlement = Settlement.model_validate(wire["settlement"])
        handle.consumed = int(wire["consumed"])
        return settlement

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        # Anything else goes as it is: the host coerces a string and refuses what is no
        # value itself, typed (G-26).
        value = disposition.value if isinstance(disposition, LoserPolicy) else disposition
        await self._call("close", handle=handle.model_dump(mode="json"), disposition=value)

    async def open_group_keys(self) -> list[str]:
        return list(await self._call("open_group_keys"))

    async def settlement_order(self, group_key: str) -> list[int]:
        return list(await self._call("settlement_order", group_key=group_key))

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        reached = await self._call("deliver_event", group_key=group_key, name=name, payload=payload)
        return int(reached)

    def drain(self) -> GroupDrain:
        return _RemoteDrain(self)


class ProcessHostUnderTest(HostUnderTest):
    """Hosts made by ``builder`` (``"module:function"``), run in a deployment process.

    ``restart()`` SIGKILLs that process, so no child of the dead incarnation can finish,
    and marks its pid killed in the lab; the next controller starts a new process that
    rebuilds the hosts from their durable state. Declare ``restart`` in ``capabilities``
    only if the builder's host keeps its state somewhere that outlives its process
    (under ``deployment.work_dir``). Its output goes to ``deployment.log`` in the work dir.
    ``sys_path`` entries are put first on the deployment process's ``sys.path`` (this
    process's path follows). A subclass whose restart must also wait for something (a
    lease to expire) overrides :meth:`restart` and awaits ``super().restart()`` first.
    """

    def __init__(
        self,
        env: FactoryEnv,
        builder: str,
        *,
        capabilities: HostCapabilities,
        timeout: float = 10.0,
        config: Mapping[str, Any] | None = None,
        sys_path: Sequence[str] = (),
    ) -> None:
        self.capabilities = capabilities
        self.timeout = timeout
        self._env = env
        self._dir = Path(tempfile.mkdtemp(prefix="deployment-", dir=env.work_dir))
        self._config: dict[str, Any] = {
            "builder": builder,
            "config": dict(config or {}),
            "lab": str(env.lab_path),
            "work_dir": str(env.work_dir),
            "sys_path": [os.path.abspath(p) for p in [*sys_path, *sys.path] if p],
            "socket": str(self._dir / "host.sock"),
            "ready": str(self._dir / "ready"),
        }
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._controllers: dict[str, RemoteController] = {}
        self._owners: list[str] = []

    @property
    def owners(self) -> list[str]:
        """The incarnation ids (a host's ``owner``) the deployment process started since
        the last restart: those a restart leaves without a live process."""
        return list(self._owners)

    @property
    def pid(self) -> int | None:
        """The deployment process running every child now (``None`` before the first)."""
        return None if self._proc is None else self._proc.pid

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _launch(self) -> subprocess.Popen[bytes]:
        Path(self._config["ready"]).unlink(missing_ok=True)
        config = self._dir / "config.json"
        config.write_text(json.dumps(self._config))
        if self._log is None:
            self._log = open(self._dir / "deployment.log", "ab")
        return subprocess.Popen(
            # not ``-m``: the package imports this module first, and runpy would warn
            [sys.executable, "-c", _LAUNCH, str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def _ready(self) -> bool:
        return Path(self._config["ready"]).exists()

    async def _deployment(self) -> str:
        socket_path = str(self._config["socket"])
        if self._alive():
            return socket_path
        self._proc = proc = self._launch()
        deadline = time.monotonic() + 60
        while not self._ready():  # start-up only, never an ordering device
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the deployment process did not start; see {self._dir}")
            await asyncio.sleep(0.02)
        return socket_path

    async def _controller(self, name: str) -> RemoteController:
        found = self._controllers.get(name)
        if found is not None and self._alive():
            return found
        socket_path = await self._deployment()
        started = await _call(socket_path, "start", name)
        if started["owner"] is not None:
            self._owners.append(str(started["owner"]))
        controller = RemoteController(socket_path, name, wired=bool(started["wired"]))
        self._controllers[name] = controller
        return controller

    async def controller(self, *, wired: bool = True) -> EffectController:
        return await self._controller("wired" if wired else "unwired")

    async def awaiting(self, group_key: str, rank: int) -> bool:
        if not self._alive():
            return False
        socket_path = str(self._config["socket"])
        return bool(await _call(socket_path, "awaiting", "wired", group_key=group_key, rank=rank))

    async def inject_faults(self, operation: FaultedStep, count: int) -> int:
        await self._controller("wired")
        socket_path = str(self._config["socket"])
        args = {"operation": operation, "count": count}
        return int(await _call(socket_path, "inject_faults", "wired", **args))

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        self._controllers.clear()
        self._owners.clear()
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        return proc.pid

    async def restart(self) -> None:
        killed = self._kill()
        if killed is None:
            return
        # Reports the dead process sent before it died are queued at the lab ahead of
        # this one (the lab accepts connections in order): once it is answered they have
        # been recorded, and every later report from the killed pid is a zombie.
        await LabClient(self._env.lab_path).report("restart", "harness", killed=killed)
        mark_killed(self._env.lab_path, killed)

    async def aclose(self) -> None:
        if self._alive():
            with contextlib.suppress(DeploymentGone, OSError):
                await _call(str(self._config["socket"]), "stop", "wired")
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None


# -- the deployment process -----------------------------------------------------------------


class _Unresolved(EffectExecutor):
    async def run(self, call: contract.ExecutionInput) -> Any:
        raise RuntimeError(f"no executor for {call.envelope.replay_key!r}")


class _Server:
    def __init__(self, config: Mapping[str, Any]) -> None:
        module, _, name = str(config["builder"]).partition(":")
        self._builder = getattr(importlib.import_module(module), name)
        self._config = config
        self._resolver = conformance_resolver(config["lab"])
        self._hosts: dict[str, Any] = {}
        self.stopped = asyncio.Event()

    async def host(self, name: str) -> Any:
        host = self._hosts.get(name)
        if host is None:
            deployment = Deployment(
                name=name,
                resolver=None if name == "unwired" else self._resolver,
                work_dir=Path(self._config["work_dir"]),
                config=dict(self._config["config"]),
            )
            host = self._builder(deployment)
            if inspect.isawaitable(host):
                host = await host
            self._hosts[name] = host
        return host

    async def handle(self, op: str, name: str, args: dict[str, Any]) -> Any:
        if op == "stop":
            for host in self._hosts.values():
                if hasattr(host, "aclose"):
                    await host.aclose()
            self.stopped.set()
            return None
        host = await self.host(name)
        if op == "start":
            owner = getattr(host, "owner", None)
            wired = host.supports_effect_groups()
            return {"wired": wired, "owner": None if owner is None else str(owner)}
        if op == "awaiting":
            probe = getattr(host, "awaiting", None)
            return bool(probe is not None and await probe(args["group_key"], args["rank"]))
        if op == "inject_faults":
            return int(host.inject_faults(args["operation"], args["count"]))
        if op == "open":
            group = EffectGroup.model_validate(args["group"])
            return (await host.open_effect_group(group)).model_dump(mode="json")
        if op == "await":
            handle = GroupHandle.model_validate(args["handle"])
            settlement = await host.await_next_settlement(handle)
            return {"settlement": settlement.model_dump(mode="json"), "consumed": handle.consumed}
        if op == "close":
            handle = GroupHandle.model_validate(args["handle"])
            return await host.close_effect_group(handle, args.get("disposition"))
        if op == "open_group_keys":
            return await host.open_group_keys()
        if op == "settlement_order":
            return await host.settlement_order(args["group_key"])
        if op == "deliver_event":
            return await host.deliver_event(args["group_key"], args["name"], args.get("payload"))
        if op == "drain_pass":
            report: DrainReport = await host.drain().run_pass()
            return {
                "resumed": [list(ids) for ids in report.resumed],
                "cancelled": [list(ids) for ids in report.cancelled],
                "no_executor": [_error_to_wire(e) for e in report.no_executor],
            }
        if op == "execute_effect":
            envelope = EffectEnvelope.model_validate(args["envelope"])
            executor = self._resolver.resolve(envelope) or _Unresolved()
            outcome: Outcome = await host.execute_effect(envelope, executor)
            return outcome.model_dump(mode="json")
        raise ValueError(f"unknown op {op!r}")

    async def serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if not line:
                return
            request = json.loads(line)
            work = asyncio.ensure_future(
                self.handle(request["op"], request["host"], dict(request.get("args") or {}))
            )
            hangup = asyncio.ensure_future(reader.read(1))  # EOF: the caller went away
            await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                work.cancel()  # the caller cancelled its call (G-19)
                with contextlib.suppress(BaseException):
                    await work
                return
            hangup.cancel()
            try:
                reply: dict[str, Any] = {"ok": work.result()}
            except Exception as exc:
                reply = {"error": _error_to_wire(exc)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _announce(ready: str) -> None:
    """Tell the factory this process listens (its pid in the ``ready`` file)."""
    Path(ready).write_text(str(os.getpid()))


async def _serve(config: Mapping[str, Any]) -> None:
    server = _Server(config)
    socket_path = str(config["socket"])
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    listener = await asyncio.start_unix_server(server.serve_one, path=socket_path, limit=2**26)
    _announce(str(config["ready"]))
    async with listener:
        await server.stopped.wait()


def main(argv: list[str]) -> None:
    config = json.loads(Path(argv[0]).read_text())
    for entry in reversed(config.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    asyncio.run(_serve(config))


_LAUNCH = "import sys; from effecthost.conformance._process import main; main(sys.argv[1:])"
"""The deployment process's command (``python -c``)."""

if __name__ == "__main__":
    main(sys.argv[1:])
