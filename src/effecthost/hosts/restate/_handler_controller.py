"""The controller for code running inside a Restate handler: the caller is an invocation,
every call to the group object is a journaled call, so a replay sees the same answers."""

from __future__ import annotations

import json
from typing import Any

from effecthost.contract import (
    GroupExecutors,
    GroupHandle,
    canonical_json,
    kit,
)
from effecthost.payloads import PayloadPolicy

from ._client import GroupObjectClient, _handle_doc
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

    async def _read_rank(self, handle: GroupHandle, rank: int) -> Any:
        """Wait in this invocation: one awakeable, answered by the object's exclusive
        ``register_waiter`` (fenced on the handle, R-2) at once with the recorded ranks or
        later by ``settle`` (G-39: the object's lock is held only for that step). A rank
        whose outcome lives in the payload object is read through ``await_rank``."""
        ctx = self._ctx
        aid, answered = ctx.awakeable(type_hint=dict)
        body = {"rank": rank, "awakeable": aid, "claim": _handle_doc(handle)}
        ctx.generic_send(GROUP, "register_waiter", canonical_json(body), key=handle.group_key)
        signal: dict[str, Any] = await answered
        if "error" in signal:
            return signal
        if signal.get("closed"):
            raise kit.group_closed(handle.group_key)
        record = signal["record"]
        if "ref" in record:
            return await super()._read_rank(handle, rank)
        return {"rank": rank, **record, "more": signal.get("more") or []}

    def _incarnation(self) -> str:
        return str(self._ctx.request().id)
