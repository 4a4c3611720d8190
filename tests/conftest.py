import os

import pytest
from hypothesis import settings

pytest_plugins = ["pytester"]

# The test run CI makes is deterministic: the property tests replay the same examples on
# every run (a failure there is a regression, never the luck of the draw). Explore new
# examples locally with EFFECTHOST_HYPOTHESIS=explore.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile("explore" if os.environ.get("EFFECTHOST_HYPOTHESIS") == "explore" else "ci")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
