"""Names, limits and the error mapping shared by the workflow, the activity and the
caller. Standard library only, so the workflow sandbox can pass it through."""

from __future__ import annotations

from typing import Any

WORKFLOW_NAME = "effecthost.EffectGroup"
"""Workflow type of a group; the workflow id is the group key (G-43)."""

SHARD_WORKFLOW_NAME = "effecthost.EffectShard"
"""Workflow type of a shard: a child workflow of a wide group's workflow that runs a
slice of its children and reports their settlements to it (ids: :func:`shard_id`)."""

SHARD_SETTLED = "shard_settled"
"""Signal a shard sends its group: ``[[position, outcome], ...]`` in the order the shard
observed them."""

SHARD_CANCEL = "shard_cancel"
"""Signal a group sends a shard: cancel the children at these positions."""

SHARD_EVENT = "shard_event"
"""Signal a group sends a shard: ``[positions, payload]``, an event for those children."""

SHARD_CHILDREN = 1000
"""Children per shard: a group wider than this runs its children in shards of this
many (each a child workflow), so no run holds more pending activities than a shard."""

CHILD_ACTIVITY = "effecthost.child"
"""The one activity type every ``tool_call`` child runs as."""

RETIRE_ACTIVITY = "effecthost.retire_payloads"
"""Deletes a retired group's stored payloads (scheduled only for groups opened with a
payload store, option ``payloads``)."""

READ_QUERY = "read:"
"""Prefix of the argument-less rank query ``read:<rank>`` (the rank is in the name, so a
caller whose codec keys differ from the worker's sends nothing the worker must decode)."""

AWAIT_UPDATE = "await_rank:"
"""Prefix of the argument-less waiting update ``await_rank:<rank>``."""

RANKS_QUERY = "ranks:"
"""Prefix of the argument-less batch query ``ranks:<after>``: the settlements ranked after
``after`` that are recorded, as many as :data:`BATCH_BYTES` allows (at least one)."""

AWAIT_RANKS_UPDATE = "await_ranks:"
"""Prefix of the argument-less waiting update ``await_ranks:<after>``: waits until a rank
after ``after`` is recorded and returns the batch then recorded (as :data:`RANKS_QUERY`)."""

BATCH_BYTES = 512 * 1024
"""Largest batch of settlements one read returns (estimated from the outcomes' JSON);
a batch holds at least one settlement whatever its size."""

SETTLED_QUERY = "settled"
"""Every recorded settlement as recorded (stored forms; inspection and tests)."""

MEMO_STATE = "effecthost_state"
"""Memo key listing a group as ``open`` until a caller closes it (G-30)."""

MAX_CHILDREN = 100_000
"""Widest group. A group wider than :data:`SHARD_CHILDREN` runs in shards; its encoded
children must still fit one workflow input (:data:`MAX_SPEC_BYTES`), which bounds the
width first for all but the smallest envelopes. Wider groups are refused at open
(:class:`GroupTooWide`)."""

MAX_SPEC_BYTES = 1_500_000
"""Largest encoded group (all child envelopes) accepted at open; one payload of a run
may be at most 2 MiB."""

INLINE_OUTCOME_BYTES = 256 * 1024
"""Without a payload store, outcomes whose recorded JSON is larger are refused by the
activity as ``PayloadTooLarge`` failures rather than written into history; with one they
go by reference above the policy's inline threshold (see docs/temporal.md)."""

RANK_UPDATE_PREFIX = "rank-"

BATCH_UPDATE_PREFIX = "ranks-after-"


def rank_update_id(rank: int) -> str:
    """The deterministic update id of the waiting read of ``rank`` (G-44): every caller
    waiting on one rank shares one update, so a run spends at most one update per rank."""
    return f"{RANK_UPDATE_PREFIX}{rank}"


def error_details(**ids: Any) -> dict[str, Any]:
    """Ids carried by a failure raised in the workflow or the activity (never payloads)."""
    return {k: v for k, v in ids.items() if v is not None}


def batch_update_id(after: int) -> str:
    """The deterministic update id of the waiting batch read after rank ``after``: every
    caller waiting there shares one update, so a run spends at most one per rank."""
    return f"{BATCH_UPDATE_PREFIX}{after}"


def shard_id(group_key: str, index: int) -> str:
    """The workflow id of shard ``index`` of the group ``group_key``."""
    return f"{group_key}/shard-{index}"
