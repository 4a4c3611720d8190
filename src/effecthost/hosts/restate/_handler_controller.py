"""The controller for code running inside a Restate handler: the caller is an invocation,
every call to the group object is a journaled call, so a replay sees the same answers."""

from __future__ import annotations

import json
from typing import Any

from effecthost.contract import (
    GroupExecutors,
    canonical_json,
)
from effecthost.payloads import PayloadPolicy

from ._client import GroupObjectClient
from ._wire import GROUP


class HandlerController(GroupObjectClient):
    """An :class:`EffectController` over a handler's ``ctx``.

    ``await_next_settlement`` calls the group object's shared ``await_rank`` handler: it
    reads rank ``consumed + 1`` first and otherwise parks on an awakeable that the
    object's exclusive ``settle`` resolves, so the wait never holds the object's lock
    (G-39); the caller invocation suspends meanwhile. Do not use it from a handler of the
    group object itself. The resolver must be the endpoint's (G-10).

    ``payloads``: the endpoint's payload policy. The stored form is decoded after the
    journaled call, locally, on every replay: the plaintext of a sealed outcome is never
    journaled in the caller's invocation.
    """

    def __init__(
        self,
        ctx: Any,
        resolver: GroupExecutors | None,
        *,
        owner: str = "handler",
        payloads: PayloadPolicy | None = None,
    ) -> None:
        self._ctx = ctx
        self.payloads = payloads
        self._resolver = resolver
        self.owner = owner

    async def _call(self, group_key: str, handler: str, body: Any = None) -> Any:
        raw = await self._ctx.generic_call(GROUP, handler, canonical_json(body), key=group_key)
        return json.loads(raw) if raw else None

    def _incarnation(self) -> str:
        return str(self._ctx.request().id)
