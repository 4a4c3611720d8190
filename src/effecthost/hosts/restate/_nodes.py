"""One Restate API (ingress or admin) on several nodes of a cluster (R-12).

A request goes to the node that answered last; a connection error or a 5xx moves it to
the next node, and after a round of failures it is retried with backoff. No ``httpx``
exception leaves: a caller gets the answer, or :class:`_Unreachable` saying for how long
and why, which the caller turns into its contract error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from effecthost.contract import EffectGroupUnsupported

FIRST_DELAY = 0.05
MAX_DELAY = 2.0


class _Unreachable(Exception):
    """No node answered within the bound (``tried_for`` seconds)."""

    def __init__(self, why: str, tried_for: float) -> None:
        super().__init__(why)
        self.tried_for = tried_for


def url_list(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    """``value`` (one URL or several) as base URLs without a trailing slash.

    Raises:
        EffectGroupUnsupported: no URL, or one that is not a string.
    """
    given = [value] if isinstance(value, str) else list(value)
    if not given or not all(isinstance(url, str) and url.strip() for url in given):
        raise EffectGroupUnsupported(f"the Restate {what} needs one URL or more, got {value!r}")
    return tuple(url.strip().rstrip("/") for url in given)


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Nodes:
    """The base URLs of one API on several nodes, the one that answered last first."""

    def __init__(self, urls: tuple[str, ...], http: Any, errors: tuple[type[BaseException], ...]):
        self.urls = urls
        self._http = http
        self._errors = errors  # the transport's own (httpx.TransportError)
        self._at = 0

    def _order(self) -> list[str]:
        return [*self.urls[self._at :], *self.urls[: self._at]]

    async def request(
        self,
        method: str,
        path: str,
        *,
        bound: float | None,
        **kwargs: Any,
    ) -> Any:
        """Send ``method path`` to the nodes in turn until one answers below 500.

        ``bound`` limits the time spent on failures (``None``: retry until cancelled).

        Raises:
            _Unreachable: every attempt failed for ``bound`` seconds.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        delay = FIRST_DELAY
        last = "no attempt"
        while True:
            for base in self._order():
                try:
                    response = await self._http.request(method, base + path, **kwargs)
                except self._errors as exc:
                    last = f"{base}: {_why(exc)}"
                else:
                    if response.status_code < 500:
                        self._at = self.urls.index(base)
                        return response
                    last = f"{base}: HTTP {response.status_code} {response.text[:200]!r}"
                self._at = (self.urls.index(base) + 1) % len(self.urls)
            elapsed = loop.time() - start
            if bound is not None and elapsed >= bound:
                raise _Unreachable(last, elapsed)
            pause = delay if bound is None else min(delay, max(bound - elapsed, 0.0))
            await asyncio.sleep(pause)  # backoff between rounds of failures
            delay = min(delay * 2, MAX_DELAY)
