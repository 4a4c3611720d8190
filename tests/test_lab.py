"""The conformance lab's socket: a child's call reaches the lab once, whatever happens to
its connection. The suite's checks count lab events (a child ran once, a loser never
finished), so a lost or repeated report would fail a correct host."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from effecthost.conformance import _lab
from effecthost.conformance._lab import Lab, LabClient


class _Mute:
    """A writer that sends nothing: the lab's answer is lost on the way."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self._writer.close()

    async def wait_closed(self) -> None:
        await self._writer.wait_closed()


class _DropsFirstAnswer(Lab):
    """Serves the first call it is sent, then hangs up without its answer."""

    dropped = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.dropped:
            self.dropped = True
            writer = _Mute(writer)  # type: ignore[assignment]
        await super()._serve(reader, writer)


def test_a_report_whose_answer_is_lost_is_recorded_once(tmp_path: Path) -> None:
    """G-05 (a child runs once, and the lab must be able to tell): a report the lab
    recorded but whose answer was lost is sent again, and recorded once."""

    async def run() -> None:
        lab = _DropsFirstAnswer(tmp_path / "lab")
        await lab.start()
        try:
            await LabClient(lab.path, patience=10).report("finished", "t.1")
            assert lab.count("finished", "t.1") == 1
        finally:
            await lab.stop()

    asyncio.run(run())


def test_a_connection_lost_mid_call_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection the lab could not take (a full accept backlog under load hands the
    child a socket that is not connected: ``ConnectionResetError('Connection lost')``)
    fails the call's exchange, not the child's tool: the call is made again."""
    real = _lab.exchange
    failures = [ConnectionResetError("Connection lost")]

    async def flaky(reader: Any, writer: Any, message: dict[str, Any]) -> bytes:
        if failures:
            writer.close()
            raise failures.pop()
        return await real(reader, writer, message)

    monkeypatch.setattr(_lab, "exchange", flaky)

    async def run() -> None:
        lab = Lab(tmp_path / "lab")
        await lab.start()
        try:
            await LabClient(lab.path, patience=10).report("finished", "t.2")
            assert lab.count("finished", "t.2") == 1
        finally:
            await lab.stop()

    asyncio.run(run())


def test_many_children_calling_at_once_all_get_through(tmp_path: Path) -> None:
    """More children than the lab's accept backlog call at once (a wide group's
    children do): every report is recorded, once."""

    async def run() -> None:
        lab = Lab(tmp_path / "lab")
        await lab.start()
        try:
            client = LabClient(lab.path, patience=30)
            await asyncio.gather(*(client.report("finished", f"w.{i}") for i in range(600)))
            assert [lab.count("finished", f"w.{i}") for i in range(600)] == [1] * 600
        finally:
            await lab.stop()

    asyncio.run(run())
