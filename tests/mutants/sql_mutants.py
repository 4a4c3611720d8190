"""Broken SQL hosts for the mutant catalog, loaded by the SQLite deployment process
(``host_class="sql_mutants:…"``, see ``catalog.sql_mutant``). Each breaks one rule whose
check needs the SQL host's own machinery or a real restart (SIGKILL of the deployment
process). Imported under pytest, this module also registers them in the catalog."""

from __future__ import annotations

import sys
from typing import Any

from effecthost.contract import DrainReport, EffectGroup, Outcome, group_shape_error
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
        "ReopenRefusesAMissSqlHost",
        "G-11",
        ReopenRefusesAMissSqlHost.__doc__ or "",
        select="G-11",
    )


_register()
