"""Gates and counters that work wherever a child runs.

The :class:`Lab` lives in the process running the checks and listens on a unix socket in
its directory. Children — in this process, a Restate endpoint, a Temporal worker or any
other process given the directory — talk to it through :class:`LabClient`: they report
events (``started``, ``finished``, ``cancelled``) and wait on gates the check opens. A
check orders children by opening gates and waiting for reported events, never by sleeping.

Deny-lists are files in the directory, so a resolver can read them synchronously.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOCKET_NAME = "lab.sock"
DENY_DIR = "deny"
KILLED_DIR = "killed"
BACKLOG = 1024  # pending connections the lab's socket holds


def mark_killed(lab_path: str | os.PathLike[str], pid: int) -> None:
    """Record that a factory SIGKILLed process ``pid`` (a restart): from now on an event
    reported from that pid is a zombie — a dead incarnation still running children —
    and fails the check it arrives in."""
    directory = Path(lab_path) / KILLED_DIR
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(pid)).touch()


def _safe(tag: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in tag)


@dataclass(frozen=True)
class LabEvent:
    """One report from a child: what happened, to which tag, with which data."""

    kind: str
    tag: str
    data: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0


class Lab:
    """The check-side end: opens gates, reads counters, writes deny-lists."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.events: list[LabEvent] = []
        self.zombies: list[LabEvent] = []
        """Events reported from a process a factory said it killed (:func:`mark_killed`)."""
        self.journal: list[LabEvent] = []
        """Every report, plus gates opened (``opened``) and children starting to wait on
        one (``waiting``): what a failing check shows of what happened last."""
        self._gates: dict[str, asyncio.Event] = {}
        self._open_prefixes: list[str] = []
        self._changed = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._calls: set[str] = set()  # ids of the reports recorded

    @property
    def socket_path(self) -> str:
        return str(self.path / SOCKET_NAME)

    async def start(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / DENY_DIR).mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        # A wide group's children call at once; past the backlog a connect can fail.
        self._server = await asyncio.start_unix_server(
            self._serve, path=self.socket_path, backlog=BACKLOG
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    # -- gates and deny-lists -----------------------------------------------------------

    def _gate(self, name: str) -> asyncio.Event:
        gate = self._gates.setdefault(name, asyncio.Event())
        if any(name.startswith(prefix) for prefix in self._open_prefixes):
            gate.set()
        return gate

    def open(self, gate: str) -> None:
        """Open ``gate``: every child waiting on it (now or later) proceeds."""
        opening = self._gate(gate)
        if not opening.is_set():
            self.journal.append(LabEvent("opened", gate, at=time.monotonic()))
        opening.set()

    def open_all(self, prefix: str) -> None:
        """Open every gate whose name starts with ``prefix``, now and later (clean-up)."""
        self._open_prefixes.append(prefix)
        for name, gate in self._gates.items():
            if name.startswith(prefix):
                gate.set()

    def deny(self, tag: str) -> None:
        """Make the conformance resolver answer ``None`` for the step ``tag`` (G-11)."""
        (self.path / DENY_DIR / _safe(tag)).touch()

    def denied_tags(self, prefix: str) -> list[str]:
        return [
            p.name for p in (self.path / DENY_DIR).iterdir() if p.name.startswith(_safe(prefix))
        ]

    def allow(self, tag: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / DENY_DIR / _safe(tag)).unlink()

    # -- counters -----------------------------------------------------------------------

    def count(self, kind: str, tag: str) -> int:
        return sum(1 for e in self.events if e.kind == kind and e.tag == tag)

    def of(self, tag: str) -> list[LabEvent]:
        return [e for e in self.events if e.tag == tag]

    def kinds(self, tag: str) -> Counter[str]:
        return Counter(e.kind for e in self.events if e.tag == tag)

    async def wait_for(self, kind: str, tag: str, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until ``count`` ``kind`` events were reported for ``tag``.

        Raises:
            TimeoutError: they did not come within ``timeout`` seconds.
        """
        await self.wait_until(
            lambda: self.count(kind, tag) >= count,
            f"{count} {kind!r} event(s) for {tag!r}",
            timeout,
        )

    async def wait_until(self, predicate: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def _report(self, message: dict[str, Any]) -> None:
        """Record a child's report once: a call whose answer was lost comes again with
        the same id."""
        call = message.get("id")
        if call is not None:
            if call in self._calls:
                return
            self._calls.add(str(call))
        self._record(
            LabEvent(
                kind=str(message["kind"]),
                tag=str(message["tag"]),
                data=dict(message.get("data") or {}),
                at=time.monotonic(),
            )
        )

    def _record(self, event: LabEvent) -> None:
        pid = event.data.get("pid")
        if pid is not None and (self.path / KILLED_DIR / str(pid)).exists():
            self.zombies.append(event)
        self.events.append(event)
        self.journal.append(event)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- the socket ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            line = await reader.readline()
            if not line:
                return
            message = json.loads(line)
            if message.get("op") == "report":
                self._report(message)
            elif message.get("op") == "wait":
                gate = self._gate(str(message["gate"]))
                if not gate.is_set():
                    self.journal.append(
                        LabEvent("waiting", str(message["gate"]), at=time.monotonic())
                    )
                await gate.wait()
            writer.write(b'{"ok":true}\n')
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, json.JSONDecodeError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: dict[str, Any]
) -> bytes:
    """Send ``message`` as one JSON line, read one line back (empty: the other side hung
    up) and close the connection."""
    try:
        writer.write(json.dumps(message).encode() + b"\n")
        await writer.drain()
        return await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class LabClient:
    """The child-side end. Each call is one short connection, so a child survives the
    lab being busy and a worker survives being killed mid-wait. A call is sent again
    until the lab answers it (a connection lost on the way, a full accept backlog); the
    lab records a report once by the call's id."""

    def __init__(self, path: str | os.PathLike[str], *, patience: float = 120.0) -> None:
        self.path = Path(path)
        self._patience = patience

    def denied(self, tag: str) -> bool:
        return (self.path / DENY_DIR / _safe(tag)).exists()

    async def report(self, kind: str, tag: str, **data: Any) -> None:
        await self._call({"op": "report", "kind": kind, "tag": tag, "data": data})

    async def wait_gate(self, gate: str) -> None:
        await self._call({"op": "wait", "gate": gate})

    async def _call(self, message: dict[str, Any]) -> None:
        """Send ``message`` until the lab answers it (or ``patience`` runs out); its id
        lets the lab record a report once however often it is sent."""
        message = {**message, "id": uuid.uuid4().hex}
        deadline = time.monotonic() + self._patience
        delay = 0.01
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.path / SOCKET_NAME))
            except (FileNotFoundError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)  # the lab is not listening yet: back off
                delay = min(delay * 2, 0.5)
                continue
            try:
                if await exchange(reader, writer, message):
                    return
            except ConnectionError:  # lost before the answer: sent again, recorded once
                pass
            if time.monotonic() > deadline:
                raise ConnectionError("the conformance lab closed the connection")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
