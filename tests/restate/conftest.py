"""The Restate tests' ``stack``: a lab, a server, an endpoint and a controller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from restate_stack import Stack, running_stack


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path) as built:
        yield built
