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
    ) -> T:
        """Await ``make()``; after an error of type ``when`` that is ``retryable``, back
        off and call ``make`` again, up to ``policy.attempts`` tries; then raise it.

        Cancellation: propagates at once (a backoff is cancelled with the rest).
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                return await make()
            except when as exc:
                if not exc.retryable or attempt >= self.policy.attempts:
                    raise
                policy = self.policy
                delay = random.uniform(
                    0, min(policy.max_backoff, policy.backoff * 2 ** (attempt - 1))
                )
                self._log.warning(
                    "backend.retry",
                    operation=name,
                    attempt=attempt,
                    delay=round(delay, 3),
                    error=str(exc),
                )
                await anyio.sleep(delay)
