"""The endpoint's start-up check (G-42): a deployment that lacks a handler the contract
needs is refused before it serves, naming every missing ``Service/handler``."""

from __future__ import annotations

import pytest

from effecthost.contract import EffectGroupUnsupported
from effecthost.hosts.restate import PAYLOAD, REPLAY_KEY, build_services, validate_services


def test_G42_an_endpoint_lacking_a_needed_handler_fails_validation() -> None:
    """G-42: the services the endpoint factory binds pass; the same services with one
    handler of the payload object removed, or without the replay-key object, fail
    validation, naming what is missing."""
    services = build_services(None)
    validate_services(services)

    payload = next(s for s in services if s.name == PAYLOAD)
    del payload.handlers["clear"]
    with pytest.raises(EffectGroupUnsupported, match=f"{PAYLOAD}/clear") as refused:
        validate_services(services)
    assert f"{PAYLOAD}/get" not in str(refused.value)

    without = [s for s in build_services(None) if s.name != REPLAY_KEY]
    with pytest.raises(EffectGroupUnsupported) as refused:
        validate_services(without)
    assert all(f"{REPLAY_KEY}/{h}" in str(refused.value) for h in ("claim", "release", "holder"))
