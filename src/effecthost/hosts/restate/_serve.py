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
from effecthost.hosts._shutdown import DEFAULT_GRACE, Stopper, add_grace_option


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
    """A retry policy that notices a restarted endpoint within about a second. Its
    attempts are not capped at the server's default 70 (about 70 s at this interval),
    after which the server pauses an invocation until an operator resumes it: an outage
    of the endpoint longer than that would otherwise leave every await waiting forever
    (R-12)."""
    restate = require("restate", "restate", "restate")[0]
    return restate.InvocationRetryPolicy(
        initial_interval=timedelta(milliseconds=100),
        exponentiation_factor=2.0,
        max_interval=timedelta(seconds=1),
        max_attempts=1_000_000,
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


NO_REQUEST_CAP = 2**62
"""hypercorn's ``keep_alive_max_requests`` for an endpoint: in effect, no cap."""

IDLE_CONNECTION = 300.0
"""Seconds an idle HTTP/2 connection from Restate stays open (hypercorn's default is 5)."""


def endpoint_config(bind: str, *, grace: float = DEFAULT_GRACE) -> Any:
    """The hypercorn config an endpoint is served with.

    Restate sends every invocation of a deployment over one long-lived HTTP/2 connection.
    hypercorn's defaults suit browsers, not that: after ``keep_alive_max_requests`` (1,000)
    requests it sends GOAWAY and drops the replies still owed on the connection, so the
    request that crossed the cap hung until Restate noticed the dead connection (34–43 s)
    and every later call to the same object queued behind it. The cap is lifted, and an
    idle connection is kept for :data:`IDLE_CONNECTION` seconds instead of 5 so a wide
    group's bursts do not reconnect. Restate bounds what it sends on one connection itself.
    """
    hypercorn_config = require("restate", "restate", "hypercorn.config")[0]
    config = hypercorn_config.Config()
    config.bind = [bind]
    config.accesslog = None
    config.graceful_timeout = grace
    config.keep_alive_max_requests = NO_REQUEST_CAP
    config.keep_alive_timeout = IDLE_CONNECTION
    return config


async def serve_config(app: Any, config: Any, stop: asyncio.Event) -> None:
    """Serve ``app`` with ``config`` until ``stop`` is set."""
    hypercorn_asyncio = require("restate", "restate", "hypercorn.asyncio")[0]
    await hypercorn_asyncio.serve(app, config, shutdown_trigger=stop.wait)


async def serve(app: Any, bind: str, *, grace: float = DEFAULT_GRACE) -> None:
    """Serve ``app`` (h2c) on ``bind`` until SIGTERM or SIGINT, then stop within about
    ``grace`` seconds: invocations still running then are cut off and re-invoked by
    Restate on the next endpoint. What still holds the process :data:`FORCE_AFTER`
    seconds later (a tool's thread) is left behind by ``os._exit(0)``; a
    second signal exits at once."""
    stop = asyncio.Event()
    on_stop_signals(asyncio.get_running_loop(), Stopper(stop.set, grace))
    await serve_config(app, endpoint_config(bind, grace=grace), stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m effecthost.hosts.restate.serve")
    parser.add_argument("--bind", default="127.0.0.1:9080")
    parser.add_argument("--resolver", required=True, help="MODULE:CALLABLE")
    parser.add_argument("--resolver-arg", action="append", default=[])
    parser.add_argument(
        "--admin-url",
        action="append",
        default=None,
        help="the admin API (repeat for every node of a cluster): the cancel guard, "
        "routed children's target check",
    )
    parser.add_argument("--fast-retries", action="store_true")
    parser.add_argument(
        "--payload-dir", default=None, help="payload store directory (enables the policy)"
    )
    parser.add_argument("--key-dir", default=None, help="key directory: seal every outcome")
    parser.add_argument("--inline-threshold", type=int, default=None)
    add_grace_option(parser, "running invocations")
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
