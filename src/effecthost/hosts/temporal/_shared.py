"""Names, limits and the error mapping shared by the workflow, the activity and the
caller. Standard library only, so the workflow sandbox can pass it through."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
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
"""Widest group run in one workflow by default; a wider group runs its children in
shards of :data:`WIDE_SHARD_CHILDREN` (each a child workflow), so no run holds more
pending activities than a shard."""

WIDE_SHARD_CHILDREN = 1000
"""Children per shard of a group wider than :data:`SHARD_CHILDREN` (by default). Shards
of 100 halve the server's CPU per child of a 10,000-child group against shards of 1,000
(a shard sees a workflow task per few completions, and a task costs the server more the
more activities are pending in its run). Runs that saw a 10,000-child group in shards of
100 leave its worker polling nothing were likely blocked by the benchmark harness's
unread stdout pipe (docs/temporal.md, "Limits"); the default stays at 1,000 until shards
of 100 are measured again."""

SHARD_SIGNAL_INTERVAL = 0.0
"""Default seconds a shard leaves at least between two of its reports to the group (the
controller's ``shard_signal_interval``; 0: a report per shard workflow task, as before
the parameter). With an interval, a report goes out at once when the shard's previous
one is older than it (so each shard's first settlement reaches the group at once, G-21)
and settlements observed sooner wait for the interval's end and go in one signal: fewer
signals, group workflow tasks and history events for a bounded delay of later ranks.
Off by default: at 3,000 children 5 s cut the workflow tasks per child by a quarter and
the group's history from 1,030 to 145 events, but neither the wall time nor the server's
CPU per child (docs/temporal.md, "Limits")."""

SHARD_START_SLICE = 100
"""Default children a run (a group's, or a shard's) starts per workflow task (the
controller's ``shard_start_slice``, recorded per group at open). Shards that started all
their children in their first task took that task 5.7–8 s at 1,000 children when a
10,000-child group's ten shards started together on a lightly loaded 2-core machine (the
server warns past 5 s), and under load past the task timeout and the SDK's deadlock
detector, whose failed evictions stalled shards for good (docs/temporal.md, "Limits"). A
run wider than the slice starts each next slice in a workflow task of its own: the one
that sees a child of the slice before end, or after 1 s."""

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

HOLD_QUERY = "hold:"
"""Prefix of the query ``hold:<position>`` a re-run attempt of a child asks before it
starts its tool (R-13): ``True`` while the child must stay down (its group is decided and
no caller awaits a rank that does not exist yet, or it holds a rank already)."""

RELEASE_CLAIMS_ACTIVITY = "effecthost.release_claims"
"""Ends a retiring group's replay-key claims (R-11): the claim workflows of
:data:`CLAIMS_QUERY` whose memo names the group, terminated by run id."""

CLAIMS_QUERY = "claims"
"""The group's claim buckets: ``["prefix", group key]`` when a child's key is
``{group key}:{n}``, and ``["key", replay key]`` for every other key."""

HAS_KEY_QUERY = "has_key:"
"""Prefix of the query ``has_key:<replay key>``: whether the group has a child with that
key (a per-key claim asks a live holder of the key's prefix claim, R-6)."""

SETTLED_QUERY = "settled"
"""Every recorded settlement as recorded (stored forms; inspection and tests)."""

MEMO_STATE = "effecthost_state"
"""Memo key listing a group as ``open`` until a caller closes it (G-30)."""

MAX_CHILDREN = 100_000
"""Widest group. A group wider than :data:`SHARD_CHILDREN` runs in shards; wider groups
are refused at open (:class:`GroupTooWide`). The contract's own cap
(``limits.MAX_CHILDREN``) is lower."""

MAX_SPEC_BYTES = 1_500_000
"""Largest encoded group opened in one call (the workflow's start input; one payload of a
run may be at most 2 MiB). A larger group opens in chunks of at most this many bytes
(the controller's ``chunk_bytes``): see :data:`OPEN_CHUNK_UPDATE`."""

OPEN_CHUNK_UPDATE = "open_chunk"
"""Update recording one chunk of a group opened in chunks: ``(index, entries)``, the
entries (envelope and hash) of the positions the start input's manifest gives that chunk.
The run starts no child until every chunk is recorded."""

PAIRS_QUERY = "pairs:"
"""Prefix of the query ``pairs:<start>``: the recorded ``[replay key, hash]`` of up to
:data:`PAIRS_PAGE` positions from ``start`` (``None`` where not yet recorded); the
caller names the first differing position of a refused chunked reopen with it."""

PAIRS_PAGE = 2000

RESULT_BYTES = 1_000_000
"""Largest result a group's run returns with every settlement listed; above it the
result lists the ranks by position only."""

INLINE_OUTCOME_BYTES = 256 * 1024
"""Without a payload store, outcomes whose recorded JSON is larger are refused by the
activity as ``PayloadTooLarge`` failures rather than written into history; with one they
go by reference above the policy's inline threshold (see docs/temporal.md)."""

BATCH_UPDATE_PREFIX = "ranks-after-"


def error_details(**ids: Any) -> dict[str, Any]:
    """Ids carried by a failure raised in the workflow or the activity (never payloads)."""
    return {k: v for k, v in ids.items() if v is not None}


def batch_update_id(after: int) -> str:
    """A fresh update id for one waiting read after rank ``after`` (its retries reuse it).

    Never shared between reads: the server answers an update whose id it has completed
    with the stored outcome, without the validator, so a shared id would serve a rank to
    a read after the group closed (R-4)."""
    return f"{BATCH_UPDATE_PREFIX}{after}-{uuid.uuid4().hex}"


def key_prefix(replay_key: str) -> str | None:
    """``p`` for a key ``{p}:{n}``, else ``None``."""
    prefix, sep, tail = replay_key.rpartition(":")
    if sep and prefix and tail.isascii() and tail.isdigit():
        return prefix
    return None


def claim_bucket(replay_key: str, group_key: str) -> tuple[str, str]:
    """``("prefix", group_key)`` for a key ``{group_key}:{n}``, else
    ``("key", replay_key)``: how group ``group_key`` claims ``replay_key`` (R-6)."""
    if key_prefix(replay_key) == group_key:
        return ("prefix", group_key)
    return ("key", replay_key)


SHARD_ID_SEPARATOR = "/shard-"


def shard_id(group_key: str, index: int) -> str:
    """The workflow id of shard ``index`` of the group ``group_key``."""
    return f"{group_key}{SHARD_ID_SEPARATOR}{index}"


def children_digest(pairs: Sequence[Sequence[str]]) -> str:
    """The digest of children as ``[replay key, envelope hash]`` pairs in position
    order: what a chunked open is fenced on (a whole group, or one chunk)."""
    text = json.dumps([list(p) for p in pairs], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def chunk_update_id(index: int, digest: str) -> str:
    """The update id of chunk ``index``: concurrent opens of one group share it."""
    return f"open-chunk-{index}-{digest[:16]}"
