"""Names and wire helpers shared by the endpoint and the controllers (no third-party
imports, so both sides agree on them without loading a driver)."""

from __future__ import annotations

from typing import Any

GROUP = "EffecthostGroup"
"""The group virtual object, keyed by group key: the rank authority (G-38)."""
CHILD = "EffecthostChild"
"""The child service: one invocation per child (G-37)."""
PAYLOAD = "EffecthostPayload"
"""The per-group payload object: outcomes above the inline threshold (G-40, G-47)."""
REPLAY_KEY = "EffecthostReplayKey"
"""The replay-key object, keyed by replay key: which group holds it (R-6)."""

GROUP_HANDLERS = (
    "open",
    "settle",
    "register_waiter",
    "await_rank",
    "close",
    "deliver",
    "event_wait",
    "drain",
    "describe",
    "claims",
)
CHILD_HANDLERS = ("run",)
PAYLOAD_HANDLERS = ("put", "get", "clear")
REPLAY_KEY_HANDLERS = ("claim", "release", "holder")

REQUIRED_HANDLERS: dict[str, tuple[str, ...]] = {
    GROUP: GROUP_HANDLERS,
    CHILD: CHILD_HANDLERS,
    PAYLOAD: PAYLOAD_HANDLERS,
    REPLAY_KEY: REPLAY_KEY_HANDLERS,
}
"""What an endpoint must bind for the contract to work (G-42)."""

INLINE_LIMIT = 4096
"""Outcomes whose canonical JSON is at most this many bytes sit inline in the rank record;
larger ones live in the payload object and the rank record carries a reference."""


def idempotency_key(group_key: str, epoch: str, replay_key: str) -> str:
    """``{group_key}:{epoch}:{replay_key}`` with ``/`` escaped: Restate's attach URLs
    break on ``/`` in idempotency keys."""
    return f"{group_key}:{epoch}:{replay_key}".replace("%", "%25").replace("/", "%2F")


def error(code: str, message: str, **ids: Any) -> dict[str, Any]:
    """A typed refusal as a handler returns it (mapped back to the contract's errors)."""
    return {"error": code, "message": message, **{k: v for k, v in ids.items() if v is not None}}
