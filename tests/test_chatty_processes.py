"""Issue 19 (no blocked pipes): a process the library starts keeps running however much it
writes. Its stdout and stderr go to a file or are read to the end; a pipe read once and
never again would block the child once ~64 KiB sit unread in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from group_support import group as effect_group

from effecthost.conformance import FactoryEnv, HostCapabilities, ProcessHostUnderTest
from effecthost.contract import EffectEnvelope, EffectKind

HERE = Path(__file__).parent
SRC = HERE.parent / "src"

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_a_deployment_process_writing_megabytes_serves_a_group(tmp_path: Path) -> None:
    """A ``ProcessHostUnderTest`` deployment process writes 1.5 MiB to each of stdout and
    stderr while it starts and again in each of a group's two tool calls; the group
    completes, and what it wrote is in its ``deployment.log``."""
    env = FactoryEnv(lab_path=tmp_path / "lab", work_dir=tmp_path)
    under_test = ProcessHostUnderTest(
        env,
        "chatty_builder:build",
        capabilities=HostCapabilities(),
        sys_path=[str(HERE)],
    )
    try:
        ctl = await under_test.controller()
        group = effect_group(
            "chatty:group:g:0",
            [
                EffectEnvelope(
                    replay_key=f"chatty.{i}", kind=EffectKind.TOOL_CALL, name="loud", input=i
                )
                for i in range(2)
            ],
        )
        handle = await ctl.open_effect_group(group)
        values = {(await ctl.await_next_settlement(handle)).outcome.value for _ in range(2)}
        assert values == {0, 1}
        await ctl.close_effect_group(handle)
    finally:
        await under_test.aclose()
    assert _logged(tmp_path) > 6 * 1024 * 1024


def _logged(work_dir: Path) -> int:
    """Bytes in the deployment logs under ``work_dir``."""
    return sum(log.stat().st_size for log in work_dir.glob("deployment-*/deployment.log"))


def test_the_demo_completes_when_its_processes_write_megabytes(tmp_path: Path) -> None:
    """The demo's worker (and the demo itself) write 1.5 MiB to each of stdout and stderr
    as they start (a ``sitecustomize`` on their path); the demo still runs to the end."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import chatty_builder\n"
        "chatty_builder.shout()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    run = subprocess.run(
        [sys.executable, "-m", "effecthost.cli", "demo", "--slow", "1", "--deadline", "0.05"],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "settlement order by position: [0, 2, 1, 3]; group closed" in run.stdout
    assert len(run.stderr) > 2 * 1024 * 1024  # both processes' noise, read to the end
