"""Serve this tier's endpoint with hypercorn: ``python -m effecthost.hosts.restate.serve``.

``--resolver MODULE:CALLABLE`` names the resolver (or a factory called with the
``--resolver-arg`` values); the endpoint binds the group object, the child service and the
payload object for it, validated before serving (G-42). ``--payload-dir`` (and
``--key-dir`` to seal) configure the payload policy of
:func:`~effecthost.hosts.restate.file_payload_policy`; give the callers' controllers the
same directories.

SIGTERM or SIGINT stop it within ``--grace`` seconds (:data:`DEFAULT_GRACE`): the
listener closes at once, invocations still running after the grace are cut off, and
Restate re-invokes them on the next endpoint (from their journal), so nothing settles
twice.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from effecthost.contract import GroupExecutors
from effecthost.hosts import require
from effecthost.hosts._shutdown import DEFAULT_GRACE, Stopper


def load_resolver(spec: str, args: list[str]) -> GroupExecutors:
    module_name, _, attr = spec.partition(":")
    target: Any = getattr(importlib.import_module(module_name), attr)
    resolver = (
        target(*args) if callable(target) and not isinstance(target, GroupExecutors) else target
    )
    if not isinstance(resolver, GroupExecutors):
        raise SystemExit(f"{spec} is not a GroupExecutors resolver")
    return resolver


def fast_retries() -> Any:
    """A retry policy that notices a restarted endpoint within about a second."""
    restate = require("restate", "restate", "restate")[0]
    return restate.InvocationRetryPolicy(
        initial_interval=timedelta(milliseconds=100),
        exponentiation_factor=2.0,
        max_interval=timedelta(seconds=1),
    )


def on_stop_signals(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on SIGTERM and SIGINT.

    The SDK's app claims SIGTERM for itself on its first request (asyncio keeps one
    handler per signal), which silently replaced a handler set with
    ``loop.add_signal_handler``: register through the SDK's own hook list, which the app
    appends to, when this SDK has one.
    """
    install = getattr(importlib.import_module("restate.server"), "install_shutdown_hook", None)
    loop.add_signal_handler(signal.SIGINT, callback)
    if install is not None:
        install(loop, callback, signal.SIGTERM)
    else:
        loop.add_signal_handler(signal.SIGTERM, callback)


async def serve(app: Any, bind: str, *, grace: float = DEFAULT_GRACE) -> None:
    """Serve ``app`` (h2c) on ``bind`` until SIGTERM or SIGINT, then stop within about
    ``grace`` seconds: invocations still running then are cut off and re-invoked by
    Restate on the next endpoint. What still holds the process :data:`FORCE_AFTER`
    seconds later (a tool's thread) is left behind by ``os._exit(0)``; a
    second signal exits at once."""
    hypercorn_config, hypercorn_asyncio = require(
        "restate", "restate", "hypercorn.config", "hypercorn.asyncio"
    )
    config = hypercorn_config.Config()
    config.bind = [bind]
    config.accesslog = None
    config.graceful_timeout = grace
    stop = asyncio.Event()
    on_stop_signals(asyncio.get_running_loop(), Stopper(stop.set, grace))
    await hypercorn_asyncio.serve(app, config, shutdown_trigger=stop.wait)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m effecthost.hosts.restate.serve")
    parser.add_argument("--bind", default="127.0.0.1:9080")
    parser.add_argument("--resolver", required=True, help="MODULE:CALLABLE")
    parser.add_argument("--resolver-arg", action="append", default=[])
    parser.add_argument("--admin-url", default=None, help="lets routed children check targets")
    parser.add_argument("--fast-retries", action="store_true")
    parser.add_argument(
        "--payload-dir", default=None, help="payload store directory (enables the policy)"
    )
    parser.add_argument("--key-dir", default=None, help="key directory: seal every outcome")
    parser.add_argument("--inline-threshold", type=int, default=None)
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        help="seconds running invocations get to finish after SIGTERM/SIGINT",
    )
    options = parser.parse_args(argv)
    if options.payload_dir is None and (
        options.key_dir is not None or options.inline_threshold is not None
    ):
        parser.error("--key-dir and --inline-threshold need --payload-dir")
    from ._deploy import validate_services
    from ._endpoint import build_services
    from ._policy import file_payload_policy

    payloads = None
    if options.payload_dir is not None:
        threshold: dict[str, int] = {}
        if options.inline_threshold is not None:
            threshold["inline_threshold"] = options.inline_threshold
        payloads = file_payload_policy(options.payload_dir, options.key_dir, **threshold)
    restate = require("restate", "restate", "restate")[0]
    services = build_services(
        load_resolver(options.resolver, options.resolver_arg),
        admin_url=options.admin_url,
        retry_policy=fast_retries() if options.fast_retries else None,
        payloads=payloads,
    )
    validate_services(services)
    asyncio.run(serve(restate.app(services), options.bind, grace=options.grace))
