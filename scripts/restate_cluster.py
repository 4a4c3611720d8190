"""The Restate tier on a 3-node restate-server cluster, losing a node mid-group.

Starts three nodes on free loopback ports (replicated metadata and log, replication 2,
4 partitions), waits until every partition has a leader, serves the endpoint (given
every node's admin URL, so its cancel guard reads fail over) and registers it, then per
trial runs a 20-child ``all_`` and a ``race(6 s tool, 1 s sleep)``
declaring ``CANCEL`` while one node is SIGKILLed 0.5-1.5 s in and restarted 5-12 s
later (every third trial kills the node the caller is talking to). Checks per trial:

- both groups complete; the ``all_``'s ranks are dense and a fresh process re-reads
  them byte-identical before the group is closed;
- side effects per child (each tool appends one line to a file when it starts and one
  when its effect is done): extra attempts and repeated effects are counted;
- the race's CANCEL loser: starts of its tool after ``close`` returned (the endpoint's
  per-attempt guard keeps them at 0), and whether its effect happened;
- nothing of the trial is left running in the engine.

Prints a table and writes JSON::

    python scripts/restate_cluster.py [--trials 10] [--json out.json] [--work-dir DIR]
        [--seed N] [--tools async|thread] [--kill-window 0.5,1.5]

The same module is the endpoint's resolver (``restate_cluster:resolver EFFECTS_DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from effecthost.combinators import Scope, all_, race, sleep, tool
from effecthost.contract import GroupHandle, LoserPolicy, ToolRegistry
from effecthost.hosts.restate import CHILD

HERE = str(Path(__file__).resolve().parent)
WORK = "cluster.work"
SLOW = "cluster.slow"
WIDTH = 20
SLOW_SECONDS = 6.0
SLEEP_SECONDS = 1.0


def _append(path: Path, line: str) -> None:
    """One line in one ``write`` to an ``O_APPEND`` file: lines of concurrent attempts
    never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def resolver(effects_dir: str, mode: str = "async") -> ToolRegistry:
    """The tools: each records its start and its effect (with the wall time) in files.
    ``mode`` ``"thread"``: the work and the effect happen in a thread, which a cancelled
    attempt cannot stop (a tool calling a blocking client)."""
    where = Path(effects_dir)
    where.mkdir(parents=True, exist_ok=True)
    tools = ToolRegistry()

    def effect(tag: str) -> None:
        _append(where / "effects", f"{tag} {time.time():.6f} {os.getpid()}")

    def blocking(tag: str, seconds: float) -> None:
        time.sleep(seconds)
        effect(tag)

    async def run(value: Any) -> Any:
        tag = value["tag"]
        _append(where / "starts", f"{tag} {time.time():.6f} {os.getpid()}")
        if mode == "thread":
            await asyncio.to_thread(blocking, tag, float(value["seconds"]))
        else:
            await asyncio.sleep(float(value["seconds"]))
            effect(tag)
        return {"tag": tag}

    tools.add(WORK, run)
    tools.add(SLOW, run)
    return tools


def _lines(path: Path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        tag, at, _ = line.split()
        rows.append((tag, float(at)))
    return rows


class _Recording:
    """A controller that records what the combinators read and when their closes return,
    and lets a fresh process re-read a group's ranks just before it is closed."""

    def __init__(self, controller: Any, reread: Any) -> None:
        self._ctl = controller
        self._reread = reread
        self.read: dict[str, list[Any]] = {}
        self.closed_at: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctl, name)

    async def await_next_settlement(self, handle: GroupHandle) -> Any:
        settlement = await self._ctl.await_next_settlement(handle)
        self.read.setdefault(handle.group_key, []).append(settlement)
        return settlement

    async def close_effect_group(self, handle: GroupHandle, disposition: Any = None) -> None:
        await self._reread(handle)
        await self._ctl.close_effect_group(handle, disposition)
        self.closed_at[handle.group_key] = time.time()


async def _fresh_read(cluster: Any, effects: Path, handle: GroupHandle) -> list[str]:
    """Every rank of ``handle``'s group as a fresh process reads it (JSON lines)."""
    start = GroupHandle(
        group_key=handle.group_key,
        child_count=handle.child_count,
        consumed=0,
        wake=handle.wake,
        disposition=handle.disposition,
    )
    command = [
        sys.executable,
        __file__,
        "reread",
        json.dumps(
            {
                "ingress": cluster.ingress_urls,
                "admin": cluster.admin_urls,
                "effects": str(effects),
                "handle": start.to_json(),
                "ranks": handle.consumed,
            }
        ),
    ]
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"re-read failed: {done.stderr[-2000:]}")
    return done.stdout.splitlines()


