"""Conformance factories and a throwaway PostgreSQL server for the SQL tier.

``effecthost conformance effecthost.hosts.sql.testing:sqlite_factory`` and
``…:postgres_factory``; ``…:sqlite_sealed_factory`` and ``…:postgres_sealed_factory`` add
payload references (the database's ``eh_payloads`` table) and sealing (a
:class:`~effecthost.payloads.FileKeyStore` in the work dir), G-47…G-50. The PostgreSQL factory uses ``EFFECTHOST_POSTGRES_DSN`` when set
(each run in a fresh schema) and otherwise starts its own server with
:class:`PostgresServer`: ``initdb`` and ``postgres`` in a temp dir, the unix socket in that
dir, a free TCP port on 127.0.0.1, run as the unprivileged ``postgres`` user when this
process is root, stopped (and the dir removed) afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import importlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from effecthost.conformance import (
    Deployment,
    FactoryEnv,
    ProcessHostUnderTest,
)
from effecthost.contract import EffectController, UnknownGroup
from effecthost.hosts import EngineMissing, require
from effecthost.hosts._procs import DURABLE, free_port
from effecthost.hosts._procs import stop as _stop
from effecthost.payloads import (
    AesGcmSealer,
    FileKeyStore,
    PayloadPolicy,
    StoredOutcome,
    default_scope,
)

from ._host import SqlEffectHost
from ._postgres import PostgresStore
from ._sqlite import SqliteStore
from ._store import Store

StoreMaker = Callable[[], Store]

TEST_LEASE_TTL = 1.5
TEST_RENEW_EVERY = 0.25

# -- a throwaway PostgreSQL server ------------------------------------------------------


PG_BIN_ENV = "EFFECTHOST_PG_BIN"


def find_pg_bin(name: str) -> str | None:
    """``name`` (``initdb``, ``postgres``…) in ``$EFFECTHOST_PG_BIN`` when set, else on
    PATH or under the Debian layout."""
    only = os.environ.get(PG_BIN_ENV)
    if only:
        candidate = Path(only) / name
        return str(candidate) if candidate.is_file() else None
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


class PostgresServer:
    """A private PostgreSQL cluster for tests: ``start()``, ``dsn``, ``stop()``.

    ``fsync`` is on unless asked otherwise: what the harness and the benchmarks measure is
    durable. ``crash()`` stops the server as ``pg_ctl stop -m immediate`` does (SIGQUIT to
    the postmaster: no checkpoint, crash recovery at the next start) and ``resume()``
    starts it again on the same data directory and port.
    """

    def __init__(self, base: str | os.PathLike[str] | None = None, *, fsync: bool = True) -> None:
        self._base = base
        self.fsync = fsync
        self._as_user: dict[str, Any] = {}
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
            raise EngineMissing(
                "PostgreSQL server binaries (initdb, postgres)",
                "apt-get install postgresql (scripts/install-sql.sh), or set "
                f"{PG_BIN_ENV} to their directory",
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
        self._as_user = as_user
        self._log = open(self.dir / "postgres.log", "ab")
        for _attempt in range(5):
            self.port = free_port()
            if self._launch(timeout):
                return self.dsn
        raise RuntimeError(f"PostgreSQL did not start; see {self.dir / 'postgres.log'}")

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "postgres.log"

    def _launch(self, timeout: float) -> bool:
        postgres = find_pg_bin("postgres")
        assert postgres is not None and self.dir is not None
        self.proc = subprocess.Popen(
            [
                postgres,
                "-D",
                str(self.dir / "data"),
                "-k",
                str(self.dir / "sock"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-c",
                f"fsync={'on' if self.fsync else 'off'}",
                "-c",
                "max_connections=200",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            **self._as_user,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                if self._ready():
                    return True
            time.sleep(0.05)
        self._kill()
        return False

    def crash(self) -> None:
        """Stop at once, as ``pg_ctl stop -m immediate``: the next start runs crash
        recovery from the WAL."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)
            proc.wait(30)

    def shutdown(self) -> None:
        """Stop as ``pg_ctl stop -m fast`` (clients are told, a checkpoint is written),
        keeping the data directory for :meth:`resume`."""
        self._kill()

    def resume(self, timeout: float = 60.0) -> str:
        """Start again on the same data directory and port (after :meth:`crash`)."""
        if not self._launch(timeout):
            raise RuntimeError(f"PostgreSQL did not restart; see {self.log_path}")
        return self.dsn

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
        _stop(proc, signal.SIGINT, 15)  # SIGINT: fast shutdown

    def stop(self, *, remove: bool = True) -> None:
        """Stop the server; ``remove=False`` leaves its directory (data and log)."""
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.dir is not None:
            if remove:
                shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# -- the host under test -----------------------------------------------------------------


