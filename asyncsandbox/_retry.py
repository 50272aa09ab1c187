"""The session's :class:`RetryPolicy` applied: the one loop every call the runtime retries
goes through (which errors a call is retried on is the runtime's choice, per call)."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ._config import RetryPolicy
from ._errors import InfrastructureError

T = TypeVar("T")


class Retrier:
    """Tries a call again, as ``policy`` allows, after the errors it is told to retry.

    :param policy: attempts and backoff.
    :param log: where each retry is logged (a warning).
    """

    __slots__ = ("_log", "policy")

    def __init__(self, policy: RetryPolicy, log: Any) -> None:
        self.policy = policy
        self._log = log

    async def run(
        self,
        name: str,
        make: Callable[[], Awaitable[T]],
        when: type[InfrastructureError] | tuple[type[InfrastructureError], ...],
        *,
        failed: InfrastructureError | None = None,
    ) -> T:
        """Await ``make()``; after an error of type ``when`` that is ``retryable``, back
        off and call ``make`` again, up to ``policy.attempts`` tries; then raise it.
        ``failed``: the first try was made by the caller and raised this (a caller's fast
        path: the calls that succeed at once pay nothing for the loop).

        Cancellation: propagates at once (a backoff is cancelled with the rest).
        """
        attempt = 0
        if failed is not None:
            attempt = 1
            await self._back_off(name, attempt, failed)
        while True:
            attempt += 1
            try:
                return await make()
            except when as exc:
                await self._back_off(name, attempt, exc)

    async def _back_off(self, name: str, attempt: int, exc: InfrastructureError) -> None:
        """Wait before try ``attempt + 1``, or raise ``exc`` if there is none."""
        policy = self.policy
        if not exc.retryable or attempt >= policy.attempts:
            raise exc
        delay = random.uniform(0, min(policy.max_backoff, policy.backoff * 2 ** (attempt - 1)))
        self._log.warning(
            "backend.retry", operation=name, attempt=attempt, delay=round(delay, 3), error=str(exc)
        )
        await anyio.sleep(delay)
