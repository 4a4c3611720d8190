"""The file host with a fault hook, for the suite's ``transient_faults`` checks (R-12).

A directory never fails the way an engine does, so the hook makes it: the next settlement
writes raise as an outage would (the kit retries them, then leaves the child to the
drain), and the next opens and closes lose an optimistic race on entering the guard (the
kit raises nothing yet and runs the step again). Test code only: the host itself stays
engine glue.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from effecthost.contract import Outcome
from effecthost.contract.kit import Retry

from .host import FileHost


class FaultyFileHost(FileHost):
    """:class:`FileHost` whose next writes fail on request (:meth:`inject_faults`)."""

    settle_attempts = 3
    """A short bound, so a check that rides out ``settle_attempts - 1`` outages waits
    a fraction of a second (the kit's backoff starts at 50 ms)."""

    guard_attempts = 5

    faults: Counter[str]

    def inject_faults(self, operation: str, count: int) -> int:
        """The next ``count`` attempts of ``operation`` (``"settle"`` or ``"guard"``)
        fail; returns how many attempts the kit makes of one such step."""
        if not hasattr(self, "faults"):
            self.faults = Counter()
        self.faults[operation] = count
        return self.settle_attempts if operation == "settle" else self.guard_attempts

    def _strikes(self, operation: str) -> bool:
        faults = getattr(self, "faults", None)
        if not faults or faults[operation] <= 0:
            return False
        faults[operation] -= 1
        return True

    async def settle_child(
        self, key: str, position: int, attempt: int | None, outcome: Outcome
    ) -> bool:
        if self._strikes("settle"):
            raise OSError(f"injected outage: the settlement of {key!r}@{position} failed")
        return await super().settle_child(key, position, attempt, outcome)

    @contextlib.asynccontextmanager
    async def guard(self, key: str) -> AsyncIterator[None]:
        if self._strikes("guard"):
            raise Retry(f"injected conflict on {key!r}")  # before anything was read
        async with super().guard(key):
            yield
