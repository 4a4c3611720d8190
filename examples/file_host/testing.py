"""The conformance factory for the file host.

``PYTHONPATH=. effecthost conformance examples.file_host.testing:factory`` runs the suite.
The host runs in a deployment process of its own, so ``restart()`` SIGKILLs every child of
the dead incarnation; the next process finds only what the directory recorded.
"""

# [factory]
import os

from effecthost.conformance import (
    Deployment,
    FactoryEnv,
    HostCapabilities,
    ProcessHostUnderTest,
)

from .faults import FaultyFileHost
from .host import FileHost


def build(deployment: Deployment) -> FileHost:
    """Called in the deployment process, once per controller the suite asks for; the
    host with a fault hook, so the suite can make its writes fail (R-12)."""
    return FaultyFileHost(deployment.work_dir / "records", deployment.resolver)


def factory(env: FactoryEnv) -> ProcessHostUnderTest:
    return ProcessHostUnderTest(
        env,
        "examples.file_host.testing:build",
        capabilities=HostCapabilities(
            restart=True,
            durable_timers=True,
            waiter_probe=True,
            second_incarnation=True,
            transient_faults=True,
        ),
    )


# [/factory]


def from_env() -> FileHost:
    """The host over ``$EFFECTHOST_FILE_ROOT``, for ``effecthost drain --host`` and
    ``effecthost inspect --host examples.file_host.testing:from_env``."""
    return FileHost(os.environ["EFFECTHOST_FILE_ROOT"], None)
