"""What both Restate controllers share: every group operation is a call to the group
virtual object; only the transport differs (ingress from outside, a journaled call from
inside a handler)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from effecthost import telemetry
from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    EffectGroup,
    EffectHostError,
    GroupClosed,
    GroupHandle,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    Outcome,
    PayloadMissing,
    ReplayMismatch,
    Settlement,
    UnknownGroup,
    WiredController,
    coerce_disposition,
    group_shape_error,
    kit,
    limits,
    require_group,
    require_handle,
    sleep_durations,
)
from effecthost.payloads import PayloadPolicy, decode_outcome, event_value

_ERRORS: dict[str, type[EffectHostError]] = {
    "group_closed": GroupClosed,
    "unknown_group": UnknownGroup,
    "group_shape_mismatch": GroupShapeMismatch,
    "replay_mismatch": ReplayMismatch,
    "handle_mismatch": HandleMismatch,
    "cursor_exhausted": CursorExhausted,
    "disposition_widened": DispositionWidened,
    "payload_missing": PayloadMissing,
}


def _raise_refusal(answer: Any) -> None:
    """Turn a typed refusal returned by a handler into the contract's error."""
    if isinstance(answer, dict) and "error" in answer:
        cls = _ERRORS.get(answer["error"], EffectHostError)
        if cls is EffectHostError:
            raise RuntimeError(f"unexpected refusal from the group object: {answer}")
        raise cls(
            str(answer.get("message", answer["error"])),
            group_key=answer.get("group_key"),
            replay_key=answer.get("replay_key"),
            position=answer.get("position"),
            rank=answer.get("rank"),
        )


async def _settlement(
    answer: dict[str, Any], group_key: str, rank: int, payloads: PayloadPolicy | None
) -> Settlement:
    """The settlement of an ``await_rank`` answer; a stored form is decoded with
    ``payloads`` (which changes nothing: the caller advances its handle only after).

    Raises:
        SealedPayloadUnreadable, PayloadShredded, PayloadMissing: see
            :func:`~effecthost.payloads.decode_outcome`.
    """
    replay_key = answer["replay_key"]
    position = answer["position"]
    if "stored" in answer:
        outcome = await decode_outcome(
            payloads, group_key, replay_key, answer["stored"], position=position, rank=rank
        )
    elif payloads is not None:  # a plain record under a policy: shape-guarded, and
        # refused where the policy seals (unless it accepts plaintext)
        outcome = await decode_outcome(
            payloads, group_key, replay_key, answer["outcome"], position=position, rank=rank
        )
    else:
        outcome = Outcome.model_validate(answer["outcome"])
    return Settlement(rank=rank, position=position, replay_key=replay_key, outcome=outcome)


def _handle_doc(handle: GroupHandle) -> dict[str, Any]:
    return {
        "child_count": handle.child_count,
        "wake": handle.wake.value,
        "disposition": handle.disposition.value,
    }


