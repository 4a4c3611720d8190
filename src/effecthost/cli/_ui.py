"""``effecthost ui``: every open group's timeline, served on a loopback address."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from ._common import (
    ExitCode,
    Refused,
    _bounded_int,
    _host_options,
    _no_side_files,
    command,
)
from ._inspection import _inspector


def _ui(args: argparse.Namespace) -> int:
    """Serve every open group's timeline on a loopback address until interrupted."""
    from effecthost import _timeline

    try:
        _timeline.loopback_address(args.bind)
    except _timeline.NotLoopback as exc:
        raise Refused(ExitCode.NOT_LOOPBACK, str(exc)) from None
    with _no_side_files(args):
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from effecthost import _inspect as shown
    from effecthost import _timeline
    from effecthost.hosts import MissingExtra

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="effecthost-ui", daemon=True)
    thread.start()
    inspector: Any = None
    try:
        try:
            inspector = asyncio.run_coroutine_threadsafe(_inspector(args), loop).result()
            # read once before serving, so a tier that cannot be read is refused up front
            _timeline.run_in(loop, inspector)(lambda i: i.groups())
        except shown.TierUnreachable as exc:
            raise Refused(ExitCode.UNREACHABLE, str(exc)) from None
        except MissingExtra as exc:
            raise Refused(ExitCode.ENGINE_MISSING, str(exc)) from None
        try:
            server = _timeline.make_server(
                _timeline.run_in(loop, inspector), args.bind, args.port, refresh=args.refresh
            )
        except OSError as exc:
            raise Refused(
                ExitCode.USAGE, f"cannot listen on {args.bind}:{args.port} ({exc.strerror})"
            ) from None
        host, port = str(server.server_address[0]), int(server.server_address[1])
        shown_host = f"[{host}]" if ":" in host else host
        print(f"effecthost ui: serving http://{shown_host}:{port}/", flush=True)

        def stop(*_: Any) -> None:
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    finally:
        # bounded: a stop is due within a second, whatever a client or a read is doing
        if inspector is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(inspector.aclose(), loop).result(0.3)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(0.2)
        if not thread.is_alive():
            loop.close()
    return ExitCode.OK


def add_parser(commands: Any) -> None:
    """Add the command to ``commands`` (the ``effecthost`` subparsers)."""
    ui = command(
        commands,
        "ui",
        help="serve every open group's timeline on a loopback address",
        description="A small local viewer: an index of the open groups of a host, each "
        "linking to the page `inspect --group KEY --html` writes. It reads like inspect "
        "(never writes) and listens on a loopback address only; stop it with Ctrl-C or "
        "SIGTERM.",
    )
    _host_options(ui, engines=True)
    ui.add_argument(
        "--bind", default="127.0.0.1", help="a loopback address or name (default 127.0.0.1)"
    )
    ui.add_argument(
        "--port",
        type=_bounded_int("port", 0, 65535),
        default=8765,
        help="port (default 8765; 0 picks one)",
    )
    ui.add_argument(
        "--refresh",
        type=_bounded_int("refresh", 0, 86400),
        default=5,
        metavar="SECONDS",
        help="page reload interval (0: none)",
    )
    ui.set_defaults(run=_ui)
