"""The conformance factory for the Redis host, and a local ``redis-server`` to run it on.

``PYTHONPATH=. effecthost conformance examples.redis_host.testing:factory`` starts a
``redis-server`` on a free loopback port in the run's work dir (append-only file, fsync on
every write), runs the suite, and stops the server. The host runs in a deployment process
of its own, so ``restart()`` SIGKILLs every child of the dead incarnation; the next
process finds only what Redis recorded, once the dead incarnations' liveness keys expired.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis.asyncio as redis

from effecthost.conformance import (
    Deployment,
    FactoryEnv,
    HostCapabilities,
    ProcessHostUnderTest,
)

from .host import PREFIX, RedisHost

TTL = 1.0
"""The suite's liveness TTL: a restart waits this long at most for the old owner to go."""


class RedisServer:
    """A ``redis-server`` process on a free loopback port, its data in ``directory``."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found; run scripts/install-redis.sh")
        directory.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._log = open(directory / "redis.log", "ab")
        durable = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(directory),
                *durable,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    async def ready(self, timeout: float = 20.0) -> RedisServer:
        deadline = time.monotonic() + timeout
        client = redis.from_url(self.url)
        try:
            while True:  # start-up only: a bounded poll for the server to answer
                try:
                    await client.ping()
                    return self
                except (redis.ConnectionError, OSError) as error:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        why = f"redis-server did not start; see {self._log.name}"
                        raise RuntimeError(why) from error
                    await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# [factory]
async def build(deployment: Deployment) -> RedisHost:
    """Called in the deployment process, once per controller the suite asks for."""
    client = redis.from_url(deployment.config["url"], decode_responses=True)
    host = RedisHost(client, deployment.resolver, deployment.config["ttl"])
    return await host.start()


class RedisUnderTest(ProcessHostUnderTest):
    """Stops the server with the run; a restart waits until the killed incarnations'
    liveness keys expired (R-1: only then is their owner gone)."""

    def __init__(self, env: FactoryEnv, server: RedisServer) -> None:
        capabilities = HostCapabilities(
            restart=True, durable_timers=True, waiter_probe=True, second_incarnation=True
        )
        config = {"url": server.url, "ttl": TTL}
        super().__init__(
            env, "examples.redis_host.testing:build", capabilities=capabilities, config=config
        )
        self.server = server

    async def restart(self) -> None:
        owners = self.owners
        await super().restart()
        client = redis.from_url(self.server.url)
        try:
            deadline = time.monotonic() + 10 * TTL
            while owners and await client.exists(*(f"{PREFIX}:o:{o}" for o in owners)):
                if time.monotonic() > deadline:  # a bounded poll of the server's clock
                    raise RuntimeError(f"liveness keys of {owners} did not expire")
                await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            self.server.stop()


async def factory(env: FactoryEnv) -> ProcessHostUnderTest:
    return RedisUnderTest(env, await RedisServer(env.work_dir / "redis").ready())


# [/factory]


async def from_env() -> RedisHost:
    """The host over ``$EFFECTHOST_REDIS_URL``, for ``effecthost drain --host`` and
    ``effecthost inspect --host examples.redis_host.testing:from_env``."""
    client = redis.from_url(os.environ["EFFECTHOST_REDIS_URL"], decode_responses=True)
    return await RedisHost(client, None, ttl=10.0).start()