class SqlHostUnderTest(ProcessHostUnderTest):
    """The SQL host in a deployment process of its own (the conformance suite's
    :class:`~effecthost.conformance.ProcessHostUnderTest`, with :func:`build` as its
    builder): every host the checks use — wired, unwired, sealed readers — with its child
    tasks, keeper, timers and drain lives there.

    ``restart()`` is a real one: it SIGKILLs that process (so no child of the dead
    incarnation can finish, and no event from it reaches the lab afterwards: the lab
    refuses events from a killed pid), then waits until the dead incarnations' leases have
    expired on the database clock — what a restarted process finds after its predecessor
    died — and the next controller starts a new process with new incarnations.

    ``target`` says which database (``{"store": "sqlite", "path": …}`` or
    ``{"store": "postgres", "dsn": …, "schema": …}``); ``make_store`` opens it here, to
    read lease expiries; ``host_class`` (``"module:Class"``) replaces
    :class:`SqlEffectHost` in the deployment process, with ``sys_path`` prepended there.
    """

    capabilities = DURABLE

    def __init__(
        self,
        env: FactoryEnv,
        target: dict[str, Any],
        make_store: StoreMaker,
        *,
        lease_ttl: float = TEST_LEASE_TTL,
        renew_every: float = TEST_RENEW_EVERY,
        on_close: list[object] | None = None,
        sealed: bool = False,
        host_class: str | None = None,
        sys_path: list[str] | None = None,
    ) -> None:
        config = {
            **target,
            "lease_ttl": lease_ttl,
            "renew_every": renew_every,
            "sealed": sealed,
            "keys": str(env.work_dir / "keys"),
            "wrong-keys": str(env.work_dir / "wrong-keys"),
            "host_class": host_class,
        }
        super().__init__(
            env,
            "effecthost.hosts.sql.testing:build",
            capabilities=self.capabilities,
            config=config,
            sys_path=sys_path or (),
        )
        self._make_store = make_store
        self._lease_ttl = lease_ttl
        self._renew_every = renew_every
        self._on_close = on_close or []
        self._readers = 0

    async def restart(self) -> None:
        owners = self.owners
        await super().restart()
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
        await super().aclose()
        for closer in self._on_close:
            if callable(closer):
                closer()


# -- the deployment process's side -------------------------------------------------------

_BUILT: list[Any] = []  # the hosts this deployment process built


async def build(deployment: Deployment) -> Any:
    """The builder :class:`SqlHostUnderTest` names, called in the deployment process: a
    started SQL host (``host_class`` when configured) over the configured database, for
    ``wired``, ``unwired`` and ``reader:none|wrong|right:N`` (a wired host whose payload
    policy differs only in its key store)."""
    config = deployment.config
    if config["store"] == "sqlite":
        store: Store = SqliteStore(config["path"])
    else:
        store = PostgresStore(config["dsn"], schema=config["schema"], pool_size=4)
    cls: Any = SqlEffectHost
    if config.get("host_class"):
        module, _, name = str(config["host_class"]).partition(":")
        cls = getattr(importlib.import_module(module), name)
    payloads = None
    if config.get("sealed"):
        keys = deployment.name.split(":")[1] if deployment.name.startswith("reader:") else "right"
        directory = {"right": "keys", "wrong": "wrong-keys"}.get(keys)
        sealer = None if directory is None else AesGcmSealer(FileKeyStore(config[directory]))
        payloads = PayloadPolicy(sealer=sealer)
    host = cls(
        store,
        deployment.resolver,
        node_id="conformance",
        lease_ttl=config["lease_ttl"],
        renew_every=config["renew_every"],
        poll_interval=0.1,
        payloads=payloads,
    )
    await host.start()
    host.awaiting = _awaiting
    _BUILT.append(host)
    return host


async def _awaiting(group_key: str, rank: int) -> bool:
    """The waiter probe: a waiter of ``group_key`` is parked on this process's wake-ups
    (the read that preceded it found no rank ``rank`` yet)."""
    return any(not w.done() for host in _BUILT for w in host._changed.get(group_key, ()))


def sqlite_factory(env: FactoryEnv) -> SqlHostUnderTest:
    """The SQLite host under test, on a file in ``env.work_dir``."""
    path = env.work_dir / "effecthost.sqlite3"
    return SqlHostUnderTest(env, {"store": "sqlite", "path": str(path)}, lambda: SqliteStore(path))


def _postgres_target(env: FactoryEnv) -> tuple[str, str, list[object]]:
    """A DSN (``EFFECTHOST_POSTGRES_DSN`` or a server started here), a fresh schema name,
    and what stops the server afterwards.

    A server of our own lives in a directory of its own (the unprivileged user it may run
    as cannot enter the private ``work_dir``), linked into ``work_dir`` as ``postgres``
    so a kept run finds its log; with ``env.keep`` it is left in place."""
    dsn = os.environ.get("EFFECTHOST_POSTGRES_DSN")
    closers: list[object] = []
    if not dsn:
        server = PostgresServer()
        dsn = server.start()
        assert server.dir is not None
        (env.work_dir / "postgres").symlink_to(server.dir, target_is_directory=True)
        closers.append(functools.partial(server.stop, remove=not env.keep))
    return dsn, f"ehconf_{secrets.token_hex(4)}", closers


