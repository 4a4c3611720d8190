"""The Temporal tier (SPEC §5): a group is a workflow whose id is the group key.

Extra ``temporal``: ``pip install 'effecthost[temporal]'``. Importing this package
without ``temporalio`` raises :class:`effecthost.hosts.MissingExtra` with that hint.

- :func:`create_worker` builds a worker with the group workflow and the child activity
  registered for a task queue and a resolver (G-46); :func:`run_worker` runs one until
  SIGTERM or SIGINT and shuts it down gracefully;
- :class:`TemporalEffectHost` is the controller callers use (a client wrapper);
- :class:`SealingCodec`, :func:`sealed_client`, :func:`connect_sealed`: the sealing
  payload codec and the client helper (G-50).
"""

from __future__ import annotations

from effecthost.hosts import require

require("temporal", "temporal", "temporalio")

from ._codec import (  # noqa: E402
    CODEC_ENCODING,
    CODEC_SCOPE,
    SealingCodec,
    connect_sealed,
    sealed_client,
    sealed_data_converter,
)
from ._controller import GroupTooWide, TemporalEffectHost  # noqa: E402
from ._exit import release_temporal_runtime  # noqa: E402
from ._shared import (  # noqa: E402
    CHILD_ACTIVITY,
    INLINE_OUTCOME_BYTES,
    MAX_CHILDREN,
    MAX_SPEC_BYTES,
    SHARD_CHILDREN,
    SHARD_SIGNAL_INTERVAL,
    SHARD_START_SLICE,
    WIDE_SHARD_CHILDREN,
    WORKFLOW_NAME,
)
from ._worker import ChildActivities, create_worker, run_worker, workflow_runner  # noqa: E402
from ._workflow import EffectGroupWorkflow, EffectShardWorkflow, assign_rank  # noqa: E402

__all__ = [
    "CHILD_ACTIVITY",
    "CODEC_ENCODING",
    "CODEC_SCOPE",
    "INLINE_OUTCOME_BYTES",
    "MAX_CHILDREN",
    "MAX_SPEC_BYTES",
    "SHARD_CHILDREN",
    "SHARD_SIGNAL_INTERVAL",
    "SHARD_START_SLICE",
    "WIDE_SHARD_CHILDREN",
    "WORKFLOW_NAME",
    "ChildActivities",
    "EffectGroupWorkflow",
    "EffectShardWorkflow",
    "GroupTooWide",
    "SealingCodec",
    "TemporalEffectHost",
    "assign_rank",
    "connect_sealed",
    "create_worker",
    "release_temporal_runtime",
    "run_worker",
    "sealed_client",
    "sealed_data_converter",
    "workflow_runner",
]
