"""Owner liveness across incarnations: R-1 (G-29, G-34) seen from another live process."""

from __future__ import annotations

from .._context import CheckContext
from .._registry import check
from .closing import drain_beside_a_live_owner


@check("G-29", "G-34", requires=("second_incarnation",))
async def check_another_process_never_takes_a_live_owners_group(t: CheckContext) -> None:
    """Ruling R-1: a group's owner is live while its incarnation holds its claim, so a
    drain pass run by *another* live incarnation over the same store (the unwired
    controller) cancels, resumes and reports none of the children of a live owner's
    ``CANCEL`` group: not a running tool call, not an event wait, not a timer (not even
    as ``NoExecutor``). A host that takes every other process for gone fails here."""
    await drain_beside_a_live_owner(t, other_process=True)
