"""The controller for callers outside Restate: the group object over ingress (httpx)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from effecthost.contract import (
    DrainReport,
    EffectEnvelope,
    EffectGroup,
    EffectGroupUnsupported,
    EngineUnavailable,
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
from ._nodes import Nodes, _Unreachable, url_list
from ._wire import GROUP, OWNER

log = logging.getLogger(__name__)

_OPERATIONS = {"deliver": "deliver_event"}
_READS = frozenset({"await_rank"})
"""Handlers whose call waits out any outage (R-12: an await never gives up on its own)."""


class RestateController(GroupObjectClient):
    """An :class:`EffectController` talking to a Restate deployment of this tier through
    ingress, for callers outside Restate (a web process, a script, a test).

    ``supports_effect_groups()`` is true iff a resolver is registered: register the same
    resolver as the endpoint, so a first open resolves every child here before anything
    is recorded (G-10). ``owner`` names this caller for the drain (G-29): a drain applies a
    declared ``CANCEL`` to groups that an earlier incarnation of the same owner opened
    and that is gone. An incarnation is live while it holds its lease in the engine (the
    owner object, R-1): taken at its first open, renewed every ``owner_ttl / 3`` seconds,
    ended by :meth:`aclose`; a killed process's lease lapses ``owner_ttl`` seconds after
    its last renewal, on the engine's timers.

    ``ingress_url`` and ``admin_url`` take one URL (a single node, or a load balancer in
    front of a cluster) or several (the nodes of a cluster). A call goes to the node that
    answered last and fails over to the next on a connection error or a 5xx (R-12). An
    await retries until it gets its rank (bound it with your own deadline); an open,
    close, ``deliver_event`` or admin query retries for ``outage_bound`` seconds,
    then raises :class:`~effecthost.contract.EngineUnavailable`. A call still unanswered
    after that long raises it too when the engine reports the group object's
    invocations as backing off (the endpoint is down); a slow call that the engine is
    still running is waited for. A retried open that had committed is a reopen, a
    retried close a no-op, and a retried ``deliver_event`` carries the same idempotency
    key, so it is applied once.
    """

    def __init__(
        self,
        ingress_url: str | Sequence[str],
        admin_url: str | Sequence[str],
        resolver: GroupExecutors | None = None,
        *,
        owner: str = "default",
        request_timeout: float = 30.0,
        payloads: PayloadPolicy | None = None,
        outage_bound: float = 30.0,
        owner_ttl: float = 30.0,
    ) -> None:
        (httpx,) = require("restate", "restate", "httpx")
        if owner_ttl <= 0:
            raise ValueError("owner_ttl must be positive")
        self.ingress_urls = url_list(ingress_url, "ingress")
        self.admin_urls = url_list(admin_url, "admin API")
        self._ingress = self.ingress_urls[0]
        self._admin = self.admin_urls[0]
        self._resolver = resolver
        self.owner = owner
        self.incarnation = uuid.uuid4().hex
        self.owner_ttl = owner_ttl
        self._lease: asyncio.Task[None] | None = None
        self._leasing = asyncio.Lock()
        self._timeout = request_timeout
        self.outage_bound = outage_bound
        self.payloads = payloads
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(request_timeout, read=None))
        errors = (httpx.TransportError,)
        self._ingress_nodes = Nodes(self.ingress_urls, self._client, errors)
        self._admin_nodes = Nodes(self.admin_urls, self._client, errors)

    # -- wiring -------------------------------------------------------------------------

    def supports_concurrent_effects(self) -> bool:
        return True

    async def aclose(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease
            with contextlib.suppress(EngineUnavailable):
                await self._owner_call("leave", None, within=5.0)  # else it lapses
        await self._client.aclose()

    # -- owner lease (R-1) --------------------------------------------------------------

    async def _owner_call(
        self,
        handler: str,
        body: Any,
        *,
        within: float,
        operation: str = "owner lease",
        group_key: str | None = None,
    ) -> None:
        """Call ``handler`` of this incarnation's owner object; give up after ``within``
        seconds (a call waits for the endpoint, which may be down: the engine keeps the
        invocation and runs it later)."""
        path = f"/{OWNER}/{self.incarnation}/{handler}"
        sending = self._ingress_nodes.request("POST", path, json=body, bound=within)
        try:
            response = await asyncio.wait_for(sending, within)
        except (TimeoutError, _Unreachable) as exc:
            raise EngineUnavailable(
                f"{handler} of the owner lease of {self.incarnation!r} got no answer from "
                f"Restate in {within:.1f}s ({exc or 'no answer'})",
                group_key=group_key,
                operation=operation,
                tried_for=within,
            ) from None
        _answered(response, f"{handler} of owner {self.incarnation!r}", group_key, operation)

    async def _hold_lease(self, group_key: str) -> None:
        """Make this incarnation live in the engine before it records itself as the
        owner of ``group_key``, and keep it live until :meth:`aclose`."""
        async with self._leasing:  # concurrent first opens take one lease
            if self._lease is not None and not self._lease.done():
                return
            beat = {"ttl": self.owner_ttl}
            await self._owner_call(
                "beat", beat, within=self.outage_bound, operation="open", group_key=group_key
            )
            self._lease = asyncio.create_task(self._keep_lease())

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.owner_ttl / 3)
            try:
                await self._owner_call("beat", {"ttl": self.owner_ttl}, within=self.owner_ttl / 3)
            except EngineUnavailable as exc:
                # tried again at the next beat; past owner_ttl a drain may take this
                # incarnation for gone, as for any lost lease
                log.warning("owner lease of %s not renewed: %s", self.incarnation, exc)

    async def live_incarnations(self) -> set[str]:
        """The incarnations whose owner lease is held right now (R-1)."""
        rows = await self.query(
            f"SELECT service_key FROM state WHERE service_name = '{OWNER}' AND key = 'beat'"
        )
        return {row["service_key"] for row in rows}

    async def _open(self, group: EffectGroup, targets: dict[int, str]) -> GroupHandle:
        self._require_wired(group.key)
        await self._hold_lease(group.key)
        return await super()._open(group, targets)

    def _incarnation(self) -> str:
        return self.incarnation

    # -- transport ----------------------------------------------------------------------

    async def _call(self, group_key: str, handler: str, body: Any = None) -> Any:
        path = f"/{GROUP}/{quote(group_key, safe='')}/{handler}"
        operation = _OPERATIONS.get(handler, handler)
        if handler in _READS:
            response = await self._ingress_nodes.request("POST", path, json=body, bound=None)
        else:
            response = await self._bounded(group_key, handler, operation, path, body)
        if response.status_code == 404:
            raise EffectGroupUnsupported(
                f"Restate ingress has no {GROUP}/{handler} (is the endpoint registered?): "
                f"{response.text[:200]}"
            )
        _answered(response, f"{operation} of group {group_key!r}", group_key, operation)
        return response.json() if response.content else None

    async def _bounded(
        self, group_key: str, handler: str, operation: str, path: str, body: Any
    ) -> Any:
        """The answer of a call that gives up after ``outage_bound`` seconds of
        failures, or of waiting while the engine retries the group object's invocations."""
        bound = self.outage_bound
        headers = {"Idempotency-Key": uuid.uuid4().hex} if handler == "deliver" else None
        loop = asyncio.get_running_loop()
        start = loop.time()
        sending = asyncio.ensure_future(
            self._ingress_nodes.request("POST", path, json=body, headers=headers, bound=bound)
        )
        why = ""
        try:
            while True:
                done, _ = await asyncio.wait({sending}, timeout=bound)
                if done:
                    return sending.result()
                why = await self._stuck(group_key)
                if why:
                    break
        except _Unreachable as exc:
            why = str(exc)
        finally:
            if not sending.done():
                sending.cancel()
            elif not sending.cancelled():
                sending.exception()  # retrieved: it may have failed while ``_stuck`` ran
        tried_for = loop.time() - start
        raise EngineUnavailable(
            f"{operation} of group {group_key!r} got no answer from Restate in "
            f"{tried_for:.1f}s ({why}); retrying it is safe",
            group_key=group_key,
            operation=operation,
            tried_for=tried_for,
        )

    async def _stuck(self, group_key: str) -> str:
        """Why a call to ``group_key`` that has not answered should give up: the engine
        retrying an invocation of the group object after failures, or an unreachable
        admin API; ``""`` while the engine is running it."""
        try:
            rows = await self.query(
                "SELECT id, status FROM sys_invocation WHERE target_service_name = "
                f"'{GROUP}' AND target_service_key = {_text(group_key)} "
                "AND status IN ('backing-off', 'paused')"
            )
        except EngineUnavailable as exc:
            return str(exc)
        if rows:
            return f"the engine retries {rows[0]['id']} ({rows[0]['status']})"
        return ""

    async def query(self, sql: str) -> list[dict[str, Any]]:
        """Run ``sql`` on the admin introspection API, failing over between the admin
        URLs and retrying while partition leadership moves (R-12).

        Raises:
            EngineUnavailable: no admin API answered for ``outage_bound`` seconds,
                or the query was refused.
        """
        try:
            response = await self._admin_nodes.request(
                "POST",
                "/query",
                json={"query": sql},
                headers={"Accept": "application/json"},
                bound=self.outage_bound,
            )
        except _Unreachable as exc:
            raise EngineUnavailable(
                f"no Restate admin API answered a query in {exc.tried_for:.1f}s ({exc})",
                operation="query",
                tried_for=exc.tried_for,
            ) from None
        if response.status_code >= 300:
            raise EngineUnavailable(
                f"the Restate admin API refused a query: HTTP {response.status_code} "
                f"{response.text[:200]!r}",
                operation="query",
            )
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


