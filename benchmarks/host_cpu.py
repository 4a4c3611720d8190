"""Host CPU and caller memory per child on the memory host.

    .venv/bin/python benchmarks/host_cpu.py [--groups 2000] [--width 8] [--rounds 3]
        [--wide 10000] [--scaling 1000,10000] [--sql sqlite,postgres] [--profile N] [--memory-profile N] [--out FILE]

Two figures, each the median and range of ``--rounds`` rounds:

- CPU per child: process CPU time (``time.process_time``) of ``--groups`` consecutive
  ``all_`` groups of ``--width`` trivial tool calls on :class:`MemoryEffectHost`, divided
  by the children run. Measured side by side, alternating rounds, with the native floor:
  the same children as bare ``asyncio`` tasks under ``asyncio.gather``. The difference is
  what the library spends per child (building the group, hashing, recording, ranking,
  reading, closing).
- Caller memory per child: the ``tracemalloc`` peak of one ``all_`` of ``--wide``
  children (building the calls, the group, the record, the tasks, the results), divided
  by the children. Capped at the contract's ``MAX_CHILDREN`` (the row says which width
  ran). Twice: with the calls passed inline (``all_`` lets them go once the group is
  built) and with the caller holding its list of calls until the group is done.

``--scaling W1,W2,...`` adds the CPU per child of one ``all_`` of each width (calls built
beforehand, widths alternating round by round), with the cyclic collector's share of it
(``gc.callbacks``: time and passes by generation), and the widest ÷ narrowest ratio.

``--sql sqlite,postgres`` adds the SQL host's CPU per child on the same ``all_`` groups,
round by round beside the memory host (a fresh database each round; PostgreSQL a throwaway
server with fsync on, whose own CPU is not the host's and is not counted; SQLite's engine
runs in the process and is). In the same rounds, the first to go rotating: the SQL host
over a store that records nothing (``sql_groups.NullStore``: the seam with no SQL), and
each substrate's honest ceiling (``sql_ceilings.py``) doing the same groups from one caller
(PostgreSQL: the client's CPU only, as for the host). Their sum, less the envelopes and
hashes the ceiling computes as the host alone does too, is the substrate's ``floor``: the
least CPU per child a SQL host on this seam spends, whatever its store does.

``--profile N`` also prints the N most expensive functions (cProfile, by own time) of the
CPU workload; ``--memory-profile N`` the N largest allocation sites (tracemalloc, bytes
and objects per child still alive) of the wide group at its two high points: once the
open has returned (every child's task made, none run) and once the last child settled. Prints a table and writes JSON (``--out``, default
benchmarks/results/host_cpu.json). Importable: :func:`measure` returns the document.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import platform
import pstats
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from _bench import RESULTS, spread, write_json

from effecthost.combinators import Scope, all_, tool
from effecthost.contract import ToolRegistry, limits
from effecthost.hosts.memory import MemoryEffectHost

_SCOPES = iter(range(1_000_000))


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool("echo")
    async def echo(value: Any) -> Any:
        return value

    return registry


async def _native_echo(value: Any) -> Any:
    return value


def _scope() -> Scope:
    """A fresh scope per round: keys of closed groups are never reused."""
    return Scope(scope_id=f"bench-cpu-{next(_SCOPES)}")


async def _grouped(host: Any, groups: int, width: int) -> None:
    scope = _scope()
    for i in range(groups):
        await all_(host, scope, [tool("echo", [i, j]) for j in range(width)])


async def _native(groups: int, width: int) -> None:
    for i in range(groups):
        await asyncio.gather(*(_native_echo([i, j]) for j in range(width)))


def _cpu_us_per_child(body: Any, children: int) -> float:
    gc.collect()
    started = time.process_time()
    asyncio.run(body)
    return (time.process_time() - started) / children * 1e6


def cpu_rows(groups: int, width: int, rounds: int) -> dict[str, Any]:
    """Alternating rounds of effecthost and native; µs of CPU per child."""
    children = groups * width
    _cpu_us_per_child(_grouped(MemoryEffectHost(_registry()), min(200, groups), width), 1)
    host_us: list[float] = []
    native_us: list[float] = []
    for _ in range(rounds):
        host_us.append(
            _cpu_us_per_child(_grouped(MemoryEffectHost(_registry()), groups, width), children)
        )
        native_us.append(_cpu_us_per_child(_native(groups, width), children))
    return {
        "workload": f"all() of {width}",
        "groups": groups,
        "rounds": rounds,
        "us_per_child": spread(host_us),
        "native_us_per_child": spread(native_us),
        "library_us_per_child": spread([h - n for h, n in zip(host_us, native_us, strict=True)]),
    }


async def _sql_grouped(store: Any, groups: int, width: int) -> None:
    from effecthost.hosts.sql import SqlEffectHost

    host = SqlEffectHost(store, _registry())
    await host.start()
    try:
        await _grouped(host, groups, width)
    finally:
        await host.aclose()


def _sqlite_ceiling_cpu(path: Path, groups: int, width: int) -> float:
    """CPU µs per child of SQLite's honest ceiling doing ``groups`` groups of ``width``, one
    caller (the database file's set-up not counted)."""
    from sql_ceilings import SqliteCeiling

    ceiling = SqliteCeiling(path)
    try:
        gc.collect()
        started = time.process_time()
        for i in range(groups):
            ceiling.groups([f"cpu{i}:group:g:0"], width)
        return (time.process_time() - started) / (groups * width) * 1e6
    finally:
        ceiling.close()


def _postgres_ceiling_cpu(dsn: str, groups: int, width: int) -> float:
    """The client's CPU µs per child of PostgreSQL's honest ceiling doing the same (the
    server's CPU is not counted, as for the host; the schema's set-up is not either)."""
    from sql_ceilings import PostgresCeiling

    async def body() -> float:
        ceiling = PostgresCeiling(dsn)
        await ceiling.start(1)
        try:
            gc.collect()
            started = time.process_time()
            for i in range(groups):
                await ceiling.group(ceiling.conns[0], f"cpu{i}:group:g:0", width)
            return time.process_time() - started
        finally:
            await ceiling.aclose()

    return asyncio.run(body()) / (groups * width) * 1e6


def sql_rows(substrates: list[str], groups: int, width: int, rounds: int) -> dict[str, Any]:
    """µs of CPU per child of the SQL host on each substrate, beside the memory host, the
    host over a store that records nothing and each substrate's honest ceiling, in
    alternating rounds; and each substrate's floor: the least CPU per child a SQL host on
    this seam spends."""
    from sql_ceilings import prep_us_per_group
    from sql_groups import NullStore

    from effecthost.hosts.sql import PostgresStore, SqliteStore
    from effecthost.hosts.sql.testing import PostgresServer

    children = groups * width
    work = Path(tempfile.mkdtemp(prefix="effecthost-cpu-"))
    server = PostgresServer(fsync=True) if "postgres" in substrates else None
    made = iter(range(1_000_000))

    def store(substrate: str) -> Any:
        if substrate == "sqlite":
            return SqliteStore(work / f"cpu-{next(made)}.sqlite3")
        assert server is not None
        return PostgresStore(server.dsn, schema=f"cpu_{next(made)}")

    def ceiling(substrate: str, groups: int) -> float:
        if substrate == "sqlite":
            return _sqlite_ceiling_cpu(work / f"ceiling-{next(made)}.sqlite3", groups, width)
        assert server is not None
        return _postgres_ceiling_cpu(server.dsn, groups, width)

    sides: dict[str, Any] = {
        "memory": lambda: _cpu_us_per_child(
            _grouped(MemoryEffectHost(_registry()), groups, width), children
        ),
        "null store": lambda: _cpu_us_per_child(_sql_grouped(NullStore(), groups, width), children),
    }
    for substrate in substrates:
        sides[substrate] = lambda s=substrate: _cpu_us_per_child(
            _sql_grouped(store(s), groups, width), children
        )
        sides[f"{substrate} ceiling"] = lambda s=substrate: ceiling(s, groups)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    prep: list[float] = []
    try:
        if server is not None:
            server.start()
        warm = min(50, groups)  # imports, caches and the server
        _cpu_us_per_child(_sql_grouped(NullStore(), warm, width), 1)
        for substrate in substrates:
            _cpu_us_per_child(_sql_grouped(store(substrate), warm, width), 1)
            ceiling(substrate, warm)
        names = list(sides)
        for i in range(rounds):
            k = i % len(names)  # the first to go rotates: a shared machine drifts
            for name in names[k:] + names[:k]:
                samples[name].append(sides[name]())
            prep.append(prep_us_per_group(width) / width)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    floors = {
        s: [
            n + c - p
            for n, c, p in zip(samples["null store"], samples[f"{s} ceiling"], prep, strict=True)
        ]
        for s in substrates
    }
    return {
        "workload": f"all() of {width}",
        "groups": groups,
        "rounds": rounds,
        "load": os.getloadavg(),
        "us_per_child": {name: spread(samples[name]) for name in ["memory", "null store"]}
        | {s: spread(samples[s]) for s in substrates},
        "ceiling_us_per_child": {s: spread(samples[f"{s} ceiling"]) for s in substrates},
        "prep_us_per_child": spread(prep),
        "floor_us_per_child": {s: spread(f) for s, f in floors.items()},
    }


async def _wide(width: int) -> None:
    host = MemoryEffectHost(_registry())
    values = await all_(host, _scope(), [tool("echo", [j, "x"]) for j in range(width)])
    assert len(values) == width


async def _wide_held(width: int) -> None:
    """As :func:`_wide`, the caller keeping its calls until the group is done."""
    host = MemoryEffectHost(_registry())
    calls = [tool("echo", [j, "x"]) for j in range(width)]
    values = await all_(host, _scope(), calls)
    assert len(values) == len(calls)


async def _native_wide(width: int) -> None:
    values = await asyncio.gather(*(_native_echo([j, "x"]) for j in range(width)))
    assert len(values) == width


class _Collections:
    """Counts and times the cyclic collector's passes, by generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            generation = info["generation"]
            self.count[generation] += 1
            self.seconds[generation] += time.process_time() - self._started


def _one_wide_cpu(width: int) -> dict[str, Any]:
    """CPU per child of one ``all_`` of ``width`` (calls built beforehand, as
    ``wide_groups.py`` does), and the collector's share of it."""
    host = MemoryEffectHost(_registry())
    scope = _scope()
    calls = [tool("echo", [j, "x"]) for j in range(width)]
    collections = _Collections()

    async def body() -> None:
        await all_(host, scope, [tool("echo", [0, "warm"])])
        gc.collect()
        gc.callbacks.append(collections)
        try:
            started = time.process_time()
            values = await all_(host, scope, calls)
            elapsed = time.process_time() - started
        finally:
            gc.callbacks.remove(collections)
        assert len(values) == width
        seconds.append(elapsed)

    seconds: list[float] = []
    asyncio.run(body())
    return {
        "us_per_child": seconds[0] / width * 1e6,
        "gc_us_per_child": sum(collections.seconds) / width * 1e6,
        "collections": collections.count,
    }


def scaling_rows(widths: list[int], rounds: int) -> dict[str, Any]:
    """CPU per child of one wide ``all_`` at each width, alternating widths round by
    round; with the collector's share (its time and passes by generation)."""
    widths = [min(w, limits.MAX_CHILDREN) for w in widths]
    samples: dict[int, list[dict[str, Any]]] = {w: [] for w in widths}
    _one_wide_cpu(min(widths))
    for _ in range(rounds):
        for width in widths:
            samples[width].append(_one_wide_cpu(width))
    rows = {
        str(w): {
            "us_per_child": spread([s["us_per_child"] for s in got]),
            "gc_us_per_child": spread([s["gc_us_per_child"] for s in got]),
            "collections": [s["collections"] for s in got],
        }
        for w, got in samples.items()
    }
    return {"rounds": rounds, "widths": rows}


def _peak_per_child(body: Any, width: int) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        asyncio.run(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - base) / width


def memory_rows(width: int, rounds: int) -> dict[str, Any]:
    """The tracemalloc peak of one wide ``all_``, per child, and of the same children
    as bare tasks under ``asyncio.gather`` (the native floor)."""
    ran = min(width, limits.MAX_CHILDREN)
    asyncio.run(_wide(ran))  # warm imports and caches
    per_child: list[float] = []
    held: list[float] = []
    native: list[float] = []
    for _ in range(rounds):
        per_child.append(_peak_per_child(_wide(ran), ran))
        held.append(_peak_per_child(_wide_held(ran), ran))
        native.append(_peak_per_child(_native_wide(ran), ran))
    return {
        "workload": f"all() of {ran}",
        "asked_width": width,
        "width": ran,
        "rounds": rounds,
        "bytes_per_child": spread(per_child),
        "held_calls_bytes_per_child": spread(held),
        "native_bytes_per_child": spread(native),
    }


def profile(groups: int, width: int, top: int) -> str:
    """The ``top`` functions by own time over ``groups`` groups (after a warm-up)."""
    asyncio.run(_grouped(MemoryEffectHost(_registry()), min(200, groups), width))
    profiler = cProfile.Profile()
    host = MemoryEffectHost(_registry())
    profiler.enable()
    asyncio.run(_grouped(host, groups, width))
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


class _Snapshots(MemoryEffectHost):
    """Takes a tracemalloc snapshot after the open and after the last settlement."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.taken: dict[str, tracemalloc.Snapshot] = {}

    async def open_effect_group(self, group: Any) -> Any:
        handle = await super().open_effect_group(group)
        self.taken.setdefault("after open", tracemalloc.take_snapshot())
        return handle

    def _finalize(self, record: Any, child: Any, fence: int, outcome: Any) -> bool:
        done = super()._finalize(record, child, fence, outcome)
        if len(record.settled) == record.child_count:
            self.taken.setdefault("last settled", tracemalloc.take_snapshot())
        return done


def memory_profile(width: int, top: int) -> str:
    """Where the wide group's bytes are at its high points, per child."""
    ran = min(width, limits.MAX_CHILDREN)
    asyncio.run(_wide(ran))
    host = _Snapshots(_registry())

    async def body() -> None:
        await all_(host, _scope(), [tool("echo", [j, "x"]) for j in range(ran)])

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.take_snapshot()
        asyncio.run(body())
    finally:
        tracemalloc.stop()
    lines = []
    for moment, snapshot in host.taken.items():
        stats = snapshot.compare_to(base, "lineno")
        total = sum(stat.size_diff for stat in stats) / ran
        lines.append(f"{moment}: {total:.0f} bytes per child")
        for stat in stats[:top]:
            frame = stat.traceback[0]
            where = f"{Path(frame.filename).name}:{frame.lineno}"
            lines.append(
                f"  {stat.size_diff / ran:7.1f} B {stat.count_diff / ran:5.2f} obj  {where}"
            )
    return "\n".join(lines)


def measure(
    groups: int = 2000,
    width: int = 8,
    rounds: int = 3,
    wide: int = 10_000,
    scaling: list[int] | None = None,
    sql: list[str] | None = None,
) -> dict[str, Any]:
    document = {
        "python": platform.python_version(),
        "cpu": cpu_rows(groups, width, rounds),
        "memory": memory_rows(wide, rounds),
    }
    if scaling:
        document["scaling"] = scaling_rows(scaling, rounds)
    if sql:
        document["sql"] = sql_rows(sql, groups, width, rounds)
    return document


def _fmt(spread: dict[str, Any], digits: int = 1) -> str:
    return f"{spread['median']:.{digits}f} ({spread['min']:.{digits}f}–{spread['max']:.{digits}f})"


def table(document: dict[str, Any]) -> str:
    cpu, mem = document["cpu"], document["memory"]
    lines = [
        f"{'measure':<34}{'median (range)':>26}",
        "-" * 60,
        f"{'CPU µs/child, ' + cpu['workload']:<34}{_fmt(cpu['us_per_child']):>26}",
        f"{'  native gather µs/child':<34}{_fmt(cpu['native_us_per_child']):>26}",
        f"{'  library µs/child':<34}{_fmt(cpu['library_us_per_child']):>26}",
        f"{'bytes/child, ' + mem['workload']:<34}{_fmt(mem['bytes_per_child'], 0):>26}",
        f"{'  calls held by the caller':<34}{_fmt(mem['held_calls_bytes_per_child'], 0):>26}",
        f"{'  native gather bytes/child':<34}{_fmt(mem['native_bytes_per_child'], 0):>26}",
    ]
    if mem["width"] != mem["asked_width"]:
        lines.append(f"(asked {mem['asked_width']} children; MAX_CHILDREN is {mem['width']})")
    widths = document.get("scaling", {}).get("widths", {})
    for w, row in widths.items():
        label = f"CPU µs/child, one all() of {int(w):,}"
        lines.append(f"{label:<34}{_fmt(row['us_per_child']):>26}")
        lines.append(f"{'  of which the collector':<34}{_fmt(row['gc_us_per_child'], 2):>26}")
    if len(widths) >= 2:
        medians = [row["us_per_child"]["median"] for row in widths.values()]
        lines.append(f"{'  widest ÷ narrowest (medians)':<34}{medians[-1] / medians[0]:>26.2f}")
    sql = document.get("sql")
    if sql:
        load = ", ".join(f"{x:.1f}" for x in sql["load"])
        used = sql["us_per_child"]
        lines += [
            f"SQL host, {sql['groups']} groups of {sql['workload']} (load {load}),",
            "alternating rounds, CPU µs/child:",
            f"{'  memory host':<34}{_fmt(used['memory']):>26}",
            f"{'  SQL host over a null store':<34}{_fmt(used['null store']):>26}",
        ]
        for name in sql["ceiling_us_per_child"]:
            lines += [
                f"{'  SQL host, ' + name:<34}{_fmt(used[name]):>26}",
                f"{'    its honest ceiling':<34}{_fmt(sql['ceiling_us_per_child'][name]):>26}",
                f"{'    floor':<34}{_fmt(sql['floor_us_per_child'][name]):>26}",
            ]
        lines += [
            "floor = null store + ceiling − the ceiling's envelopes and hashes"
            f" ({sql['prep_us_per_child']['median']:.1f}),",
            "the least CPU per child a SQL host on this seam spends",
        ]
    return "\n".join(lines)


def main(options: argparse.Namespace) -> None:
    scaling = [int(w) for w in options.scaling.split(",")] if options.scaling else None
    sql = [s for s in options.sql.split(",") if s]
    document = measure(
        options.groups, options.width, options.rounds, options.wide, scaling, sql or None
    )
    print(f"host=memory  python={document['python']}  rounds={options.rounds}")
    print(table(document))
    if options.profile:
        print(profile(options.groups, options.width, options.profile))
    if options.memory_profile:
        print(memory_profile(options.wide, options.memory_profile))
    out = Path(options.out or RESULTS / "host_cpu.json")
    write_json(out, document)
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wide", type=int, default=10_000)
    parser.add_argument("--scaling", default="", metavar="W1,W2")
    parser.add_argument("--sql", default="", metavar="sqlite,postgres")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--memory-profile", type=int, default=0, metavar="N")
    parser.add_argument("--out")
    main(parser.parse_args())
