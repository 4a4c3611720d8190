"""The SQL host under test in a process of its own, driven over a unix socket.

The conformance factories (:mod:`effecthost.hosts.sql.testing`) run every SQL host — its
child tasks, keeper, timers and drain — in a *deployment process* started with
``python -m effecthost.hosts.sql._remote CONFIG``. The checks talk to it through
:class:`RemoteController`, so ``restart()`` can SIGKILL that process and start another:
a dead incarnation's children cannot finish, since the process that ran them is gone
(issue: a restart that left the old child tasks running let a drain that wrongly cancels
a loser pass).

One connection per call: a JSON request line, a JSON reply line. Closing the connection
cancels the call in the deployment process (asyncio cancellation of an await, G-19). Typed
errors travel as their class name and ids and are raised again on the caller's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from effecthost import contract
from effecthost.contract import (
    DrainReport,
    EffectController,
    EffectEnvelope,
    EffectExecutor,
    EffectGroup,
    EffectHostError,
    ExecutionInput,
    GroupDrain,
    GroupHandle,
    LoserPolicy,
    Outcome,
    Settlement,
)

# -- errors over the wire -------------------------------------------------------------------


def _error_to_wire(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, EffectHostError):
        return {"type": type(exc).__name__, "message": str(exc.args[0]), "ids": exc.ids()}
    return {"type": "RemoteError", "message": f"{type(exc).__name__}: {exc}", "ids": {}}


def _error_from_wire(wire: dict[str, Any]) -> Exception:
    cls = getattr(contract, str(wire["type"]), None)
    if not (isinstance(cls, type) and issubclass(cls, EffectHostError)):
        return RemoteError(str(wire["message"]))
    error: EffectHostError = cls.__new__(cls)
    Exception.__init__(error, wire["message"])
    ids = dict(wire["ids"])
    for name in ("group_key", "replay_key", "position", "rank"):
        setattr(error, name, ids.get(name))
    return error


class RemoteError(RuntimeError):
    """The deployment process failed a call with an untyped error (a host bug)."""


# -- the caller's side ----------------------------------------------------------------------


class RemoteDeploymentGone(RuntimeError):
    """The deployment process is not answering (killed, or crashed)."""


async def call(socket_path: str, op: str, host: str, **args: Any) -> Any:
    """One call to the deployment process listening on ``socket_path``."""
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=2**26)
    except (FileNotFoundError, ConnectionError) as exc:
        raise RemoteDeploymentGone(f"deployment process at {socket_path}: {exc}") from None
    try:
        writer.write(json.dumps({"op": op, "host": host, "args": args}).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not line:
        raise RemoteDeploymentGone(f"deployment process at {socket_path} hung up during {op}")
    reply = json.loads(line)
    if "error" in reply:
        raise _error_from_wire(reply["error"])
    return reply["ok"]


class RemoteDrain(GroupDrain):
    def __init__(self, controller: RemoteController) -> None:
        self._controller = controller

    async def run_pass(self) -> DrainReport:
        wire = await self._controller._call("drain_pass")
        return DrainReport(
            resumed=tuple((g, r) for g, r in wire["resumed"]),
            cancelled=tuple((g, r) for g, r in wire["cancelled"]),
            no_executor=tuple(_error_from_wire(e) for e in wire["no_executor"]),  # type: ignore[misc]
        )


class RemoteController(EffectController):
    """An :class:`EffectController` whose host lives in the deployment process.

    ``execute_effect`` resolves the executor in the deployment process (the one given
    here cannot cross a process boundary): the deployment's resolver, for the envelope.
    """

    def __init__(self, socket_path: str, host: str, *, wired: bool, owner: str) -> None:
        self.socket_path = socket_path
        self.host = host
        self.wired = wired
        self.owner = owner

    async def _call(self, op: str, **args: Any) -> Any:
        return await call(self.socket_path, op, self.host, **args)

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
        await self._call(
            "close",
            handle=handle.model_dump(mode="json"),
            disposition=None if disposition is None else disposition.value,
        )

    async def open_group_keys(self) -> list[str]:
        return list(await self._call("open_group_keys"))

    async def settlement_order(self, group_key: str) -> list[int]:
        return list(await self._call("settlement_order", group_key=group_key))

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        return int(
            await self._call("deliver_event", group_key=group_key, name=name, payload=payload)
        )

    def drain(self) -> GroupDrain:
        return RemoteDrain(self)


# -- the deployment process -----------------------------------------------------------------


class _UnresolvedExecutor(EffectExecutor):
    async def run(self, call: ExecutionInput) -> Any:
        raise RuntimeError(f"no executor for {call.envelope.replay_key!r}")


class Deployment:
    """Hosts of one deployment process, built on first use by name: ``wired``,
    ``unwired``, ``reader:none|wrong|right:N`` (a wired host whose payload policy
    differs only in its key store)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.hosts: dict[str, Any] = {}
        self._resolver: Any = None

    def _store(self) -> Any:
        from ._postgres import PostgresStore
        from ._sqlite import SqliteStore

        config = self.config
        if config["store"] == "sqlite":
            return SqliteStore(config["path"])
        return PostgresStore(config["dsn"], schema=config["schema"], pool_size=4)

    def _payloads(self, keys: str) -> Any:
        from effecthost.payloads import AesGcmSealer, FileKeyStore, PayloadPolicy

        if not self.config.get("sealed"):
            return None
        directory = {"right": "keys", "wrong": "wrong-keys"}.get(keys)
        sealer = None if directory is None else AesGcmSealer(FileKeyStore(self.config[directory]))
        return PayloadPolicy(sealer=sealer)

    def _host_class(self) -> Any:
        spec = self.config.get("host_class")
        if not spec:
            from ._host import SqlEffectHost

            return SqlEffectHost
        module, _, name = str(spec).partition(":")
        return getattr(importlib.import_module(module), name)

    async def host(self, name: str) -> Any:
        host = self.hosts.get(name)
        if host is None:
            from effecthost.conformance import conformance_resolver

            if self._resolver is None:
                self._resolver = conformance_resolver(self.config["lab"])
            keys = name.split(":")[1] if name.startswith("reader:") else "right"
            host = self._host_class()(
                self._store(),
                None if name == "unwired" else self._resolver,
                node_id="conformance",
                lease_ttl=self.config["lease_ttl"],
                renew_every=self.config["renew_every"],
                poll_interval=0.1,
                payloads=self._payloads(keys),
            )
            self.hosts[name] = host
        await host.start()
        return host

    async def handle(self, op: str, name: str, args: dict[str, Any]) -> Any:
        host = await self.host(name)
        if op == "awaiting":  # the waiter probe: a waiter parked on this process's wake-ups
            return any(
                not waiter.done()
                for hosts in self.hosts.values()
                for waiter in hosts._changed.get(args["group_key"], ())
            )
        if op == "start":
            return {"owner": host.owner, "wired": host.supports_effect_groups()}
        if op == "open":
            group = EffectGroup.model_validate(args["group"])
            return (await host.open_effect_group(group)).model_dump(mode="json")
        if op == "await":
            handle = GroupHandle.model_validate(args["handle"])
            settlement = await host.await_next_settlement(handle)
            return {"settlement": settlement.model_dump(mode="json"), "consumed": handle.consumed}
        if op == "close":
            handle = GroupHandle.model_validate(args["handle"])
            disposition = args.get("disposition")
            await host.close_effect_group(
                handle, None if disposition is None else LoserPolicy(disposition)
            )
            return None
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
            executor = (self._resolver and self._resolver.resolve(envelope)) or (
                _UnresolvedExecutor()
            )
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
                work.cancel()  # the caller cancelled its await (G-19)
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


async def serve(config: dict[str, Any]) -> None:
    deployment = Deployment(config)
    socket_path = str(config["socket"])
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = await asyncio.start_unix_server(deployment.serve_one, path=socket_path, limit=2**26)
    _announce(config["ready"])
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    config = json.loads(Path(argv[0]).read_text())
    for entry in config.get("sys_path", []):
        sys.path.insert(0, entry)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main(sys.argv[1:])
