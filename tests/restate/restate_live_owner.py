"""A caller process that opens a ``CANCEL`` group and stays alive until it is killed.

``python restate_live_owner.py INGRESS ADMIN LAB_PATH KEY`` (with the tests directory on
``PYTHONPATH``): it prints ``opened`` once the group is recorded, then holds its owner
lease (a short one, so a test sees it lapse soon after a SIGKILL)."""

from __future__ import annotations

import asyncio
import sys

from owner_liveness import OWNER, OWNER_TTL, owned_group

from effecthost.conformance import conformance_resolver
from effecthost.hosts.restate import RestateController


async def main(ingress: str, admin: str, lab_path: str, key: str) -> None:
    controller = RestateController(
        ingress, admin, conformance_resolver(lab_path), owner=OWNER, owner_ttl=OWNER_TTL
    )
    await controller.open_effect_group(owned_group(key))
    print("opened", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
