"""A tool whose outcome is not in its input, so a test can look for the outcome in the
recorded state: the endpoint resolves it by ``--resolver restate_secret_tools:registry``
(this directory on ``PYTHONPATH``)."""

from typing import Any

from effecthost.contract import ToolRegistry


async def _reveal(spec: Any) -> Any:
    """Return the secret whose reversal is the input (plus padding, for a large one)."""
    return {"secret": str(spec["reversed"])[::-1], "blob": "x" * int(spec.get("pad", 0))}


registry = ToolRegistry({"reveal": _reveal})
