"""A caller process that opens a ``CANCEL`` group and stays alive until it is killed.

``python restate_live_owner.py INGRESS ADMIN LAB_PATH KEY``: it prints ``opened`` once
the group is recorded, then holds its owner lease (a short one, so a test sees it lapse
soon after a SIGKILL)."""

from __future__ import annotations

import asyncio
import sys

from effecthost.conformance import conformance_resolver, step_input
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    LoserPolicy,
    WakePolicy,
    sleep_input,
)
from effecthost.hosts.restate import RestateController

OWNER = "tests"
OWNER_TTL = 2.0


def owned_group(key: str) -> EffectGroup:
    """A ``CANCEL`` race of a gated tool call, an event wait and a long timer: what a live
    owner's drain must leave alone and a gone owner's drain cancels (R-1)."""
    return EffectGroup(
        key=key,
        wake=WakePolicy.FIRST,
        disposition=LoserPolicy.CANCEL,
        children=[
            EffectEnvelope(
                replay_key=f"{key}:tool",
                kind=EffectKind.TOOL_CALL,
                name="conformance.step",
                input=step_input(f"{key}:tool"),
            ),
            EffectEnvelope(
                replay_key=f"{key}:ev", kind=EffectKind.AWAIT_EVENT, name="go", input=None
            ),
            EffectEnvelope(
                replay_key=f"{key}:nap",
                kind=EffectKind.SLEEP,
                name="sleep",
                input=sleep_input(600.0),
            ),
        ],
    )


async def main(ingress: str, admin: str, lab_path: str, key: str) -> None:
    controller = RestateController(
        ingress, admin, conformance_resolver(lab_path), owner=OWNER, owner_ttl=OWNER_TTL
    )
    await controller.open_effect_group(owned_group(key))
    print("opened", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
