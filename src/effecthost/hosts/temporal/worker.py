"""Run a group worker: ``python -m effecthost.hosts.temporal.worker``.

    python -m effecthost.hosts.temporal.worker --address HOST:PORT --task-queue Q \\
        --resolver mypackage.tools:registry [--resolver-arg ARG ...] \\
        [--payload-dir DIR] [--key-dir DIR] [--inline-threshold BYTES]

``--payload-dir`` stores outcomes above the inline threshold by reference in a
``FilesystemPayloadStore`` (callers must read the same directory); ``--key-dir`` seals
outcomes and every payload in history with the keys of a ``FileKeyStore`` (callers must
use the same keys). ``--resolver`` names a ``GroupExecutors`` object, or a callable returning one (called
with the ``--resolver-arg`` values). The process prints ``ready`` once it polls, and
runs until SIGTERM or SIGINT: then it stops polling, gives running children ``--grace``
seconds (default 5) to finish, cancels the rest (Temporal retries them on another
worker) and exits 0; something a cancel cannot stop (a tool's thread) is left behind
2 s later, and a second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from typing import Any

from effecthost.contract import GroupExecutors
from effecthost.hosts import require
from effecthost.hosts._shutdown import DEFAULT_GRACE, add_grace_option
from effecthost.payloads import (
    DEFAULT_INLINE_THRESHOLD,
    AesGcmSealer,
    FileKeyStore,
    FilesystemPayloadStore,
    KeyStore,
    PayloadPolicy,
)

require("temporal", "temporal", "temporalio")

from temporalio.client import Client  # noqa: E402

from ._exit import release_temporal_runtime  # noqa: E402
from ._worker import run_worker  # noqa: E402


def load_resolver(spec: str, args: list[str]) -> GroupExecutors:
    """``"module:attr"`` → a resolver (the object, or what calling it returns)."""
    module_name, _, attribute = spec.partition(":")
    target: Any = getattr(importlib.import_module(module_name), attribute)
    resolver = target if isinstance(target, GroupExecutors) else target(*args)
    if not isinstance(resolver, GroupExecutors):
        raise SystemExit(f"{spec} is not a GroupExecutors resolver")
    return resolver


def payload_settings(
    payload_dir: str | None, key_dir: str | None, inline_threshold: int
) -> tuple[PayloadPolicy | None, KeyStore | None]:
    """The policy and key store the command-line options describe."""
    keys = FileKeyStore(key_dir) if key_dir else None
    if payload_dir is None and keys is None:
        return None, None
    return (
        PayloadPolicy(
            store=FilesystemPayloadStore(payload_dir) if payload_dir else None,
            inline_threshold=inline_threshold,
            sealer=AesGcmSealer(keys) if keys is not None else None,
        ),
        keys,
    )


async def serve(
    address: str,
    namespace: str,
    task_queue: str,
    resolver: GroupExecutors,
    payloads: PayloadPolicy | None = None,
    keys: KeyStore | None = None,
    grace: float = DEFAULT_GRACE,
) -> None:
    client = await Client.connect(address, namespace=namespace)
    await run_worker(
        client,
        task_queue,
        resolver,
        grace=grace,
        on_ready=lambda: print("ready", flush=True),
        payloads=payloads,
        keys=keys,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m effecthost.hosts.temporal.worker")
    parser.add_argument("--address", default="localhost:7233")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--resolver", required=True, help="MODULE:ATTR")
    parser.add_argument("--resolver-arg", action="append", default=[])
    parser.add_argument("--payload-dir", help="a FilesystemPayloadStore directory")
    parser.add_argument("--key-dir", help="a FileKeyStore directory (sealing and codec)")
    parser.add_argument("--inline-threshold", type=int, default=DEFAULT_INLINE_THRESHOLD)
    add_grace_option(parser, "running children")
    ns = parser.parse_args(argv)
    resolver = load_resolver(ns.resolver, ns.resolver_arg)
    payloads, keys = payload_settings(ns.payload_dir, ns.key_dir, ns.inline_threshold)
    asyncio.run(serve(ns.address, ns.namespace, ns.task_queue, resolver, payloads, keys, ns.grace))
    release_temporal_runtime()


if __name__ == "__main__":
    main(sys.argv[1:])
