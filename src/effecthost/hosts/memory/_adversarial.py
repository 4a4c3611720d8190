"""An adversarial reference host: same rules, hostile timing.

Settlements reach the rank authority late, in shuffled batches, and twice each; sequences
have gaps. A suite that passes the plain host but fails this one is relying on timing the
contract does not promise.
"""

from __future__ import annotations

import asyncio
import random

from effecthost.contract import GroupExecutors, Outcome

from ._host import MemoryEffectHost, _Child, _Group


class AdversarialMemoryHost(MemoryEffectHost):
    """Delays, reorders and redelivers settlements; burns sequence numbers."""

    def __init__(self, resolver: GroupExecutors | None = None, *, seed: int | None = None) -> None:
        super().__init__(resolver)
        self._random = random.Random(seed)
        self._pending: list[tuple[_Group, _Child, int, Outcome]] = []
        self._flusher: asyncio.Task[None] | None = None

    def _next_sequence(self, record: _Group) -> int:
        return record.counter + self._random.randint(1, 3)

    async def _deliver(self, record: _Group, child: _Child, fence: int, outcome: Outcome) -> None:
        self._pending.append((record, child, fence, outcome))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            for _ in range(self._random.randint(1, 20)):
                await asyncio.sleep(0)
            await asyncio.sleep(self._random.uniform(0, 0.005))
            batch, self._pending = self._pending, []
            self._random.shuffle(batch)
            for record, child, fence, outcome in batch + batch:
                self._finalize(record, child, fence, outcome)
