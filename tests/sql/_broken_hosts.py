"""Deliberately broken SQL hosts, loaded by the deployment process of the conformance
factory (``host_class``) to show the suite fails them. Never imported by pytest."""

from __future__ import annotations

from effecthost.contract import DrainReport, Outcome
from effecthost.hosts.sql import SqlEffectHost
from effecthost.hosts.sql._host import SqlDrain


class _CancellingDrain(SqlDrain):
    """Settles every child with an expired lease as cancelled, whatever the group
    declares: a RUN_TO_COMPLETION loser of a gone caller never runs again."""

    async def run_pass(self) -> DrainReport:
        host = self.host
        await host._ready()
        for row in await host.store.unfinished():
            if row.lease_expired and row.replay_key not in host._drivers:
                await host._settle_free(
                    row.group_key, row.replay_key, row.position, Outcome.cancelled()
                )
        return await super().run_pass()


class CancellingDrainHost(SqlEffectHost):
    def drain(self) -> SqlDrain:
        return _CancellingDrain(self)
