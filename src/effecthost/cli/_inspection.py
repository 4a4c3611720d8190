"""``effecthost inspect``: the open groups of a host, or one group's ranks or timeline page."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Any

from effecthost.contract import EffectController

from ._common import (
    ExitCode,
    Refused,
    _close,
    _host_options,
    _load_host,
    _no_side_files,
    _refusals,
    _shown,
    _store,
    _where,
    command,
)


class _SqlInspector:
    """The inspection reads of a SQL store (``inspect_groups``, ``inspect_group``), with
    what a database can be wrong with turned into refusals."""

    def __init__(self, store: Any, where: str, start: Any = None) -> None:
        self._store = store
        self._where = where
        self._start = start

    async def _started(self) -> Any:
        if self._start is not None:
            start, self._start = self._start, None
            with _refusals(self._where):
                await start
        return self._store

    async def groups(self) -> list[Any]:
        store = await self._started()
        with _refusals(self._where):
            now = await store.now()
            groups: list[Any] = await store.inspect_groups()
        return [_opened(g, now) for g in groups]

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        from effecthost._inspect import UnknownGroupKey, in_rank_order

        store = await self._started()
        with _refusals(self._where):
            now = await store.now()
            found = await store.inspect_group(group_key)
        if found is None:
            raise UnknownGroupKey(group_key)
        return _opened(found[0], now), in_rank_order(found[1])

    async def aclose(self) -> None:
        await self._store.aclose()


def _opened(group: Any, now: float) -> Any:
    """The group with ``opened_at``: the read gives its age on the database clock, and
    ``now`` is that clock read just before, so the open is never placed after a
    settlement recorded on the same clock."""
    import dataclasses

    if group.age_seconds is None:
        return group
    return dataclasses.replace(group, opened_at=now - group.age_seconds)


class _KeysOnly:
    """A host that lists only its open group keys (no ranks to show)."""

    def __init__(self, controller: EffectController) -> None:
        self._controller = controller

    async def groups(self) -> list[Any]:
        from effecthost._inspect import GroupRow

        keys = await self._controller.open_group_keys()
        return [GroupRow(key, None, None, None, None, None, None) for key in keys]

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        raise Refused(
            ExitCode.USAGE, f"{type(self._controller).__name__} lists open group keys only"
        )

    async def aclose(self) -> None:
        await _close(self._controller)


class _Rows:
    """A host's own inspection (the documented interface, ``docs/writing-a-host.md``):
    ``inspect_groups()`` gives a mapping per open group, ``inspect_group(key)`` one for
    the group and one per child (or ``None``); the mappings' keys are the fields of
    :class:`~effecthost._inspect.GroupRow` and :class:`~effecthost._inspect.ChildRow`,
    any left out shown as ``-``."""

    def __init__(self, controller: EffectController) -> None:
        self._controller = controller

    async def groups(self) -> list[Any]:
        from effecthost._inspect import GroupRow

        found = await self._controller.inspect_groups()  # type: ignore[attr-defined]
        return [_row(GroupRow, g) for g in found]

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        from effecthost._inspect import ChildRow, GroupRow, UnknownGroupKey, in_rank_order

        found = await self._controller.inspect_group(group_key)  # type: ignore[attr-defined]
        if found is None:
            raise UnknownGroupKey(group_key)
        group, children = found
        return _row(GroupRow, group), in_rank_order([_row(ChildRow, c) for c in children])

    async def aclose(self) -> None:
        await _close(self._controller)


def _row(cls: Any, given: Any) -> Any:
    """``cls`` from a mapping (or an object) of its fields; a missing field is ``None``."""
    import dataclasses

    if isinstance(given, cls):
        return given
    names = [f.name for f in dataclasses.fields(cls)]
    if isinstance(given, dict):
        return cls(**{name: given.get(name) for name in names})
    return cls(**{name: getattr(given, name, None) for name in names})


class _KitRows:
    """A kit host (``KitController``) without its own inspection: the columns the kit's
    hooks give (wake, disposition in force, settled of total; per child its rank,
    position, replay key and status), over its open group keys."""

    def __init__(self, controller: Any) -> None:
        self._controller = controller

    async def _row(self, key: str) -> Any:
        from effecthost._inspect import GroupRow, UnknownGroupKey
        from effecthost.contract.kit import GroupRecord

        record = await self._controller.find_group(key)
        if not isinstance(record, GroupRecord) or record.closed:
            raise UnknownGroupKey(key)
        settled = len(await self._controller.settled_positions(key))
        wake, disposition = record.wake.value, record.in_force.value
        return GroupRow(key, None, wake, disposition, settled, record.child_count, None)

    async def groups(self) -> list[Any]:
        from effecthost._inspect import UnknownGroupKey

        rows = []
        for key in await self._controller.open_group_keys():
            with contextlib.suppress(UnknownGroupKey):  # closed since it was listed
                rows.append(await self._row(key))
        return rows

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        from effecthost._inspect import RUNNING, ChildRow

        row = await self._row(group_key)
        recorded = await self._controller.recorded_children(group_key)
        replay_keys = {child.position: child.replay_key for child in recorded}
        children, seen = [], set()
        for rank in range(1, row.total + 1):
            found = await self._controller.read_rank(group_key, rank)
            if found is None:
                break
            seen.add(found.position)
            status = found.outcome.status
            children.append(
                ChildRow(rank, found.position, found.replay_key, None, status, None, None)
            )
        for position in range(row.total):
            if position not in seen:
                replay_key = replay_keys.get(position)
                children.append(ChildRow(None, position, replay_key, None, RUNNING, None, None))
        return row, children

    async def aclose(self) -> None:
        await _close(self._controller)


class _HostInspector:
    """The inspector of a controller named by ``--host``; closing it closes the host."""

    def __init__(self, inner: Any, controller: EffectController) -> None:
        self._inner = inner
        self._controller = controller

    async def groups(self) -> list[Any]:
        groups: list[Any] = await self._inner.groups()
        return groups

    async def group(self, group_key: str) -> tuple[Any, list[Any]]:
        found: tuple[Any, list[Any]] = await self._inner.group(group_key)
        return found

    async def aclose(self) -> None:
        await _close(self._controller)


def _inspector_of(controller: EffectController) -> Any:
    """How to read ``controller``'s records: its SQL store, its Restate admin API, its
    Temporal client, or only its open group keys."""
    store = getattr(controller, "store", None)
    if store is not None and hasattr(store, "inspect_groups"):
        return _HostInspector(_SqlInspector(store, type(controller).__name__), controller)
    module = type(controller).__module__
    admin = getattr(controller, "admin_urls", None) or getattr(controller, "_admin", None)
    if module.startswith("effecthost.hosts.restate") and isinstance(admin, str | tuple):
        from effecthost.hosts.restate._inspect import RestateInspector

        return _HostInspector(RestateInspector(admin), controller)
    client = getattr(controller, "_client", None)
    if module.startswith("effecthost.hosts.temporal") and client is not None:
        from effecthost.hosts.temporal._inspect import TemporalInspector

        return _HostInspector(TemporalInspector(client), controller)
    if callable(getattr(controller, "inspect_groups", None)):
        return _Rows(controller)
    from effecthost.contract.kit import KitController

    if isinstance(controller, KitController):
        return _KitRows(controller)
    return _KeysOnly(controller)


async def _inspector(args: argparse.Namespace) -> Any:
    if args.sqlite or args.postgres:
        store = _store(args, read_only=True)
        start = (
            asyncio.wait_for(store.start(), args.connect_timeout)
            if args.postgres
            else store.start()
        )
        return _SqlInspector(store, _where(args), start)
    if args.restate:
        from effecthost.hosts.restate._inspect import RestateInspector

        return RestateInspector(args.restate, timeout=args.connect_timeout)
    if args.temporal:
        from effecthost.hosts.temporal._inspect import TemporalInspector

        return await TemporalInspector.connect(
            args.temporal, args.namespace, timeout=args.connect_timeout
        )
    return _inspector_of(await _load_host(args))


def _inspect(args: argparse.Namespace) -> int:
    from effecthost import _inspect as shown
    from effecthost.hosts import MissingExtra

    if args.html is not None and args.group is None:
        raise Refused(ExitCode.USAGE, "--html draws one group: give --group KEY")
    if args.html is not None:
        _writable_page(args.html, args.force)  # before anything is read

    async def main() -> int:
        inspector = await _inspector(args)
        try:
            if args.group is None:
                groups = await inspector.groups()
                print(shown.groups_json(groups) if args.json else shown.groups_table(groups))
                print(f"{len(groups)} open group(s)", file=sys.stderr)
            else:
                group, children = await inspector.group(args.group)
                if args.html is not None:
                    from effecthost._timeline import render_timeline

                    page = render_timeline(group, children)
                    await asyncio.to_thread(_write_page, args.html, page, args.force)
                    print(f"wrote {_shown(args.html, 400)}", file=sys.stderr)
                elif args.json:
                    print(shown.group_json(group, children))
                else:
                    print(shown.groups_table([group]))
                    print()
                    print(shown.ranks_table(children))
        finally:
            await inspector.aclose()
        return ExitCode.OK

    try:
        with _no_side_files(args):
            return asyncio.run(main())
    except shown.UnknownGroupKey as exc:
        raise Refused(
            ExitCode.UNKNOWN_GROUP, f"no open group {_shown(repr(exc.group_key))}"
        ) from None
    except shown.TierUnreachable as exc:
        raise Refused(ExitCode.UNREACHABLE, str(exc)) from None
    except MissingExtra as exc:
        raise Refused(ExitCode.ENGINE_MISSING, str(exc)) from None


def _writable_page(name: str, force: bool) -> Path:
    """The path ``--html`` may write: refused (one line, its own exit code) when it is
    empty, a directory or a special file, or a file that is not a page ``--html`` wrote
    (unless ``force``), or its directory is missing."""
    from effecthost._timeline import PAGE_PREFIX

    if not name:
        raise Refused(ExitCode.USAGE, "--html needs a file name")
    path = Path(name)
    shown = _shown(name)
    try:
        st = path.lstat()
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise Refused(ExitCode.WRITE_FAILED, f"{shown}: no such directory") from None
        return path
    except OSError as exc:
        raise Refused(ExitCode.WRITE_FAILED, f"{shown}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise Refused(ExitCode.NOT_A_FILE, f"{shown}: not a file (a directory)")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise Refused(ExitCode.NOT_A_FILE, f"{shown}: not a file (a special file)")
    if force:
        return path
    try:
        with open(path, "rb") as f:
            ours = stat.S_ISREG(st.st_mode) and f.read(len(PAGE_PREFIX.encode())) == (
                PAGE_PREFIX.encode()
            )
    except OSError:
        ours = False
    if not ours:
        raise Refused(
            ExitCode.CLOBBER,
            f"{shown}: exists and is not a page inspect --html wrote (--force replaces it)",
        )
    return path


def _write_page(name: str, page: str, force: bool) -> None:
    """Write ``page`` to ``name`` atomically (a temporary file beside it, renamed over
    it): a failed write leaves the old file, or none, never half a page."""
    import tempfile

    path = _writable_page(name, force)
    shown = _shown(name)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(page.encode())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise Refused(
            ExitCode.WRITE_FAILED, f"{shown}: cannot write the page ({exc.strerror or exc})"
        ) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def add_parser(commands: Any) -> None:
    """Add the command to ``commands`` (the ``effecthost`` subparsers)."""
    inspect_ = command(
        commands,
        "inspect",
        help="list the open groups of a host, or one group's ranks",
        description="List the open groups of a host (key, age, wake, disposition, "
        "settled/total, owner), or with --group KEY that group's children in rank order. "
        "Nothing is written and no write lock is taken: a SQLite file is opened read-only, "
        "a PostgreSQL schema is read in read-only transactions, Restate is read through "
        "its admin SQL API and Temporal through visibility, queries and history reads.",
    )
    _host_options(inspect_, engines=True)
    inspect_.add_argument("--group", metavar="KEY", help="show this group's rank table")
    inspect_.add_argument("--json", action="store_true", help="print JSON")
    inspect_.add_argument(
        "--html",
        metavar="FILE",
        help="with --group: write the group's timeline as a self-contained HTML page "
        "(atomically; an existing file is replaced only if it is such a page)",
    )
    inspect_.add_argument(
        "--force",
        action="store_true",
        help="with --html: replace an existing file that is not a page --html wrote",
    )
    inspect_.set_defaults(run=_inspect)