class GroupObjectClient(WiredController):
    """The contract's group methods over the group object's handlers (G-38, G-39, G-41).

    Subclasses give the transport (:meth:`_call`) and who is opening (:meth:`_incarnation`).
    """

    owner: str
    payloads: PayloadPolicy | None
    _read_ahead: dict[tuple[Any, int], dict[str, Any]]

    @abstractmethod
    async def _call(self, group_key: str, handler: str, body: Any = None) -> Any:
        """Call ``handler`` of the group object keyed ``group_key``; its JSON answer."""

    @abstractmethod
    def _incarnation(self) -> str:
        """This opener's incarnation, recorded with the group for the drain (G-29)."""

    async def _open(self, group: EffectGroup, targets: dict[int, str]) -> GroupHandle:
        """First open resolves every child here before anything is recorded (G-10); a
        reopen passes a miss through; the object fences the shape (G-13)."""
        self._require_wired(group.key)
        sleep_durations(group)  # a malformed sleep refuses the open before it is recorded
        miss = self._first_unresolvable(group, skip=lambda position, _child: position in targets)
        if miss is not None:
            described = await self._call(group.key, "describe")
            if not described.get("recorded") and not described.get("closed"):
                keys = [child.replay_key for child in group.children]
                _raise_refusal(await self._call(group.key, "claims", {"replay_keys": keys}))
                raise group_shape_error(group, *miss)
        body = {
            "child_count": group.child_count,
            "wake": group.wake.value,
            "disposition": group.disposition.value,
            "children": [child.model_dump(mode="json") for child in group.children],
            "hashes": [child.envelope_hash() for child in group.children],
            "targets": {str(p): t for p, t in targets.items()},
            "owner": self.owner,
            "incarnation": self._incarnation(),
            "collect": True,  # an ALL group may be collected (the endpoint's ``collect``)
            **self._first_waiter(group),
        }
        trace = telemetry.carrier()
        if trace:
            body["trace"] = trace  # the children's spans join the caller's trace (issue 23)
        answer = await self._call(group.key, "open", body)
        self._opened(group, body, answer)
        _raise_refusal(answer)
        return group.handle()

    def _first_waiter(self, group: EffectGroup) -> dict[str, Any]:
        """Extra fields of the open's request (a caller parking its first read there)."""
        return {}

    def _opened(self, group: EffectGroup, body: dict[str, Any], answer: dict[str, Any]) -> None:
        """The open of ``body`` was answered ``answer`` (perhaps a refusal)."""

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        return await self._open(require_group(group), {})

    async def _read_rank(self, handle: GroupHandle, rank: int) -> Any:
        """The group object's answer for rank ``rank`` of ``handle``: a record (with the
        recorded ranks after it as ``more``) or a refusal."""
        return await self._call(
            handle.group_key, "await_rank", {**_handle_doc(handle), "rank": rank}
        )

    async def await_next_settlement(self, handle: GroupHandle) -> Settlement:
        """Rank ``consumed + 1``. One read answers with every recorded rank from there
        (up to a batch); the ranks after the one asked for are kept here, per handle
        shape, and served to the next awaits without a call: a rank is a durable fact
        (G-15), and this is a read cache, not a cursor (G-18: awaiting a rank again after
        it was served reads it from the object again). A close through this controller
        drops the group's entries, so a later await is ``GroupClosed`` (R-4)."""
        self._require_wired(require_handle(handle).group_key)
        rank = handle.consumed + 1
        shape = (handle.group_key, handle.child_count, handle.wake, handle.disposition)
        cache = self._ahead()
        answer = cache.pop((shape, rank), None) if rank <= handle.child_count else None
        if answer is None:
            answer = await self._read_rank(handle, rank)
            _raise_refusal(answer)
            for extra in answer.get("more") or []:
                if int(extra["rank"]) <= handle.child_count:
                    cache[(shape, int(extra["rank"]))] = extra
        settlement = await _settlement(answer, handle.group_key, rank, self.payloads)
        handle.consumed = rank
        return settlement

    def _ahead(self) -> dict[tuple[Any, int], dict[str, Any]]:
        if not hasattr(self, "_read_ahead"):
            self._read_ahead = {}
        return self._read_ahead

    def _forget(self, group_key: str) -> None:
        ahead = self._ahead()
        for entry in [entry for entry in ahead if entry[0][0] == group_key]:
            del ahead[entry]

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        disposition = coerce_disposition(require_handle(handle).group_key, disposition)
        self._require_wired(handle.group_key)
        self._forget(handle.group_key)
        body = {**_handle_doc(handle), "close_with": disposition.value if disposition else None}
        _raise_refusal(await self._call(handle.group_key, "close", body))

    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(limits.check_key(group_key, what="the group key of settlement_order"))
        described = await self._call(group_key, "describe")
        if not described.get("recorded"):
            raise kit.unknown_group(group_key)
        return list(described["order"])

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self._require_wired(group_key)
        answer = await self._call(
            group_key, "deliver", {"name": name, "payload": event_value(group_key, name, payload)}
        )
        _raise_refusal(answer)
        return int(answer["reached"])