def _answered(response: Any, what: str, group_key: str | None, operation: str) -> None:
    """An ingress answer other than a success: ``EngineUnavailable`` naming ``what``."""
    if response.status_code >= 300:
        raise EngineUnavailable(
            f"Restate ingress refused {what}: HTTP {response.status_code} {response.text[:200]!r}",
            group_key=group_key,
            operation=operation,
        )


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class _RestateDrain(GroupDrain):
    """The engine owns loser completion (retries, durable timers). A pass leaves the
    groups of every other live incarnation alone (R-1), applies a declared ``CANCEL`` to
    groups an earlier incarnation of this owner opened and that is gone (G-29), and
    reports children this process cannot resolve as ``NoExecutor`` (G-11, G-12)."""

    def __init__(self, controller: RestateController) -> None:
        self._ctl = controller

    async def run_pass(self) -> DrainReport:
        ctl = self._ctl
        cancelled: list[tuple[str, str]] = []
        missing: list[NoExecutor] = []
        keys = await ctl.open_group_keys()
        live = await ctl.live_incarnations() if keys else set()
        for key in keys:
            described = await ctl._call(key, "describe")
            shape = described.get("shape") or {}
            opener = shape.get("incarnation")
            if not described.get("closed") and opener != ctl.incarnation and opener in live:
                continue  # another live incarnation's group, its timers and waits too
            done: set[str] = set()
            if ctl._resolver is not None and opener != ctl.incarnation:
                answer = await ctl._call(
                    key,
                    "drain",
                    {"owner": ctl.owner, "incarnation": ctl.incarnation, "gone": opener},
                )
                done = set(answer.get("cancelled", []))
                cancelled.extend((key, rk) for rk in sorted(done))
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
