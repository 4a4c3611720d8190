"""Read-only inspection of a Restate deployment of this tier through the admin SQL API
(``POST /query`` over ``state`` and ``sys_invocation``): no invocation is made, no state
is written. Ages and settlement times come from ``sys_invocation``, so they read ``None``
once the server has dropped the completed invocations (its retention, a day by default).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from effecthost._inspect import (
    ChildRow,
    GroupRow,
    TierUnreachable,
    UnknownGroupKey,
    in_rank_order,
    open_group,
    running_child,
    settled_child,
)
from effecthost.hosts import require

from ._nodes import Nodes, _Unreachable, url_list
from ._wire import CHILD, GROUP, idempotency_key

_GROUP_KEYS = "('shape', 'counter')"


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _epoch(stamp: Any) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


class RestateInspector:
    """Open groups and their ranks, read from the admin API at ``admin_url`` (one URL,
    or the admin URLs of a cluster's nodes: a query fails over to the next node and is
    retried while partition leadership moves, for up to ``timeout`` seconds)."""

    def __init__(self, admin_url: str | Sequence[str], *, timeout: float = 10.0) -> None:
        (httpx,) = require("restate", "restate", "httpx")
        self.admin_urls = url_list(admin_url, "admin API")
        self._admin = self.admin_urls[0]
        self._timeout = timeout
        self._http = httpx.AsyncClient(timeout=timeout)
        self._nodes = Nodes(self.admin_urls, self._http, (httpx.TransportError,))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _query(self, sql: str) -> list[dict[str, Any]]:
        where = ", ".join(self.admin_urls)
        try:
            response = await self._nodes.request(
                "POST",
                "/query",
                json={"query": sql},
                headers={"Accept": "application/json"},
                bound=self._timeout,
            )
        except _Unreachable as exc:
            raise TierUnreachable(f"Restate admin API {where}: {exc}") from None
        if response.status_code >= 300:
            raise TierUnreachable(
                f"Restate admin API {where}: HTTP {response.status_code} {response.text[:200]}"
            )
        rows: list[dict[str, Any]] = response.json().get("rows", [])
        return rows

    async def _opened_at(self, keys: list[str] | None = None) -> dict[str, float]:
        where = (
            "" if keys is None else f" AND target_service_key IN ({', '.join(map(_text, keys))})"
        )
        rows = await self._query(
            "SELECT target_service_key AS k, min(created_at) AS at FROM sys_invocation "
            f"WHERE target_service_name = {_text(GROUP)} AND target_handler_name = 'open'"
            f"{where} GROUP BY target_service_key"
        )
        return {r["k"]: at for r in rows if (at := _epoch(r["at"])) is not None}

    async def groups(self) -> list[GroupRow]:
        rows = await self._query(
            "SELECT service_key, key, value_utf8 FROM state "
            f"WHERE service_name = {_text(GROUP)} AND key IN {_GROUP_KEYS}"
        )
        state: dict[str, dict[str, Any]] = {}
        for row in rows:
            state.setdefault(row["service_key"], {})[row["key"]] = json.loads(row["value_utf8"])
        opened = await self._opened_at() if state else {}
        return [
            _group(key, found, opened.get(key))
            for key, found in sorted(state.items())
            if "shape" in found
        ]

    async def _by_idempotency_key(self, state: dict[str, Any], known: set[str]) -> dict[str, str]:
        """The invocation ids of the children whose group keeps none (it declared
        ``RUN_TO_COMPLETION``), found by their idempotency keys (G-37)."""
        epoch = (state.get("shape") or {}).get("epoch")
        wanted: dict[str, str] = {}
        for position, entry in enumerate(state.get("children") or []):
            envelope = entry["envelope"]
            rk = envelope["replay_key"]
            if epoch and rk not in known:
                wanted[idempotency_key(envelope["name"], position, rk, epoch)] = rk
        if not wanted:
            return {}
        found = await self._query(
            "SELECT id, idempotency_key FROM sys_invocation WHERE target_service_name = "
            f"{_text(CHILD)} AND idempotency_key IN ({', '.join(map(_text, wanted))})"
        )
        return {
            wanted[r["idempotency_key"]]: r["id"]
            for r in found
            if r.get("idempotency_key") in wanted
        }

    async def group(self, group_key: str) -> tuple[GroupRow, list[ChildRow]]:
        rows = await self._query(
            "SELECT key, value_utf8 FROM state "
            f"WHERE service_name = {_text(GROUP)} AND service_key = {_text(group_key)}"
        )
        state = {row["key"]: json.loads(row["value_utf8"]) for row in rows}
        if "shape" not in state:
            raise UnknownGroupKey(group_key)
        opened = await self._opened_at([group_key])
        ranks: dict[str, tuple[int, dict[str, Any]]] = {}
        for name, value in state.items():
            if name.startswith("rank:"):
                ranks[value["replay_key"]] = (int(name[len("rank:") :]), value)
        invocations = {
            name[len("inv:") :]: value
            for name, value in state.items()
            if name.startswith("inv:") and isinstance(value, str)
        }
        listed = state.get("invs") or []  # position order (``inv:{rk}`` before it)
        for entry, invocation in zip(state.get("children") or [], listed, strict=False):
            invocations[entry["envelope"]["replay_key"]] = invocation
        invocations.update(await self._by_idempotency_key(state, set(invocations)))
        created: dict[str, float] = {}
        completed: dict[str, float] = {}
        if invocations:
            found = await self._query(
                "SELECT id, created_at, completed_at FROM sys_invocation WHERE id IN "
                f"({', '.join(map(_text, invocations.values()))})"
            )
            created = {r["id"]: at for r in found if (at := _epoch(r.get("created_at")))}
            completed = {r["id"]: at for r in found if (at := _epoch(r.get("completed_at")))}
        children: list[ChildRow] = []
        for position, entry in enumerate(state.get("children") or []):
            name, rk = entry["envelope"]["name"], entry["envelope"]["replay_key"]
            begun = created.get(invocations.get(rk, ""))
            if rk not in ranks:
                children.append(running_child(position, rk, name, begun))
                continue
            rank, record = ranks[rk]
            # the outcome, its stored form, or else an unsealed outcome in the payload object
            recorded = record.get("outcome", record.get("stored", {"form": "ref", "sealed": False}))
            at = completed.get(invocations.get(rk, ""))
            children.append(settled_child(rank, position, rk, name, recorded, at, begun))
        return _group(group_key, state, opened.get(group_key)), in_rank_order(children)


def _group(key: str, state: dict[str, Any], opened_at: float | None) -> GroupRow:
    shape = state["shape"]
    return open_group(
        key,
        opened_at,
        shape["wake"],
        shape["effective"],
        int(state.get("counter") or 0),
        int(shape["child_count"]),
        shape.get("owner"),
    )
