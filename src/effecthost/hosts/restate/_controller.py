"""The controller for callers outside Restate: the group object over ingress (httpx)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from effecthost.contract import (
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    GroupDrain,
    GroupExecutors,
    GroupHandle,
    NoExecutor,
    is_host_kind,
    kit,
)
from effecthost.hosts import require
from effecthost.payloads import PayloadPolicy

from ._client import GroupObjectClient
from ._wire import GROUP


class RestateController(GroupObjectClient):
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

    def _incarnation(self) -> str:
        return self.incarnation

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

    # -- groups (the rest is GroupObjectClient's) ---------------------------------------

    async def open_routed(self, group: EffectGroup, targets: dict[int, str]) -> GroupHandle:
        """Open ``group`` with some children addressed to ``Service/handler`` targets of
        their own instead of the child service (their input is the envelope's input)."""
        return await self._open(group, targets)

    async def open_group_keys(self) -> list[str]:
        rows = await self.query(
            f"SELECT service_key FROM state WHERE service_name = '{GROUP}' AND key = 'shape'"
        )
        return sorted({row["service_key"] for row in rows})

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
                    why = kit.NO_RESOLVER
                elif not is_host_kind(envelope) and ctl._resolver.resolve(envelope) is None:
                    why = kit.RESOLVER_MISS
                if why is not None:
                    assert envelope.membership is not None  # a recorded child of the group
                    position = envelope.membership.position
                    missing.append(kit.no_executor(key, envelope.replay_key, position, why))
        return DrainReport(cancelled=tuple(cancelled), no_executor=tuple(missing))
