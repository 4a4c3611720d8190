"""Conformance factory and local fixtures for the Restate tier.

``effecthost conformance effecthost.hosts.restate.testing:factory`` starts a real
``restate-server`` (found through ``EFFECTHOST_RESTATE_SERVER`` or in ``.engines/restate``,
where ``scripts/install-restate.sh`` puts it) on free loopback ports in the factory's work
dir, serves the endpoint with hypercorn in a separate process and registers it. With
``EFFECTHOST_RESTATE_ADMIN_URL`` and ``EFFECTHOST_RESTATE_INGRESS_URL`` set it uses that
server instead and starts only the endpoint. Every process is stopped by its PID, and
writes its stdout and stderr to a log file in the work dir (``restate-server.log``,
``endpoint.log``): never to a pipe that nobody reads, which would block the process once
its buffer is full.

``sealed_factory`` does the same with a payload policy on both sides (a payload directory
and a key directory in the work dir): payload references and sealing (G-47…G-50).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Literal

from effecthost.conformance import (
    FactoryEnv,
    HostUnderTest,
    conformance_resolver,
)
from effecthost.contract import EffectController, EffectGroup, GroupExecutors
from effecthost.hosts import EngineMissing, require
from effecthost.hosts._procs import DURABLE, close_all, configured, free_port
from effecthost.hosts._procs import spawn as _spawn
from effecthost.hosts._procs import stop as _stop
from effecthost.hosts._procs import wait_until as _wait_until
from effecthost.payloads import (
    AesGcmSealer,
    FileKeyStore,
    PayloadPolicy,
    StoredOutcome,
    default_scope,
)

from ._controller import RestateController
from ._deploy import register_deployment
from ._policy import file_payload_policy
from ._wire import GROUP

SERVER_ENV = "EFFECTHOST_RESTATE_SERVER"
ADMIN_ENV = "EFFECTHOST_RESTATE_ADMIN_URL"
INGRESS_ENV = "EFFECTHOST_RESTATE_INGRESS_URL"
_RELATIVE_BINARY = Path(
    ".engines/restate/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
)
_INSTALL = "run scripts/install-restate.sh (it prints the path)"
UNBOUND_TARGET = "EffecthostUnbound/run"
"""A handler no deployment binds (G-14)."""


def find_server_binary() -> str:
    """The restate-server binary: ``$EFFECTHOST_RESTATE_SERVER`` or ``.engines/restate``
    above the working directory or this package. Never downloads anything.

    Raises:
        EngineMissing: with the command that installs it.
    """
    explicit = configured(SERVER_ENV, "restate-server", _INSTALL)
    if explicit:
        return explicit
    for base in (Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents):
        candidate = base / _RELATIVE_BINARY
        if candidate.is_file():
            return str(candidate)
    raise EngineMissing("restate-server", f"{_INSTALL} or set {SERVER_ENV}")


class LocalRestate:
    """A restate-server (unless external URLs are given) plus one endpoint process.

    ``resolver_spec``/``resolver_args`` name the endpoint's resolver as
    ``python -m effecthost.hosts.restate.serve`` takes them.
    """

    def __init__(
        self,
        work_dir: Path,
        resolver_spec: str,
        resolver_args: list[str] | None = None,
        *,
        admin_url: str | None = None,
        ingress_url: str | None = None,
        endpoint_args: list[str] | None = None,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.endpoint_args = list(endpoint_args or [])
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.resolver_spec = resolver_spec
        self.resolver_args = list(resolver_args or [])
        self.external = admin_url is not None and ingress_url is not None
        self.server: subprocess.Popen[bytes] | None = None
        self.endpoint: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        if self.external:
            assert admin_url is not None and ingress_url is not None
            self.admin_url, self.ingress_url = admin_url.rstrip("/"), ingress_url.rstrip("/")
        else:
            self._ports = {name: free_port() for name in ("admin", "ingress", "node")}
            self.admin_url = f"http://127.0.0.1:{self._ports['admin']}"
            self.ingress_url = f"http://127.0.0.1:{self._ports['ingress']}"
        self.endpoint_admin_urls = [self.admin_url]  # the endpoint's --admin-url (repeated)
        self.endpoint_port = free_port()
        self.endpoint_uri = f"http://127.0.0.1:{self.endpoint_port}"

    def _log(self, name: str) -> IO[bytes]:
        handle = open(self.work_dir / f"{name}.log", "ab")
        self._logs.append(handle)
        return handle

    async def start(self) -> None:
        if not self.external:
            await self.start_server()
        await self.start_endpoint()
        await register_deployment(self.admin_url, self.endpoint_uri, force=True)

    async def start_server(self) -> None:
        (httpx,) = require("restate", "restate", "httpx")
        ports = self._ports
        env = {
            **os.environ,
            "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{ports['admin']}",
            "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ports['ingress']}",
            "RESTATE_BIND_ADDRESS": f"127.0.0.1:{ports['node']}",
            "RESTATE_ADVERTISED_ADDRESS": f"http://127.0.0.1:{ports['node']}",
            "RESTATE_DISABLE_TELEMETRY": "true",
        }
        log = self._log("restate-server")
        self.server = _spawn(
            [find_server_binary(), "--base-dir", str(self.work_dir / "restate-data")],
            log,
            env=env,
            cwd=self.work_dir,
        )

        async def healthy() -> bool:
            if self.server is not None and self.server.poll() is not None:
                raise RuntimeError(f"restate-server exited; see {self.work_dir}/restate-server.log")
            async with httpx.AsyncClient(timeout=2.0) as client:
                admin = await client.get(f"{self.admin_url}/health")
                ingress = await client.get(f"{self.ingress_url}/restate/health")
                # the SQL view answers only once the partitions are served again (a
                # query right after a restart can fail with 500 while /health is 200)
                query = await client.post(
                    f"{self.admin_url}/query",
                    json={"query": "SELECT count(*) AS n FROM state"},
                    headers={"Accept": "application/json"},
                )
            return all(r.status_code == 200 for r in (admin, ingress, query))

        await _wait_until(healthy, "restate-server")

    async def start_endpoint(self) -> None:
        command = [
            sys.executable,
            "-m",
            "effecthost.hosts.restate.serve",
            "--bind",
            f"127.0.0.1:{self.endpoint_port}",
            "--resolver",
            self.resolver_spec,
            "--fast-retries",
        ]
        for url in self.endpoint_admin_urls:
            command += ["--admin-url", url]
        for arg in self.resolver_args:
            command += ["--resolver-arg", arg]
        command += self.endpoint_args
        await self._run_endpoint(command, "endpoint")

    async def start_app(self, command: list[str], name: str = "app") -> None:
        """Serve an app of one's own instead of the tier's endpoint: the restate-server is
        started (unless external), then ``command`` with the endpoint's bind address
        (``127.0.0.1:PORT``) appended, which is registered once it listens; its output
        goes to ``{name}.log``. :meth:`stop` stops both."""
        if not self.external:
            await self.start_server()
        await self._run_endpoint([*command, f"127.0.0.1:{self.endpoint_port}"], name)
        await register_deployment(self.admin_url, self.endpoint_uri, force=True)

    async def _run_endpoint(self, command: list[str], name: str) -> None:
        self.endpoint = _spawn(command, self._log(name))

        async def listening() -> bool:
            if self.endpoint is not None and self.endpoint.poll() is not None:
                raise RuntimeError(f"{name} exited; see {self.work_dir}/{name}.log")
            _, writer = await asyncio.open_connection("127.0.0.1", self.endpoint_port)
            writer.close()
            return True

        await _wait_until(listening, name)

    def kill_endpoint(self) -> None:
        """SIGKILL the endpoint process: in-flight invocations die mid-step."""
        _stop(self.endpoint, signal.SIGKILL)
        self.endpoint = None

    async def restart_server(self, sig: int = signal.SIGKILL) -> None:
        """Stop the restate-server with ``sig`` (SIGKILL by default: a crash) and start it
        again on the same ``--base-dir`` and ports; the endpoint keeps running, and the
        stored registration points the server at it again."""
        if self.external:
            raise RuntimeError("the restate-server is not ours to restart")
        await asyncio.to_thread(_stop, self.server, sig, 20.0)
        await self.start_server()

    async def restart(self, *, server: bool = True) -> None:
        """SIGKILL the endpoint, restart the server on the same base dir (when we own
        it), start the endpoint again on the same port (its registration persists)."""
        self.kill_endpoint()
        if server and not self.external:
            await asyncio.to_thread(_stop, self.server, signal.SIGTERM, 20.0)
            await self.start_server()
        await self.start_endpoint()

    async def stop(self) -> None:
        _stop(self.endpoint, signal.SIGTERM, 1.0)  # holds no state: a short grace, then KILL
        if not self.external:
            await asyncio.to_thread(_stop, self.server, signal.SIGTERM, 20.0)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def controller(
        self,
        resolver: GroupExecutors | None,
        *,
        owner: str,
        payloads: PayloadPolicy | None = None,
    ) -> RestateController:
        return RestateController(
            self.ingress_url, self.admin_url, resolver, owner=owner, payloads=payloads
        )


class RestateHostUnderTest(HostUnderTest):
    """The Restate tier under the conformance suite."""

    capabilities = replace(DURABLE, unroutable_children=True)
    timeout = 20.0

    payloads: PayloadPolicy | None = None

    def __init__(self, env: FactoryEnv, endpoint_args: list[str] | None = None) -> None:
        self.env = env
        self.local = LocalRestate(
            env.work_dir,
            "effecthost.conformance:conformance_resolver",
            [str(env.lab_path)],
            admin_url=os.environ.get(ADMIN_ENV),
            ingress_url=os.environ.get(INGRESS_ENV),
            endpoint_args=endpoint_args,
        )
        self._controllers: list[RestateController] = []

    async def start(self) -> None:
        await self.local.start()

    async def controller(self, *, wired: bool = True) -> EffectController:
        resolver = conformance_resolver(self.env.lab_path) if wired else None
        return self._track(resolver, self.payloads)

    def _track(
        self, resolver: GroupExecutors | None, payloads: PayloadPolicy | None
    ) -> RestateController:
        controller = self.local.controller(resolver, owner="conformance", payloads=payloads)
        self._controllers.append(controller)
        return controller

    async def restart(self) -> None:
        await close_all(self._controllers)
        await self.local.restart()

    async def open_unroutable(self, controller: EffectController, group: EffectGroup) -> None:
        assert isinstance(controller, RestateController)
        await controller.open_routed(group, {0: UNBOUND_TARGET})

    def _admin(self) -> RestateController:
        if not self._controllers:
            self._track(None, None)
        return self._controllers[0]

    async def awaiting(self, group_key: str, rank: int) -> bool:
        """Whether an ``await_rank`` of ``rank`` is parked at the engine: the group object
        records its awakeable under ``waiters`` once its read found no such rank, and
        drops it when the rank is handed over (the admin SQL API's view of the state)."""
        raw = (await group_state(self._admin(), group_key)).get("waiters")
        if raw is None:
            return False
        waiters: dict[str, list[str]] = json.loads(raw)
        return bool(waiters.get(str(rank)))

    async def aclose(self) -> None:
        await close_all(self._controllers)
        await self.local.stop()


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def group_state(controller: RestateController, group_key: str) -> dict[str, bytes]:
    """Every state entry of the group object ``group_key``, as the admin SQL API shows
    it (key → value bytes)."""
    rows = await controller.query(
        f"SELECT key, value_utf8 FROM state WHERE service_name = {_sql_text(GROUP)} "
        f"AND service_key = {_sql_text(group_key)}"
    )
    return {row["key"]: str(row["value_utf8"]).encode("utf-8") for row in rows}


class SealedRestateHostUnderTest(RestateHostUnderTest):
    """The Restate tier with a payload policy on the endpoint and every controller: a
    :class:`~effecthost.payloads.FilesystemPayloadStore` and a
    :class:`~effecthost.payloads.FileKeyStore` in the work dir (G-47…G-50).

    ``stored_outcome`` reads the group object's state through the admin SQL API;
    ``transplant_outcome`` rewrites it through the admin API's state modification (what an
    operator with admin access could do); ``destroy_keys`` destroys the scope in the key
    directory the endpoint reads.
    """

    capabilities = replace(RestateHostUnderTest.capabilities, payload_refs=True, sealing=True)

    def __init__(self, env: FactoryEnv) -> None:
        self.payload_dir = env.work_dir / "payloads"
        self.key_dir = env.work_dir / "keys"
        super().__init__(
            env, ["--payload-dir", str(self.payload_dir), "--key-dir", str(self.key_dir)]
        )
        self.payloads = file_payload_policy(self.payload_dir, self.key_dir)
        self._keys = FileKeyStore(self.key_dir)

    async def reader(self, *, keys: Literal["none", "wrong", "right"]) -> EffectController:
        policy = self.payloads
        assert policy is not None
        if keys == "none":
            policy = PayloadPolicy(store=policy.store, inline_threshold=policy.inline_threshold)
        elif keys == "wrong":
            wrong = FileKeyStore(self.env.work_dir / "wrong-keys")
            policy = PayloadPolicy(
                store=policy.store,
                inline_threshold=policy.inline_threshold,
                sealer=AesGcmSealer(wrong),
            )
        return self._track(conformance_resolver(self.env.lab_path), policy)

    async def _record(self, group_key: str, replay_key: str) -> tuple[str, dict[str, Any]]:
        """The rank-record key and record of a settled child (waits for the state view)."""
        state: dict[str, bytes] = {}
        for _ in range(50):
            state = await group_state(self._admin(), group_key)
            rank = state.get(f"settled:{replay_key}")
            if rank is not None and f"rank:{int(rank)}" in state:
                name = f"rank:{int(rank)}"
                record: dict[str, Any] = json.loads(state[name])
                return name, record
            await asyncio.sleep(0.1)  # the SQL view of an engine fact, not ordering
        raise LookupError(f"no rank record of {replay_key!r} in group {group_key!r}")

    async def stored_outcome(self, group_key: str, replay_key: str) -> StoredOutcome:
        _, record = await self._record(group_key, replay_key)
        return StoredOutcome.model_validate(record["stored"])

    async def transplant_outcome(self, *, source: tuple[str, str], target: tuple[str, str]) -> None:
        (httpx,) = require("restate", "restate", "httpx")
        _, origin = await self._record(*source)
        name, record = await self._record(*target)
        record["stored"] = origin["stored"]
        wanted = json.dumps(record).encode("utf-8")
        group = target[0]
        state = await group_state(self._admin(), group)
        state[name] = wanted
        async with httpx.AsyncClient(timeout=30.0) as client:
            answer = await client.post(
                f"{self.local.admin_url}/services/{GROUP}/state",
                json={"object_key": group, "new_state": {k: list(v) for k, v in state.items()}},
            )
            answer.raise_for_status()
        for _ in range(100):  # applied asynchronously: wait until the state shows it
            current = await group_state(self._admin(), group)
            if json.loads(current.get(name, b"null")) == record:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"the state modification of {group!r} was not applied")

    async def destroy_keys(self, group_key: str) -> None:
        self._keys.destroy(default_scope(group_key))


