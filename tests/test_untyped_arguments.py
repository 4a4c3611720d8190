"""SPEC §7 and R-2 on the memory host: an argument of the wrong type is a typed
``EffectHostError`` on every controller method, never ``AttributeError``/``TypeError``, and
records nothing."""

from __future__ import annotations

import pytest
from untyped_calls import wrong_type_calls

from effecthost.contract import EffectHostError, ToolRegistry
from effecthost.hosts.memory import MemoryEffectHost

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("index", range(8))
async def test_wrong_argument_types_are_typed_refusals(index: int) -> None:
    host = MemoryEffectHost(ToolRegistry())
    name, call = wrong_type_calls(host)[index]
    with pytest.raises(EffectHostError):
        await call()
    assert await host.open_group_keys() == [], name
