"""The controller for code running inside a Restate handler: the caller is an invocation,
every call to the group object is a journaled call, so a replay sees the same answers."""

from __future__ import annotations

import json
from typing import Any

from effecthost.contract import (
    EffectGroup,
    GroupExecutors,
    GroupHandle,
    LoserPolicy,
    Settlement,
    UnknownGroup,
    WiredController,
    canonical_json,
    group_shape_error,
    normalize_json,
)
from effecthost.payloads import PayloadPolicy

from ._controller import _handle_doc, _raise_refusal, _settlement
from ._wire import GROUP


class HandlerController(WiredController):
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

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self._require_wired(group.key)
        miss = self._first_unresolvable(group)
        if miss is not None:
            described = await self._call(group.key, "describe")
            if not (described.get("recorded") or described.get("closed")):
                raise group_shape_error(group, *miss)
        body = {
            "child_count": group.child_count,
            "wake": group.wake.value,
            "disposition": group.disposition.value,
            "children": [child.model_dump(mode="json") for child in group.children],
            "hashes": [child.envelope_hash() for child in group.children],
            "targets": {},
            "owner": self.owner,
            "incarnation": self._ctx.request().id,
        }
        _raise_refusal(await self._call(group.key, "open", body))
        return group.handle()

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        self._require_wired(handle.group_key)
        rank = handle.consumed + 1
        answer = await self._call(
            handle.group_key, "await_rank", {**_handle_doc(handle), "rank": rank}
        )
        _raise_refusal(answer)
        settlement = await _settlement(answer, handle.group_key, rank, self.payloads)
        handle.consumed = rank
        return settlement

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        self._require_wired(handle.group_key)
        body = {**_handle_doc(handle), "close_with": disposition.value if disposition else None}
        _raise_refusal(await self._call(handle.group_key, "close", body))

    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(group_key)
        described = await self._call(group_key, "describe")
        if not described.get("recorded"):
            raise UnknownGroup(
                f"no open group is recorded under {group_key!r}", group_key=group_key
            )
        return list(described["order"])

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self._require_wired(group_key)
        answer = await self._call(
            group_key, "deliver", {"name": name, "payload": normalize_json(payload)}
        )
        _raise_refusal(answer)
        return int(answer["reached"])
