"""SPEC §7 and R-2 on the memory host: an argument of the wrong type (``None``, a string, a
handle built without validation, a key that is not a storable string) is a typed
``EffectHostError`` on every controller method, never ``AttributeError``/``TypeError``."""

from __future__ import annotations

from typing import Any

import pytest

from effecthost.contract import (
    EffectController,
    EffectHostError,
    GroupHandle,
    LoserPolicy,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio

UNCHECKED_HANDLE = GroupHandle.model_construct(
    group_key="k:group:x:0",
    child_count=2,
    consumed=-1,
    wake=WakePolicy.FIRST,
    disposition=LoserPolicy.CANCEL,
)


def calls(host: EffectController) -> list[tuple[str, Any]]:
    """Each method called with an argument of the wrong type (shared by the engine tiers
    tests, which run it against their real servers)."""
    return [
        ("open(None)", lambda: host.open_effect_group(None)),  # type: ignore[arg-type]
        ("open('g')", lambda: host.open_effect_group("g")),  # type: ignore[arg-type]
        ("await(None)", lambda: host.await_next_settlement(None)),  # type: ignore[arg-type]
        ("await(unchecked)", lambda: host.await_next_settlement(UNCHECKED_HANDLE)),
        ("close(None)", lambda: host.close_effect_group(None)),  # type: ignore[arg-type]
        ("order(['k'])", lambda: host.settlement_order(["k"])),  # type: ignore[arg-type]
        ("order(surrogate)", lambda: host.settlement_order("\ud800")),
        ("event(None)", lambda: host.deliver_event(None, "go")),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("index", range(8))
async def test_wrong_argument_types_are_typed_refusals(index: int) -> None:
    host = MemoryEffectHost(ToolRegistry())
    name, call = calls(host)[index]
    with pytest.raises(EffectHostError):
        await call()
    assert await host.open_group_keys() == [], name
