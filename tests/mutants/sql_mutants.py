"""Broken SQL hosts for the mutant catalog, loaded by the SQLite deployment process
(``host_class="sql_mutants:…"``, see ``catalog.sql_mutant``). Each breaks one rule whose
check needs the SQL host's own machinery or a real restart (SIGKILL of the deployment
process). Imported under pytest, this module also registers them in the catalog."""

from __future__ import annotations

import sys
from typing import Any

from effecthost.contract import DrainReport, EffectGroup, EffectKind, Outcome, group_shape_error
from effecthost.hosts.sql import SqlEffectHost
from effecthost.hosts.sql._host import SqlDrain


class _CancellingDrain(SqlDrain):
    async def run_pass(self) -> DrainReport:
        host = self.host
        await host._ready()
        for row in await host.store.unfinished():
            if row.lease_expired and row.replay_key not in host._drivers:
                await host._settle_free(
                    row.group_key, row.replay_key, row.position, Outcome.cancelled()
                )
        return await super().run_pass()


class CancellingDrainSqlHost(SqlEffectHost):
    """G-28: the drain settles every orphaned child as cancelled, whatever the group
    declares, so a ``RUN_TO_COMPLETION`` loser of a gone caller never runs again."""

    def drain(self) -> SqlDrain:
        return _CancellingDrain(self)


class _TimerFiringDrain(SqlDrain):
    async def _pass(self) -> DrainReport:
        host = self.host
        assert isinstance(host, DrainFiresOrphanedTimersSqlHost)
        await host._ready()
        rows = await host.store.unfinished()
        host._fired_timers = frozenset(r.replay_key for r in rows if r.kind == EffectKind.SLEEP)
        try:
            return await super()._pass()
        finally:
            host._fired_timers = frozenset()


class DrainFiresOrphanedTimersSqlHost(SqlEffectHost):
    """G-52 (G-29): the drain finishes an orphaned ``sleep`` of a ``CANCEL`` group as a
    fired timer (``success(null)``), not as cancelled; it still drains in position order,
    so a select's event arm is cancelled first and takes rank 1."""

    _fired_timers: frozenset[str] = frozenset()

    def drain(self) -> SqlDrain:
        return _TimerFiringDrain(self)

    async def _settle_free(
        self, group_key: str, replay_key: str, position: int, outcome: Outcome, *rest: Any
    ) -> bool:
        if replay_key in self._fired_timers and outcome.status == "cancelled":
            outcome = Outcome.success(None)
        return await super()._settle_free(group_key, replay_key, position, outcome, *rest)


class ReopenRefusesAMissSqlHost(SqlEffectHost):
    """G-11: a reopen resolves every unsettled tool call again, as a first open does, and
    refuses the reopen when the resolver misses one."""

    async def _resume_children(self, group: EffectGroup, specs: Any, rows: Any) -> None:
        for row in rows:
            if row.state != "settled" and row.kind == "tool_call":
                envelope = group.children[row.position]
                if self._resolve(envelope) is None:
                    raise group_shape_error(group, row.position, envelope)
        await super()._resume_children(group, specs, rows)


def _register() -> None:
    if "pytest" not in sys.modules:  # the deployment process: nothing to register
        return
    from catalog import sql_mutant

    sql_mutant(
        "CancellingDrainSqlHost",
        "G-28",
        CancellingDrainSqlHost.__doc__ or "",
        select="drain_finishes_losers",
    )
    sql_mutant(
        "DrainFiresOrphanedTimersSqlHost",
        "G-52",
        DrainFiresOrphanedTimersSqlHost.__doc__ or "",
        select="cancelled_select_arm",
    )
    sql_mutant(
        "ReopenRefusesAMissSqlHost",
        "G-11",
        ReopenRefusesAMissSqlHost.__doc__ or "",
        select="G-11",
    )


_register()
