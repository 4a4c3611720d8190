"""``effecthost drain``: finish children whose caller or process is gone."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from effecthost._inspect import safe_text
from effecthost.contract import EffectController, GroupExecutors

from ._common import (
    ExitCode,
    Refused,
    _close,
    _host_options,
    _load_host,
    _load_resolver,
    _no_side_files,
    _Progress,
    _refusals,
    _sealed_refusal,
    _start,
    _store,
    _where,
    command,
)


def _payload_policy(args: argparse.Namespace) -> Any:
    """The payload settings a drain records outcomes with (``--keys``, ``--payload-dir``,
    ``--inline-threshold``), or ``None`` for inline plaintext."""
    if args.keys is None and args.payload_dir is None:
        return None
    from effecthost.payloads import (
        DEFAULT_INLINE_THRESHOLD,
        AesGcmSealer,
        FileKeyStore,
        FilesystemPayloadStore,
        PayloadPolicy,
    )

    for option, folder in (("--keys", args.keys), ("--payload-dir", args.payload_dir)):
        if folder is not None and not os.path.isdir(folder):
            # a typo must not start a fresh key or payload directory
            raise Refused(ExitCode.USAGE, f"{option} {folder}: no such directory")
    return PayloadPolicy(
        store=FilesystemPayloadStore(args.payload_dir) if args.payload_dir else None,
        inline_threshold=(
            DEFAULT_INLINE_THRESHOLD if args.inline_threshold is None else args.inline_threshold
        ),
        sealer=AesGcmSealer(FileKeyStore(args.keys)) if args.keys else None,
    )


async def _sql_drain_host(args: argparse.Namespace, resolver: GroupExecutors | None) -> Any:
    from effecthost.hosts.sql import SqlEffectHost

    policy = _payload_policy(args)
    with _refusals(_where(args)):
        if policy is None or policy.sealer is None:
            # read-only: a refused drain leaves the file as it was (opening it for writing
            # would switch a rollback-journal database to WAL)
            reader = _store(args, read_only=True)
            try:
                await _start(reader, args)
                if await reader.deployment_sealed():
                    raise _sealed_refusal(_where(args))
            finally:
                await reader.aclose()
        store = _store(args, read_only=False)
        try:
            await _start(store, args)
        finally:
            await store.aclose()
        # a fresh store: the one above only checked the database
        host = SqlEffectHost(_store(args, read_only=False), resolver, payloads=policy)
        await host.start()
    return host


class _DrainLog:
    """What a drain shows: the same lines on a terminal and in a pipe (one per pass, one
    per child it touched, a ``done`` summary; JSON objects with ``--json``), plus, on a
    terminal only, a status line of what runs and what is left."""

    def __init__(self, as_json: bool) -> None:
        self._json = as_json
        self._progress = _Progress(sys.stdout)
        self.passes = 0
        self.totals = {"resumed": 0, "cancelled": 0, "no_executor": 0}

    def so_far(self) -> str:
        t = self.totals
        return f"resumed {t['resumed']}, cancelled {t['cancelled']}, no executor {t['no_executor']}"

    def status(self, text: str) -> None:
        self._progress.status(text)

    def _emit(self, text: str, doc: dict[str, Any]) -> None:
        self._progress.line(json.dumps(doc) if self._json else text)

    def report(self, report: Any, left: tuple[int | None, int] | None) -> None:
        self.passes += 1
        touched = {
            "resumed": [tuple(child) for child in report.resumed],
            "cancelled": [tuple(child) for child in report.cancelled],
            "no_executor": [(m.group_key, m.replay_key) for m in report.no_executor],
        }
        counts = {kind: len(children) for kind, children in touched.items()}
        for kind, count in counts.items():
            self.totals[kind] += count
        self._emit(
            f"pass {self.passes}: resumed {counts['resumed']}, cancelled "
            f"{counts['cancelled']}, no executor {counts['no_executor']}; {_left(left)}",
            {"event": "pass", "pass": self.passes, **counts, **_left_doc(left)},
        )
        for kind, children in touched.items():
            for group_key, replay_key in children:
                self._emit(
                    f"  {kind.replace('_', ' ')}: {safe_text(group_key)} {safe_text(replay_key)}",
                    {
                        "event": kind,
                        "pass": self.passes,
                        "group_key": group_key,
                        "replay_key": replay_key,
                    },
                )

    def done(self, left: tuple[int | None, int] | None) -> None:
        self._emit(
            f"done: {self.passes} pass(es), {self.so_far()}; {_left(left)}",
            {"event": "done", "passes": self.passes, **self.totals, **_left_doc(left)},
        )


def _left(left: tuple[int | None, int] | None) -> str:
    if left is None:
        return "left: unknown (the host lists no open groups)"
    if left[0] is None:
        return f"left: {left[1]} open group(s)"
    return f"left: {left[0]} unsettled in {left[1]} open group(s)"


def _left_doc(left: tuple[int | None, int] | None) -> dict[str, int | None]:
    return {"unsettled": left[0] if left else None, "open_groups": left[1] if left else None}


async def _what_is_left(controller: EffectController) -> tuple[int | None, int] | None:
    """Unsettled children of open groups and how many groups are open: from the SQL
    hosts' ``open_groups()``, else from ``open_group_keys()`` (G-30), counting the
    unsettled children when the host is a kit host; ``None`` when the host lists
    nothing."""
    listing = getattr(controller, "open_groups", None)
    if listing is not None:
        groups = await listing()
        return sum(g.child_count - g.settled for g in groups), len(groups)
    try:
        keys = await controller.open_group_keys()
    except NotImplementedError:
        return None
    from effecthost.contract.kit import GroupRecord, KitController

    if not isinstance(controller, KitController):
        return None, len(keys)
    unsettled = 0
    for key in keys:
        record = await controller.find_group(key)
        if isinstance(record, GroupRecord):
            unsettled += record.child_count - len(await controller.settled_positions(key))
    return unsettled, len(keys)


async def _finish(
    controller: EffectController,
    log: _DrainLog,
    timeout: float,
    left: tuple[int | None, int] | None,
) -> int:
    """Keep the host open until the children this run resumed settled: the host's
    ``idle()`` (documented in ``docs/writing-a-host.md``) returns once the children its
    process runs settled. Without ``idle()``, or past ``timeout``, say how many it
    leaves running: they stop with this process."""
    resumed = log.totals["resumed"]
    idle = getattr(controller, "idle", None)
    if idle is None and not resumed:
        return ExitCode.OK
    if idle is not None:
        log.status(f"finishing {resumed} resumed child(ren); {_left(left)}")
        try:
            await asyncio.wait_for(idle(), timeout)
            return ExitCode.OK
        except TimeoutError:
            pass
    running = getattr(controller, "running", None)
    still = len(running) if isinstance(running, dict) else resumed
    why = "the host has no idle()" if idle is None else f"after {timeout:g}s"
    print(
        f"effecthost: drain leaves {still} resumed child(ren) running ({why}); "
        "they stop with this process and a later drain resumes them",
        file=sys.stderr,
    )
    return ExitCode.LEFT_RUNNING


def _drain(args: argparse.Namespace) -> int:
    async def main() -> int:
        resolver = _load_resolver(args.resolver) if args.resolver else None
        if args.sqlite or args.postgres:
            controller = await _sql_drain_host(args, resolver)
        else:
            controller = await _load_host(args)
            if resolver is not None:
                register = getattr(controller, "register_executors", None)
                if register is None:
                    raise Refused(ExitCode.USAGE, "the host takes no --resolver")
                register(resolver)
        drain = controller.drain()
        log = _DrainLog(args.json)
        try:
            with _refusals(_where(args) if args.sqlite or args.postgres else "host"):
                while True:
                    log.status(f"pass {log.passes + 1}: draining (so far: {log.so_far()})")
                    report = await drain.run_pass()
                    left = await _what_is_left(controller)
                    log.report(report, left)
                    if args.once or (args.passes and log.passes >= args.passes):
                        code = await _finish(controller, log, args.finish_timeout, left)
                        log.done(await _what_is_left(controller))
                        return code
                    log.status(
                        f"pass {log.passes} done, next in {args.interval:g}s "
                        f"(so far: {log.so_far()}; {_left(left)})"
                    )
                    await asyncio.sleep(args.interval)  # the drain's cadence, not an ordering
        finally:
            await _close(controller)

    try:
        with _no_side_files(args):
            return asyncio.run(main())
    except KeyboardInterrupt:
        return 130


def add_parser(commands: Any) -> None:
    """Add the command to ``commands`` (the ``effecthost`` subparsers)."""
    drain = command(
        commands,
        "drain",
        help="finish children whose caller or process is gone (SQL tiers)",
        description="Finish children whose caller or process is gone. The database must "
        "exist and be an effecthost database of this schema version; it is checked before "
        "anything is written. A database holding sealed outcomes is drained only with its "
        "payload settings (--keys).",
    )
    _host_options(drain)
    drain.add_argument(
        "--keys",
        metavar="DIR",
        help="the FileKeyStore directory the hosts seal outcomes with (AES-256-GCM)",
    )
    drain.add_argument(
        "--payload-dir",
        metavar="DIR",
        help="a FilesystemPayloadStore directory for outcomes stored by reference "
        "(default: the database's own payload table)",
    )
    drain.add_argument(
        "--inline-threshold",
        type=int,
        metavar="BYTES",
        help="largest outcome recorded inline with --keys/--payload-dir (default 4096)",
    )
    drain.add_argument(
        "--resolver",
        metavar="MODULE:ATTR",
        help="the GroupExecutors (or a callable returning one); without it every unfinished "
        "child is reported as NoExecutor",
    )
    drain.add_argument("--once", action="store_true", help="one pass, then exit")
    drain.add_argument("--passes", type=int, default=0, help="stop after N passes")
    drain.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    drain.add_argument(
        "--finish-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="after the last pass, how long the children it resumed may take to settle "
        "before the drain exits leaving them running (default 300)",
    )
    drain.add_argument(
        "--json", action="store_true", help="print JSON lines (pass, per child, done)"
    )
    drain.set_defaults(run=_drain)
