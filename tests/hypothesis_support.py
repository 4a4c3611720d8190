"""The settings of the property tests that drive real hosts: no deadline, and no health
check failing a test because its examples are slow or large (the hosts do real I/O)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def examples(n: int) -> settings:
    """``n`` examples per property under these settings."""
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
