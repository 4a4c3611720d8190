"""Conformance factories and a throwaway PostgreSQL server for the SQL tier.

``effecthost conformance effecthost.hosts.sql.testing:sqlite_factory`` and
``…:postgres_factory``. The PostgreSQL factory uses ``EFFECTHOST_POSTGRES_DSN`` when set
(each run in a fresh schema) and otherwise starts its own server with
:class:`PostgresServer`: ``initdb`` and ``postgres`` in a temp dir, the unix socket in that
dir, a free TCP port on 127.0.0.1, run as the unprivileged ``postgres`` user when this
process is root, stopped (and the dir removed) afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effecthost.conformance import (
    FactoryEnv,
    HostCapabilities,
    HostUnderTest,
    conformance_resolver,
)
from effecthost.contract import EffectController, GroupExecutors

from ._host import SqlEffectHost
from ._postgres import PostgresStore
from ._sqlite import SqliteStore
from ._store import Store

StoreMaker = Callable[[], Store]

TEST_LEASE_TTL = 1.5
TEST_RENEW_EVERY = 0.25

# -- a throwaway PostgreSQL server ------------------------------------------------------


def find_pg_bin(name: str) -> str | None:
    """``name`` (``initdb``, ``postgres``…) on PATH or under the Debian layout."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A private PostgreSQL cluster for tests: ``start()``, ``dsn``, ``stop()``."""

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        self._base = base
        self.dir: Path | None = None
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, timeout: float = 60.0) -> str:
        initdb, postgres = find_pg_bin("initdb"), find_pg_bin("postgres")
        if initdb is None or postgres is None:
            raise RuntimeError(
                "PostgreSQL server binaries (initdb, postgres) not found on PATH or under "
                "/usr/lib/postgresql/*/bin: install the Debian package postgresql "
                "(scripts/install-sql.sh)"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="effecthost-pg-", dir=self._base))
        data, sock = self.dir / "data", self.dir / "sock"
        sock.mkdir()
        as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            # initdb and postgres refuse root: run them (directly, no wrapper process, so
            # the PID we stop is the postmaster's) as the unprivileged postgres user
            user = pwd.getpwnam("postgres")
            os.chmod(self.dir, 0o755)
            for path in (self.dir, sock):
                os.chown(path, user.pw_uid, user.pw_gid)
            as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        subprocess.run(
            [initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            cwd=self.dir,
            **as_user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._log = log = open(self.dir / "postgres.log", "wb")
        for _attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    postgres,
                    "-D",
                    str(data),
                    "-k",
                    str(sock),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                **as_user,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                    if self._ready():
                        return self.dsn
                time.sleep(0.05)
            self._kill()
        raise RuntimeError(f"PostgreSQL did not start; see {self.dir / 'postgres.log'}")

    def _ready(self) -> bool:
        isready = find_pg_bin("pg_isready")
        if isready is None:
            return True
        done = subprocess.run(
            [isready, "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return done.returncode == 0

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(2)  # SIGINT: fast shutdown
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# -- the host under test -----------------------------------------------------------------


class SqlHostUnderTest(HostUnderTest):
    """A wired and an unwired host over one database. ``restart()`` abandons both as a
    SIGKILL would (nothing written any more, connections closed, child tasks left
    unresumed-by-the-host rather than cancelled, so no cancellation handler runs), waits until the dead
    incarnation's leases have expired on the database clock — what a restarted process
    finds after its predecessor died — and builds new hosts with a new incarnation."""

    capabilities = HostCapabilities(restart=True, durable_timers=True)
    timeout = 10.0

    def __init__(
        self,
        make_store: StoreMaker,
        resolver: GroupExecutors,
        *,
        lease_ttl: float = TEST_LEASE_TTL,
        renew_every: float = TEST_RENEW_EVERY,
        on_close: list[object] | None = None,
    ) -> None:
        self._make_store = make_store
        self._resolver = resolver
        self._lease_ttl = lease_ttl
        self._renew_every = renew_every
        self._on_close = on_close or []
        self._hosts: dict[bool, SqlEffectHost] = {}
        self._orphans: list[asyncio.Task[None]] = []

    def _build(self, wired: bool) -> SqlEffectHost:
        return SqlEffectHost(
            self._make_store(),
            self._resolver if wired else None,
            node_id="conformance",
            lease_ttl=self._lease_ttl,
            renew_every=self._renew_every,
            poll_interval=0.1,
        )

    async def controller(self, *, wired: bool = True) -> EffectController:
        host = self._hosts.get(wired)
        if host is None:
            host = self._hosts[wired] = self._build(wired)
        await host.start()
        return host

    async def restart(self) -> None:
        owners = [h.owner for h in self._hosts.values()]
        for host in self._hosts.values():
            self._orphans += await host.abandon()
        self._hosts.clear()
        probe = self._make_store()
        await probe.start()
        try:
            latest = [await probe.max_lease_expiry(owner) for owner in owners]
            now = await probe.now()
            # the predecessor renewed at most renew_every ago: its leases expire at least
            # ttl - renew_every from now; wait for that, as a restarted process would
            expiry = max(
                [x for x in latest if x is not None] + [now + self._lease_ttl - self._renew_every]
            )
            await asyncio.sleep(max(0.0, expiry - now) + 0.02)
        finally:
            await probe.aclose()

    async def aclose(self) -> None:
        for host in self._hosts.values():
            await host.aclose()
        self._hosts.clear()
        for task in self._orphans:
            task.cancel()
        if self._orphans:
            await asyncio.wait(self._orphans, timeout=10)
        self._orphans = []
        for closer in self._on_close:
            if callable(closer):
                closer()


def sqlite_factory(env: FactoryEnv) -> SqlHostUnderTest:
    """The SQLite host under test, on a file in ``env.work_dir``."""
    path = env.work_dir / "effecthost.sqlite3"
    return SqlHostUnderTest(lambda: SqliteStore(path), conformance_resolver(env.lab_path))


def postgres_factory(env: FactoryEnv) -> SqlHostUnderTest:
    """The PostgreSQL host under test: ``EFFECTHOST_POSTGRES_DSN`` or its own server."""
    dsn = os.environ.get("EFFECTHOST_POSTGRES_DSN")
    closers: list[object] = []
    if not dsn:
        server = PostgresServer()
        dsn = server.start()
        closers.append(server.stop)
    schema = f"ehconf_{secrets.token_hex(4)}"
    chosen = dsn
    return SqlHostUnderTest(
        lambda: PostgresStore(chosen, schema=schema, pool_size=4),
        conformance_resolver(env.lab_path),
        on_close=closers,
    )
