"""Conformance factories that go wrong every way an operator's can, for
``effecthost conformance`` run in a subprocess (this directory on ``PYTHONPATH``)."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any


def raises(env: Any) -> Any:
    raise RuntimeError("the factory broke\nsecond line")


async def raises_async(env: Any) -> Any:
    raise KeyError("missing")


def returns_none(env: Any) -> Any:
    return None


def returns_int(env: Any) -> Any:
    return 7


def returns_str(env: Any) -> Any:
    return "a host"


def returns_dict(env: Any) -> Any:
    return {"host": 1}


async def returns_none_async(env: Any) -> Any:
    return None


def exits(env: Any) -> Any:
    sys.exit(7)


async def hangs(env: Any) -> Any:
    await asyncio.Event().wait()


def blocks(env: Any) -> Any:
    threading.Event().wait()  # blocks its thread for good


not_callable = 42