async def _reread_main(spec: dict[str, Any]) -> None:
    from effecthost.hosts.restate import RestateController

    ctl = RestateController(spec["ingress"], spec["admin"], resolver(spec["effects"]), owner="re")
    try:
        handle = GroupHandle.from_json(spec["handle"])
        for _ in range(spec["ranks"]):
            settlement = await ctl.await_next_settlement(handle)
            print(settlement.model_dump_json())
    finally:
        await ctl.aclose()


async def _quiet(ctl: Any, prefix: str, timeout: float = 120.0) -> int:
    """Wait until no child invocation of this trial is unfinished in the engine; how many
    are left at the timeout (a bounded poll of the engine's state, not ordering)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        rows = await ctl.query(
            "SELECT count(*) AS n FROM sys_invocation WHERE status != 'completed' "
            f"AND target_service_name = '{CHILD}' AND idempotency_key LIKE '%{prefix}%'"
        )
        left = int(rows[0]["n"]) if rows else 0
        if left == 0 or loop.time() > deadline:
            return left
        await asyncio.sleep(0.5)


async def trial(
    cluster: Any,
    ctl: Any,
    effects: Path,
    n: int,
    victim: int,
    rng: random.Random,
    window: tuple[float, float] = (0.5, 1.5),
) -> dict[str, Any]:
    """One trial: both groups under a node loss; the figures of :func:`run`'s table."""
    prefix = f"t{n}x"
    caller_node = ctl._ingress_nodes._at  # the node the caller talks to now
    record: dict[str, Any] = {"trial": n, "killed": f"n{victim + 1}"}
    record["caller_node"] = victim == caller_node
    kill_after = rng.uniform(*window)  # the race closes at ~1.1 s: some kills land after
    down_for = rng.uniform(5.0, 12.0)
    reread: dict[str, tuple[list[str], list[str]]] = {}

    async def before_close(handle: GroupHandle) -> None:
        if handle.child_count == WIDTH:
            mine = [s.model_dump_json() for s in recording.read.get(handle.group_key, [])]
            reread[handle.group_key] = (mine, await _fresh_read(cluster, effects, handle))

    recording: Any = _Recording(ctl, before_close)
    calls = [
        tool(WORK, {"tag": f"{prefix}.c{i}", "seconds": rng.uniform(0.5, 2.0)})
        for i in range(WIDTH)
    ]
    racers = [tool(SLOW, {"tag": f"{prefix}.slow", "seconds": SLOW_SECONDS}), sleep(SLEEP_SECONDS)]
    started = time.time()

    async def outage() -> None:
        await asyncio.sleep(kill_after)  # the kill lands mid-group: that is the experiment
        cluster.kill_node(victim)
        await asyncio.sleep(down_for)
        await cluster.restart_node(victim)

    losing = asyncio.ensure_future(outage())
    wide, raced = await asyncio.gather(
        all_(recording, Scope(scope_id=f"{prefix}.all"), calls),
        race(recording, Scope(scope_id=f"{prefix}.race"), racers, disposition=LoserPolicy.CANCEL),
        return_exceptions=True,
    )
    record["groups_s"] = round(time.time() - started, 2)
    await losing
    record["left_running"] = await _quiet(ctl, prefix)
    record["left_open"] = sum(1 for key in await ctl.open_group_keys() if key.startswith(prefix))
    record["all_ok"] = isinstance(wide, list) and [v["tag"] for v in wide] == [
        f"{prefix}.c{i}" for i in range(WIDTH)
    ]
    record["race_ok"] = not isinstance(raced, BaseException)
    record["errors"] = [
        f"{type(r).__name__}: {r}" for r in (wide, raced) if isinstance(r, BaseException)
    ]
    (mine, fresh) = next(iter(reread.values()), ([], []))
    ranks = [json.loads(s)["rank"] for s in mine]
    record["ranks_dense"] = ranks == list(range(1, WIDTH + 1))
    record["reread_identical"] = bool(mine) and mine == fresh

    starts = Counter(tag for tag, _ in _lines(effects / "starts") if tag.startswith(prefix))
    done = Counter(tag for tag, _ in _lines(effects / "effects") if tag.startswith(prefix))
    children = [f"{prefix}.c{i}" for i in range(WIDTH)]
    record["extra_attempts"] = sum(starts[c] - 1 for c in children)
    record["max_attempts"] = max(starts[c] for c in children)
    record["effects_twice"] = sum(1 for c in children if done[c] > 1)
    record["effects_missing"] = sum(1 for c in children if done[c] == 0)
    race_key = next((k for k in recording.closed_at if k.startswith(f"{prefix}.race")), None)
    closed = recording.closed_at.get(race_key or "", float("inf"))
    slow = f"{prefix}.slow"
    record["loser_starts"] = starts[slow]
    record["loser_starts_after_close"] = sum(
        1 for tag, at in _lines(effects / "starts") if tag == slow and at > closed
    )
    record["loser_effect"] = done[slow]
    record["kill_s"] = round(kill_after, 2)
    record["race_closed_s"] = round(closed - started, 2)
    return record


