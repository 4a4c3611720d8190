"""examples/restate_endpoint runs as its README says: the served app (whose handler uses
``HandlerController``), registration, and the external client's ``all`` and races."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from pathlib import Path

import pytest
from example_support import run_script, start_script, stop_script

from effecthost.hosts.restate.testing import LocalRestate, free_port

pytestmark = pytest.mark.anyio


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script("restate_endpoint", *args)


def _serve_app(port: int, admin: str) -> subprocess.Popen[bytes]:
    return start_script(
        "restate_endpoint", "app.py", "--bind", f"127.0.0.1:{port}", "--admin", admin
    )


async def _listening(port: int, app: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        assert app.poll() is None, "the example app exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        await asyncio.sleep(0.05)  # waiting for a process to listen, not ordering anything
    raise AssertionError("the example app never listened")


@pytest.mark.timeout(240)
async def test_the_restate_example_runs_as_documented(tmp_path: Path) -> None:
    local = LocalRestate(tmp_path, "unused:unused")
    await local.start_server()
    port = free_port()
    app = await asyncio.to_thread(_serve_app, port, local.admin_url)
    try:
        await _listening(port, app)
        registered = await asyncio.to_thread(
            _python,
            "register.py",
            "--admin",
            local.admin_url,
            "--endpoint",
            f"http://127.0.0.1:{port}",
        )
        assert registered.returncode == 0, registered.stderr
        client = await asyncio.to_thread(
            _python, "client_all.py", "--ingress", local.ingress_url, "--admin", local.admin_url
        )
        assert client.returncode == 0, client.stderr
        out = client.stdout
        assert "all: [{'answer': 1, 'q': 'a'}, {'answer': 2, 'q': 'bb'}, {'answer': 3" in out
        assert "race(lookup 0.1s, deadline 1s): {'status': 'ok'" in out
        assert "race(lookup 5.0s, deadline 1s): {'status': 'deadline'}" in out
        # G-15: it shuts down cleanly on SIGTERM (what container runtimes send)
        assert await asyncio.to_thread(stop_script, app) == 0
    finally:
        await asyncio.to_thread(stop_script, app)
        await local.stop()
