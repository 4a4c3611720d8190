"""A clean exit for short-lived Temporal callers (upstream temporalio/sdk-python#300)."""

from __future__ import annotations

import gc


def release_temporal_runtime() -> None:
    """Drop the SDK's default runtime now, while the interpreter is whole.

    The runtime's native threads otherwise stop during interpreter finalization, and one
    that takes the GIL then can abort the process (exit -6, ``PyGILState_Release … must be
    current when releasing``; rarely -11). Call it last in a short-lived process, after
    ``asyncio.run`` returned and no client or worker is used any more: it forgets the
    default runtime and collects what still referenced it, so its threads end here. A
    runtime still referenced (a client kept alive) simply stays.
    """
    import temporalio.runtime

    temporalio.runtime._runtime_ref._default_runtime = None
    gc.collect()
