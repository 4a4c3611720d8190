"""A controller that delegates to the host under test and records the groups opened
through it: the checks of what a combinator opens, and the base of their wrappers."""

from __future__ import annotations

from typing import Any

from effecthost.contract import EffectController, EffectGroup, GroupHandle, LoserPolicy


class Recording(EffectController):
    """Delegates to a host and records the groups opened through it (in ``opened``)."""

    def __init__(self, inner: EffectController) -> None:
        self.inner = inner
        self.opened: list[EffectGroup] = []

    def supports_effect_groups(self) -> bool:
        return self.inner.supports_effect_groups()

    async def open_effect_group(self, group: EffectGroup) -> GroupHandle:
        self.opened.append(group)
        return await self.inner.open_effect_group(group)

    async def await_next_settlement(self, handle: GroupHandle) -> Any:
        return await self.inner.await_next_settlement(handle)

    async def close_effect_group(
        self, handle: GroupHandle, disposition: LoserPolicy | None = None
    ) -> None:
        await self.inner.close_effect_group(handle, disposition)