async def run(
    work_dir: Path,
    trials: int,
    seed: int,
    victims: list[int] | None = None,
    mode: str = "async",
    window: tuple[float, float] = (0.5, 1.5),
) -> dict[str, Any]:
    """Start the cluster, run ``trials`` trials (``victims``: node index per trial,
    default: the caller's node every third trial, another node otherwise; ``mode``: the
    tools', see :func:`resolver`), stop it."""
    from effecthost.hosts.restate.testing import LocalRestateCluster

    rng = random.Random(seed)
    effects = work_dir / "effects"
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, path) if p)  # the endpoint's
    cluster = LocalRestateCluster(
        work_dir / "cluster", "restate_cluster:resolver", [str(effects), mode]
    )
    begun = time.time()
    await cluster.start()
    ready_s = time.time() - begun
    ctl = cluster.controller(resolver(str(effects)), owner="cluster-script")
    records = []
    try:
        for n in range(trials):
            at = ctl._ingress_nodes._at
            if victims is not None:
                victim = victims[n]
            else:
                victim = at if n % 3 == 0 else (at + 1 + rng.randrange(2)) % 3
            records.append(await trial(cluster, ctl, effects, n, victim, rng, window))
            print(_row(records[-1]), flush=True)
    finally:
        await ctl.aclose()
        await cluster.stop()
        if path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path
    return {
        "seed": seed,
        "mode": mode,
        "kill_window": window,
        "cluster_ready_s": round(ready_s, 1),
        "endpoint_admin_urls": list(cluster.endpoint.endpoint_admin_urls),
        "admin_urls": list(cluster.admin_urls),
        "trials": records,
    }


_COLUMNS = [
    ("trial", 5),
    ("killed", 6),
    ("kill_s", 6),
    ("race_closed_s", 13),
    ("caller_node", 11),
    ("groups_s", 8),
    ("all_ok", 6),
    ("race_ok", 7),
    ("ranks_dense", 11),
    ("reread_identical", 16),
    ("extra_attempts", 14),
    ("max_attempts", 12),
    ("effects_twice", 13),
    ("loser_starts", 12),
    ("loser_starts_after_close", 24),
    ("loser_effect", 12),
    ("left_running", 12),
    ("left_open", 9),
]


def _row(record: dict[str, Any]) -> str:
    return " ".join(str(record.get(name, "")).rjust(width) for name, width in _COLUMNS)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "reread":
        asyncio.run(_reread_main(json.loads(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--work-dir", default=None, help="default: a temporary directory")
    parser.add_argument(
        "--tools", choices=("async", "thread"), default="async", help="see resolver()"
    )
    parser.add_argument(
        "--kill-window",
        default="0.5,1.5",
        help="kill a node this many seconds after the groups start: LOW,HIGH (default 0.5,1.5)",
    )
    options = parser.parse_args()
    work = Path(options.work_dir or tempfile.mkdtemp(prefix="restate-cluster-"))
    print(" ".join(name.rjust(width) for name, width in _COLUMNS), flush=True)
    low, high = (float(x) for x in options.kill_window.split(","))
    result = asyncio.run(
        run(work, options.trials, options.seed, mode=options.tools, window=(low, high))
    )
    records = result["trials"]
    totals = {
        "trials": len(records),
        "completed": sum(1 for r in records if r["all_ok"] and r["race_ok"]),
        "reread_identical": sum(1 for r in records if r["reread_identical"]),
        "extra_attempts": sum(r["extra_attempts"] for r in records),
        "extra_attempts_caller_node": sum(r["extra_attempts"] for r in records if r["caller_node"]),
        "kills_after_close": sum(1 for r in records if r["kill_s"] > r["race_closed_s"]),
        "children": WIDTH * len(records),
        "effects_twice": sum(r["effects_twice"] for r in records),
        "loser_starts_after_close": sum(r["loser_starts_after_close"] for r in records),
        "loser_effects": sum(r["loser_effect"] for r in records),
        "left_running": sum(r["left_running"] for r in records),
        "left_open": sum(r["left_open"] for r in records),
    }
    result["totals"] = totals
    print(json.dumps(totals))
    if options.json:
        Path(options.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
