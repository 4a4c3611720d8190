"""Each controller method called with an argument of the wrong type (``None``, a string,
a handle built without validation, a key no tier can store): shared by the memory, Restate
and Temporal tests of SPEC §7 / R-2 (the SQL tiers' property tests generate such calls)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from effecthost.contract import EffectController, GroupHandle, LoserPolicy, WakePolicy

UNCHECKED_HANDLE = GroupHandle.model_construct(
    group_key="k:group:x:0",
    child_count=2,
    consumed=-1,
    wake=WakePolicy.FIRST,
    disposition=LoserPolicy.CANCEL,
)


def wrong_type_calls(ctl: EffectController) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    bad: Any = None
    return [
        ("open(None)", lambda: ctl.open_effect_group(bad)),
        ("open('g')", lambda: ctl.open_effect_group("g")),  # type: ignore[arg-type]
        ("await(None)", lambda: ctl.await_next_settlement(bad)),
        ("await(unchecked)", lambda: ctl.await_next_settlement(UNCHECKED_HANDLE)),
        ("close(None)", lambda: ctl.close_effect_group(bad)),
        ("order(['k'])", lambda: ctl.settlement_order(["k"])),  # type: ignore[arg-type]
        ("order(surrogate)", lambda: ctl.settlement_order("\ud800")),
        ("event(None)", lambda: ctl.deliver_event(bad, "go")),
    ]