def postgres_factory(env: FactoryEnv) -> SqlHostUnderTest:
    """The PostgreSQL host under test: ``EFFECTHOST_POSTGRES_DSN`` or its own server."""
    chosen, schema, closers = _postgres_target(env)
    return SqlHostUnderTest(
        env,
        {"store": "postgres", "dsn": chosen, "schema": schema},
        lambda: PostgresStore(chosen, schema=schema, pool_size=1),
        on_close=closers,
    )


# -- payload references and sealing (G-47…G-50) ---------------------------------------------


class SealedSqlHostUnderTest(SqlHostUnderTest):
    """A SQL host with a payload policy: outcomes above the default inline threshold in the
    database's own ``eh_payloads`` table, every outcome sealed (AES-256-GCM) with keys of a
    :class:`~effecthost.payloads.FileKeyStore` in the work dir (it survives ``restart``).

    ``reader`` builds another wired host over the same database whose policy differs only
    in the key store; ``stored_outcome`` reads the child row's ``outcome`` column;
    ``transplant_outcome`` copies one child row's ``outcome`` column into another with one
    SQL ``UPDATE`` (what someone with write access to the database could do);
    ``destroy_keys`` destroys the scope in the key directory.
    """

    capabilities = replace(DURABLE, payload_refs=True, sealing=True)

    def __init__(
        self,
        env: FactoryEnv,
        target: dict[str, Any],
        make_store: StoreMaker,
        sql: Callable[[str, tuple[Any, ...]], Any],
        *,
        on_close: list[object] | None = None,
    ) -> None:
        self._keys = FileKeyStore(env.work_dir / "keys")
        FileKeyStore(env.work_dir / "wrong-keys")
        super().__init__(env, target, make_store, on_close=on_close, sealed=True)
        self._sql = sql

    async def reader(self, *, keys: Literal["none", "wrong", "right"]) -> EffectController:
        self._readers += 1
        return await self._controller(f"reader:{keys}:{self._readers}")

    _SELECT = (
        "SELECT outcome FROM eh_children WHERE group_key = {0} AND replay_key = {1} "
        "AND state = 'settled'"
    )

    async def _outcome(self, group_key: str, replay_key: str) -> str:
        rows = await self._sql(self._SELECT, (group_key, replay_key))
        if not rows or rows[0][0] is None:
            raise UnknownGroup(
                f"no settled child {replay_key!r} in group {group_key!r}", group_key=group_key
            )
        return str(rows[0][0])

    async def stored_outcome(self, group_key: str, replay_key: str) -> StoredOutcome:
        return StoredOutcome.model_validate_json(await self._outcome(group_key, replay_key))

    async def transplant_outcome(self, *, source: tuple[str, str], target: tuple[str, str]) -> None:
        await self._outcome(*source)
        await self._outcome(*target)
        await self._sql(
            "UPDATE eh_children SET outcome = (SELECT outcome FROM eh_children "
            "WHERE group_key = {0} AND replay_key = {1}) "
            "WHERE group_key = {2} AND replay_key = {3} AND state = 'settled'",
            (*source, *target),
        )

    async def destroy_keys(self, group_key: str) -> None:
        self._keys.destroy(default_scope(group_key))


def sqlite_sql(path: Path) -> Callable[[str, tuple[Any, ...]], Any]:
    """Run one statement (placeholders ``{0}``, ``{1}``…) on the SQLite file at ``path``
    through a connection of its own (as another process would) and return its rows."""

    async def run(statement: str, args: tuple[Any, ...]) -> list[Any]:
        def go() -> list[Any]:
            conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
            try:
                sql = statement.format(*(["?"] * len(args)))
                return conn.execute(sql, args).fetchall()
            finally:
                conn.close()

        return await asyncio.to_thread(go)

    return run


def postgres_sql(dsn: str, schema: str) -> Callable[[str, tuple[Any, ...]], Any]:
    """As :func:`sqlite_sql`, over a fresh asyncpg connection in ``schema``."""

    async def run(statement: str, args: tuple[Any, ...]) -> list[Any]:
        (asyncpg,) = require("postgres", "postgres", "asyncpg")
        conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            sql = statement.format(*(f"${i}" for i in range(1, len(args) + 1)))
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return run


def sqlite_sealed_factory(env: FactoryEnv) -> SealedSqlHostUnderTest:
    """The SQLite host with payload references and sealing (G-47…G-50)."""
    path = env.work_dir / "effecthost.sqlite3"
    return SealedSqlHostUnderTest(
        env, {"store": "sqlite", "path": str(path)}, lambda: SqliteStore(path), sqlite_sql(path)
    )


def postgres_sealed_factory(env: FactoryEnv) -> SealedSqlHostUnderTest:
    """The PostgreSQL host with payload references and sealing (G-47…G-50):
    ``EFFECTHOST_POSTGRES_DSN`` or its own server."""
    chosen, schema, closers = _postgres_target(env)
    return SealedSqlHostUnderTest(
        env,
        {"store": "postgres", "dsn": chosen, "schema": schema},
        lambda: PostgresStore(chosen, schema=schema, pool_size=1),
        postgres_sql(chosen, schema),
        on_close=closers,
    )
