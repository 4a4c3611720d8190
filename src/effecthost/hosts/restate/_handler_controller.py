"""The controller for code running inside a Restate handler: the caller is an invocation,
every call to the group object is a journaled call, so a replay sees the same answers."""

from __future__ import annotations

import json
from typing import Any

from effecthost.contract import (
    EffectGroup,
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

    def _first_waiter(self, group: EffectGroup) -> dict[str, Any]:
        """Create the awakeable of the read of rank 1 before the open: a first open parks
        it among the group's waiters, so that read costs no invocation of its own."""
        aid, answered = self._ctx.awakeable(type_hint=dict)
        self._opening()[aid] = answered
        return {"waiter": aid}

    def _opened(self, group: EffectGroup, body: dict[str, Any], answer: dict[str, Any]) -> None:
        """Keep the read of rank 1 the open parked, for a handle of this group's shape (a
        reopen, or an endpoint of an earlier release, parks nothing: the caller restores
        its own cursor)."""
        answered = self._opening().pop(body["waiter"], None)
        if answered is not None and answer.get("parked") == body["waiter"]:
            self._parked()[_shape(group.handle())] = answered

    def _opening(self) -> dict[str, Any]:
        if not hasattr(self, "_opening_reads"):
            self._opening_reads: dict[str, Any] = {}
        return self._opening_reads

    def _parked(self) -> dict[tuple[Any, ...], Any]:
        if not hasattr(self, "_parked_reads"):
            self._parked_reads: dict[tuple[Any, ...], Any] = {}
        return self._parked_reads

    def _forget(self, group_key: str) -> None:
        super()._forget(group_key)
        parked = self._parked()
        for shape in [shape for shape in parked if shape[0] == group_key]:
            del parked[shape]

    async def _read_rank(self, handle: GroupHandle, rank: int) -> Any:
        """Wait in this invocation: one awakeable, answered by the object's exclusive
        ``register_waiter`` (fenced on the handle, R-2) at once with the recorded ranks or
        later by ``settle`` (G-39: the object's lock is held only for that step). A rank
        whose outcome lives in the payload object is read through ``await_rank``.

        The read of rank 1 of a group this controller first opened waits on the
        awakeable the open parked (its handle's shape is the one the open fenced and
        recorded, so the fence of R-2 holds; a close resolves it as closed)."""
        ctx = self._ctx
        parked = self._parked().pop(_shape(handle), None) if rank == 1 else None
        if parked is not None:
            answered = parked
        else:
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


def _shape(handle: GroupHandle) -> tuple[Any, ...]:
    return (handle.group_key, handle.child_count, handle.wake, handle.disposition)