async def _started(host: RestateHostUnderTest) -> RestateHostUnderTest:
    try:
        await host.start()
    except BaseException:
        await host.local.stop()
        raise
    return host


async def factory(env: FactoryEnv) -> RestateHostUnderTest:
    return await _started(RestateHostUnderTest(env))


async def sealed_factory(env: FactoryEnv) -> SealedRestateHostUnderTest:
    """The tier with payload references and sealing declared (G-47…G-50)."""
    host = SealedRestateHostUnderTest(env)
    await _started(host)
    return host


class LocalRestateCluster:
    """``size`` restate-server nodes on loopback forming one cluster (replicated metadata
    and log), plus one endpoint process registered through every admin URL.

    Node ``i`` (0-based) gets fabric, admin and ingress ports of its own and
    ``--base-dir work_dir/n{i}``; the first node auto-provisions the cluster. Every
    process is stopped by its PID.
    """

    def __init__(
        self,
        work_dir: Path,
        resolver_spec: str,
        resolver_args: list[str] | None = None,
        *,
        size: int = 3,
        replication: int = 2,
        partitions: int = 4,
        endpoint_args: list[str] | None = None,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.size = size
        self._ports = [{n: free_port() for n in ("node", "admin", "ingress")} for _ in range(size)]
        self.admin_urls = [f"http://127.0.0.1:{p['admin']}" for p in self._ports]
        self.ingress_urls = [f"http://127.0.0.1:{p['ingress']}" for p in self._ports]
        self._settings = {
            "RESTATE_DISABLE_TELEMETRY": "true",
            "RESTATE_METADATA_CLIENT__ADDRESSES": json.dumps(
                [f"http://127.0.0.1:{p['node']}" for p in self._ports]
            ),
            "RESTATE_DEFAULT_REPLICATION": str(replication),
            "RESTATE_DEFAULT_NUM_PARTITIONS": str(partitions),
            "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": "256MiB",
        }
        self.nodes: list[subprocess.Popen[bytes] | None] = [None] * size
        # the endpoint alone: the cluster's admin and ingress are "external" to it
        self.endpoint = LocalRestate(
            self.work_dir,
            resolver_spec,
            resolver_args,
            admin_url=self.admin_urls[0],
            ingress_url=self.ingress_urls[0],
            endpoint_args=endpoint_args,
        )
        self.endpoint.endpoint_admin_urls = list(self.admin_urls)  # the guard fails over

    def start_node(self, i: int) -> None:
        ports = self._ports[i]
        env = {
            **os.environ,
            **self._settings,
            "RESTATE_BIND_ADDRESS": f"127.0.0.1:{ports['node']}",
            "RESTATE_ADVERTISED_ADDRESS": f"http://127.0.0.1:{ports['node']}",
            "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{ports['admin']}",
            "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ports['ingress']}",
        }
        command = [
            find_server_binary(),
            "--node-name",
            f"n{i + 1}",
            "--cluster-name",
            "effecthost",
            "--auto-provision",
            "true" if i == 0 else "false",
            "--base-dir",
            str(self.work_dir / f"n{i + 1}"),
        ]
        log = self.endpoint._log(f"n{i + 1}")
        self.nodes[i] = _spawn(command, log, env=env, cwd=self.work_dir)

    async def wait_node(self, i: int, timeout: float = 60.0) -> None:
        """Until node ``i`` answers its admin ``/health`` (start-up poll)."""
        (httpx,) = require("restate", "restate", "httpx")

        async def healthy() -> bool:
            process = self.nodes[i]
            if process is None or process.poll() is not None:
                raise RuntimeError(f"node n{i + 1} exited; see {self.work_dir}/n{i + 1}.log")
            async with httpx.AsyncClient(timeout=2.0) as client:
                answer = await client.get(f"{self.admin_urls[i]}/health")
            return bool(answer.status_code == 200)

        await _wait_until(healthy, f"restate-server n{i + 1}", timeout)

    async def start(self, *, leaders_within: float = 120.0) -> None:
        """Start every node and the endpoint, wait for partition leaders, register;
        on any failure stop what was started."""
        try:
            for i in range(self.size):
                self.start_node(i)
            for i in range(self.size):
                await self.wait_node(i)
            await self.endpoint.start_endpoint()
            await register_deployment(
                self.admin_urls, self.endpoint.endpoint_uri, leaders_within=leaders_within
            )
        except BaseException:
            await self.stop()
            raise

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``."""
        _stop(self.nodes[i], signal.SIGKILL)
        self.nodes[i] = None

    async def restart_node(self, i: int) -> None:
        """Start node ``i`` again on its base dir and wait for its ``/health``."""
        self.start_node(i)
        await self.wait_node(i)

    async def stop(self) -> None:
        await self.endpoint.stop()  # the endpoint, and it closes the logs last
        for i in range(self.size):
            await asyncio.to_thread(_stop, self.nodes[i], signal.SIGTERM, 20.0)
            self.nodes[i] = None

    def controller(
        self, resolver: GroupExecutors | None, *, owner: str, **options: Any
    ) -> RestateController:
        return RestateController(
            self.ingress_urls, self.admin_urls, resolver, owner=owner, **options
        )
