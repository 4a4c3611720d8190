"""A deployment's sealing, recorded before any outcome is written (G-48).

A host with a sealing payload policy records, when it starts and before it opens a
group, that the database is sealed (``eh_sealing``, a one-row table; a host without a
sealer records "plaintext" there, and a sealing host turns it to sealed for good). From
then on a writer without a sealer (a host, ``effecthost drain``) records no outcome there,
whether or not a sealed outcome exists yet, whichever process settles a child: its opens,
drain passes and event deliveries raise :class:`SealedDeployment`, its close leaves the
cancelled outcomes to a sealing writer. It still starts and reads (a sealed outcome it
cannot open is ``SealedPayloadUnreadable``). A database of an earlier release has no
record: it counts as sealed when it holds a sealed outcome, and gets its record then.
"""

from __future__ import annotations

from typing import Any

from effecthost.contract import StoreRefused


class SealedDeployment(StoreRefused):
    """A writer without a sealer was pointed at a sealed deployment; nothing was written.

    Attributes:
        where: the database (a file, or a PostgreSQL schema; never a DSN).
    """

    def __init__(self, where: str) -> None:
        super().__init__(
            f"{where}: a sealed deployment; a writer without its payload settings (a "
            "sealer and its keys) would record plaintext outcomes in it"
        )
        self.where = where


async def settle_sealing(store: Any, seals: bool) -> bool:
    """Record that ``store`` is sealed when its writer ``seals``; else whether the
    deployment is sealed (so that writer must refuse to record outcomes). A database of an
    earlier release gets its record here, from whether it holds a sealed outcome (one scan,
    once)."""
    if seals:
        await store.record_sealing(True)
        return False
    recorded = await store.recorded_sealing()
    if recorded is None:
        recorded = bool(await store.records_sealed())
        await store.record_sealing(recorded)
    return bool(recorded)
