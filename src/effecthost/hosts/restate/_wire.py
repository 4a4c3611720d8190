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
OWNER = "EffecthostOwner"
"""The owner object, keyed by a controller's incarnation: its lease (R-1)."""

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
    "retired",
)
CHILD_HANDLERS = ("run",)
PAYLOAD_HANDLERS = ("put", "get", "clear")
REPLAY_KEY_HANDLERS = ("claim", "release", "holder", "claim_keys", "release_keys", "holders")
OWNER_HANDLERS = ("beat", "lapse", "leave")

REQUIRED_HANDLERS: dict[str, tuple[str, ...]] = {
    GROUP: GROUP_HANDLERS,
    CHILD: CHILD_HANDLERS,
    PAYLOAD: PAYLOAD_HANDLERS,
    REPLAY_KEY: REPLAY_KEY_HANDLERS,
    OWNER: OWNER_HANDLERS,
}
"""What an endpoint must bind for the contract to work (G-42)."""

INLINE_LIMIT = 4096
"""Outcomes whose canonical JSON is at most this many bytes sit inline in the rank record;
larger ones live in the payload object and the rank record carries a reference."""


def idempotency_key(tool: str, position: int, replay_key: str, epoch: str) -> str:
    """``{tool}:{position}:{replay_key}:{epoch}`` with the epoch cut to its first 64 bits
    (hex) and ``/`` escaped (Restate's attach URLs break on it).

    Unique in the child service: a replay key is held by one group at a time (R-6) and
    the epoch is random per group, so only a replay key reused by a later group within
    the idempotency retention needs the epoch to tell them apart (G-37). The tool name and
    position lead because ``restate invocations list`` shows the key and not the input;
    the group key shows there as the invoking ``EffecthostGroup/{key}/open``.
    """
    short = epoch.replace("-", "")[:16]
    return _escaped(f"{tool}:{position}:{replay_key}:{short}")


def claim_bucket(replay_key: str) -> str | None:
    """The replay-key object that holds the claim of a key of the form ``{prefix}:{n}``
    (what the combinators give the children of a group: ``{group key}:{position}``): the
    one keyed by ``prefix``, so one open claims a group's keys in one call (R-6). A
    function of the key alone, so every claim of a key meets on one object. ``None``: the
    key has an object of its own (keyed by the key itself)."""
    prefix, sep, tail = replay_key.rpartition(":")
    if sep and prefix and tail.isascii() and tail.isdigit():
        return prefix
    return None


def _escaped(text: str) -> str:
    return text.replace("%", "%25").replace("/", "%2F")


def child_headers(group_key: str, position: int, envelope: dict[str, Any]) -> dict[str, str]:
    """Headers of a child's invocation, so the engine's UI and CLI show which tool it runs
    and where it sits in its group (the input holds the same, but operators do not read
    inputs)."""
    return {
        "effecthost-tool": _header_text(envelope["name"]),
        "effecthost-kind": _header_text(envelope["kind"]),
        "effecthost-group": _header_text(group_key),
        "effecthost-position": str(position),
        "effecthost-replay-key": _header_text(envelope["replay_key"]),
    }


def _header_text(text: str) -> str:
    """Printable ASCII as is; ``%`` and everything else percent-encoded (UTF-8)."""
    return "".join(
        c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
        for c in text
    )


def error(code: str, message: str, **ids: Any) -> dict[str, Any]:
    """A typed refusal as a handler returns it (mapped back to the contract's errors)."""
    return {"error": code, "message": message, **{k: v for k, v in ids.items() if v is not None}}
