"""What the tiers' ``testing`` modules share: the capabilities every durable tier declares,
and the processes they start (engine servers, endpoints, workers, PostgreSQL): free
loopback ports, spawning with the output in a log file, readiness polls and bounded
stops. Shared here so that no tier imports another."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

from effecthost.conformance import HostCapabilities
from effecthost.hosts import EngineMissing

DURABLE = HostCapabilities(
    restart=True, durable_timers=True, waiter_probe=True, second_incarnation=True
)
"""What every durable tier declares: it restarts from its records, its timers outlive a
restart, a parked await can be seen, and a second incarnation shares its records."""


def configured(variable: str, engine: str, install: str) -> str | None:
    """The executable the environment variable ``variable`` names, or None when unset.

    Raises:
        EngineMissing: ``variable`` names no file (``install`` says what provides it).
    """
    explicit = os.environ.get(variable)
    if explicit and not Path(explicit).is_file():
        raise EngineMissing(f"{engine} ({variable}={explicit})", install)
    return explicit or None


async def close_all(controllers: list[Any] | dict[Any, Any]) -> None:
    """Close every controller of ``controllers`` (a list, or a dict's values) in turn, and
    empty it."""
    for controller in list(controllers.values() if isinstance(controllers, dict) else controllers):
        await controller.aclose()
    controllers.clear()


def free_port() -> int:
    """A TCP port nothing listens on at the moment, on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(
    command: list[str], log: IO[bytes], *, env: dict[str, str] | None = None, **options: Any
) -> subprocess.Popen[bytes]:
    """Start ``command`` with its stdout and stderr in ``log``: never a pipe that nobody
    reads, which would block the process once its buffer is full. ``options`` go to
    :class:`subprocess.Popen` (``cwd``, ``process_group``)."""
    return subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **options
    )


def stop(process: subprocess.Popen[bytes] | None, sig: int, wait: float = 10.0) -> None:
    """Send ``sig`` to a running ``process``; SIGKILL it if it has not exited ``wait``
    seconds later."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(wait)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(wait)


async def terminate(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; waits for the process either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, grace)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


async def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL (a crash, not a shutdown) and wait for the process."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(process.wait)


async def wait_until(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 30.0) -> None:
    """Poll a readiness probe of a process we started (start-up only, never ordering)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.02
    while True:
        with contextlib.suppress(Exception):
            if await probe():
                return
        if loop.time() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout}s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)
