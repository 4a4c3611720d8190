"""The Temporal tier (SPEC §5): a group is a workflow whose id is the group key.

Extra ``temporal``: ``pip install 'effecthost[temporal]'``. Importing this package
without ``temporalio`` raises :class:`effecthost.hosts.MissingExtra` with that hint.

- :func:`create_worker` builds a worker with the group workflow and the child activity
  registered for a task queue and a resolver (G-46);
- :class:`TemporalEffectHost` is the controller callers use (a client wrapper).
"""

from __future__ import annotations

from effecthost.hosts import require

require("temporal", "temporal", "temporalio")

from ._controller import GroupTooWide, TemporalEffectHost  # noqa: E402
from ._shared import (  # noqa: E402
    CHILD_ACTIVITY,
    INLINE_OUTCOME_BYTES,
    MAX_CHILDREN,
    MAX_SPEC_BYTES,
    WORKFLOW_NAME,
)
from ._worker import ChildActivities, create_worker, workflow_runner  # noqa: E402
from ._workflow import EffectGroupWorkflow, assign_rank  # noqa: E402

__all__ = [
    "CHILD_ACTIVITY",
    "INLINE_OUTCOME_BYTES",
    "MAX_CHILDREN",
    "MAX_SPEC_BYTES",
    "WORKFLOW_NAME",
    "ChildActivities",
    "EffectGroupWorkflow",
    "GroupTooWide",
    "TemporalEffectHost",
    "assign_rank",
    "create_worker",
    "workflow_runner",
]
