"""The Restate tier (SPEC §4): a group virtual object keyed by the group key is the rank
authority; each child is an invocation of the child service.

Install with ``pip install 'effecthost[restate]'``. Everything loads lazily, so importing
this package without the extra works and the first use names the install command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._wire import CHILD, GROUP, INLINE_LIMIT, OWNER, PAYLOAD, REPLAY_KEY, REQUIRED_HANDLERS

if TYPE_CHECKING:
    from ._controller import RestateController
    from ._deploy import register_deployment, validate_registered, validate_services
    from ._endpoint import build_app, build_services
    from ._handler_controller import HandlerController
    from ._policy import file_payload_policy
    from ._serve import serve

_LAZY = {
    "HandlerController": "._handler_controller",
    "RestateController": "._controller",
    "build_app": "._endpoint",
    "build_services": "._endpoint",
    "file_payload_policy": "._policy",
    "register_deployment": "._deploy",
    "validate_registered": "._deploy",
    "validate_services": "._deploy",
    "serve": "._serve",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(module, __name__), name)


__all__ = [
    "CHILD",
    "GROUP",
    "INLINE_LIMIT",
    "OWNER",
    "PAYLOAD",
    "REPLAY_KEY",
    "REQUIRED_HANDLERS",
    "HandlerController",
    "RestateController",
    "build_app",
    "build_services",
    "file_payload_policy",
    "register_deployment",
    "serve",
    "validate_registered",
    "validate_services",
]
