"""The controller for callers outside Restate: the group object over ingress (httpx)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    EffectHostError,
    GroupClosed,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    NoExecutor,
    Outcome,
    PayloadMissing,
    ReplayMismatch,
    Settlement,
    UnknownGroup,
    WiredController,
    group_shape_error,
    is_host_kind,
    normalize_json,
)
from effecthost.hosts import require
from effecthost.payloads import PayloadPolicy, StoredOutcome, decode_outcome

from ._wire import GROUP

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
    if "stored" in answer:
        stored = _stored_or_none(answer["stored"])
        if stored is None:  # raised outside any handler: nothing quotes the record
            raise PayloadMissing(
                f"rank {rank} of group {group_key!r} ({replay_key!r}) is not a stored outcome",
                group_key=group_key,
                replay_key=replay_key,
                rank=rank,
            )
        outcome = await decode_outcome(payloads, group_key, replay_key, stored, rank=rank)
    else:
        outcome = Outcome.model_validate(answer["outcome"])
    return Settlement(
        rank=rank, position=answer["position"], replay_key=replay_key, outcome=outcome
    )


def _stored_or_none(value: Any) -> StoredOutcome | None:
    try:
        return StoredOutcome.model_validate(value)
    except ValueError:  # pydantic's ValidationError quotes its input: never let it out
        return None


def _handle_doc(handle: GroupHandle) -> dict[str, Any]:
    return {
        "child_count": handle.child_count,
        "wake": handle.wake.value,
        "disposition": handle.disposition.value,
    }


class RestateController(WiredController):
    """An :class:`EffectController` talking to a Restate deployment of this tier through
    ingress, for callers outside Restate (a web process, a script, a test).

    ``supports_effect_groups()`` is true iff a resolver is registered: register the same
    resolver as the endpoint, so a first open resolves every child here before anything
    is recorded (G-10). ``owner`` names this caller for the drain (G-29): a drain applies a
    declared ``CANCEL`` to groups that an earlier incarnation of the same owner opened.
    """

    def __init__(
        self,
        ingress_url: str,
        admin_url: str,
        resolver: GroupExecutors | None = None,
        *,
        owner: str = "default",
        request_timeout: float = 30.0,
        payloads: PayloadPolicy | None = None,
    ) -> None:
        (httpx,) = require("restate", "restate", "httpx")
        self._ingress = ingress_url.rstrip("/")
        self._admin = admin_url.rstrip("/")
        self._resolver = resolver
        self.owner = owner
        self.incarnation = uuid.uuid4().hex
        self._timeout = request_timeout
        self.payloads = payloads
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(request_timeout, read=None))

    # -- wiring -------------------------------------------------------------------------

    def supports_concurrent_effects(self) -> bool:
        return True

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- transport ----------------------------------------------------------------------

    async def _call(self, group_key: str, handler: str, body: Any = None) -> Any:
        url = f"{self._ingress}/{GROUP}/{quote(group_key, safe='')}/{handler}"
        response = await self._client.post(url, json=body)
        response.raise_for_status()
        return response.json() if response.content else None

    async def query(self, sql: str) -> list[dict[str, Any]]:
        """Run ``sql`` on the admin introspection API."""
        response = await self._client.post(
            f"{self._admin}/query", json={"query": sql}, headers={"Accept": "application/json"}
        )
        response.raise_for_status()
        rows: list[dict[str, Any]] = response.json().get("rows", [])
        return rows

    # -- open ---------------------------------------------------------------------------

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        return await self.open_routed(group, {})

    async def open_routed(self, group: EffectGroup, targets: dict[int, str]) -> GroupHandle:
        """Open ``group`` with some children addressed to ``Service/handler`` targets of
        their own instead of the child service (their input is the envelope's input)."""
        self._require_wired(group.key)
        miss = self._first_unresolvable(group, skip=lambda position, _child: position in targets)
        if miss is not None:
            described = await self._call(group.key, "describe")
            if not described.get("recorded") and not described.get("closed"):
                raise group_shape_error(group, *miss)
        body = {
            "child_count": group.child_count,
            "wake": group.wake.value,
            "disposition": group.disposition.value,
            "children": [child.model_dump(mode="json") for child in group.children],
            "hashes": [child.envelope_hash() for child in group.children],
            "targets": {str(p): t for p, t in targets.items()},
            "owner": self.owner,
            "incarnation": self.incarnation,
        }
        _raise_refusal(await self._call(group.key, "open", body))
        return group.handle()

    # -- consume ------------------------------------------------------------------------

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

    async def settlement_order(self, group_key: str) -> list[int]:
        self._require_wired(group_key)
        described = await self._call(group_key, "describe")
        if not described.get("recorded"):
            raise UnknownGroup(
                f"no open group is recorded under {group_key!r}", group_key=group_key
            )
        return list(described["order"])

    async def open_group_keys(self) -> list[str]:
        rows = await self.query(
            f"SELECT service_key FROM state WHERE service_name = '{GROUP}' AND key = 'shape'"
        )
        return sorted({row["service_key"] for row in rows})

    # -- close --------------------------------------------------------------------------

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        self._require_wired(handle.group_key)
        body = {**_handle_doc(handle), "close_with": disposition.value if disposition else None}
        _raise_refusal(await self._call(handle.group_key, "close", body))

    # -- events -------------------------------------------------------------------------

    async def deliver_event(self, group_key: str, name: str, payload: Any = None) -> int:
        self._require_wired(group_key)
        value = normalize_json(payload)
        answer = await self._call(group_key, "deliver", {"name": name, "payload": value})
        _raise_refusal(answer)
        return int(answer["reached"])

    # -- drain --------------------------------------------------------------------------

    def drain(self) -> GroupDrain:
        return _RestateDrain(self)


class _RestateDrain(GroupDrain):
    """The engine owns loser completion (retries, durable timers). A pass applies a
    declared ``CANCEL`` to groups an earlier incarnation of this owner opened (G-29),
    and reports children this process cannot resolve as ``NoExecutor`` (G-11, G-12)."""

    def __init__(self, controller: RestateController) -> None:
        self._ctl = controller

    async def run_pass(self) -> DrainReport:
        ctl = self._ctl
        cancelled: list[tuple[str, str]] = []
        missing: list[NoExecutor] = []
        for key in await ctl.open_group_keys():
            if ctl._resolver is not None:
                answer = await ctl._call(
                    key, "drain", {"owner": ctl.owner, "incarnation": ctl.incarnation}
                )
                done = set(answer.get("cancelled", []))
                cancelled.extend((key, rk) for rk in sorted(done))
            else:
                done = set()
            described = await ctl._call(key, "describe")
            for raw in described.get("unsettled", []):
                envelope = EffectEnvelope.model_validate(raw)
                if envelope.replay_key in done:
                    continue
                why = None
                if ctl._resolver is None:
                    why = "no resolver is registered"
                elif not is_host_kind(envelope) and ctl._resolver.resolve(envelope) is None:
                    why = "the resolver returned None"
                if why is not None:
                    position = envelope.membership.position if envelope.membership else None
                    missing.append(
                        NoExecutor(
                            f"child {envelope.replay_key!r} at position {position} of group "
                            f"{key!r} cannot run here: {why}",
                            group_key=key,
                            replay_key=envelope.replay_key,
                            position=position,
                        )
                    )
        return DrainReport(cancelled=tuple(cancelled), no_executor=tuple(missing))
