"""First-come, first-served concurrency limits that count what they do."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import msgspec

from ._errors import CapacityTimeout

__all__ = ("Limiter", "LimiterStatistics")


class LimiterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one concurrency limit."""

    name: str
    limit: int | None
    """``None``: unbounded (the limiter only counts)."""
    active: int
    """Slots held now."""
    waiting: int
    """Tasks queued for a slot now."""
    peak_active: int
    """Most slots ever held at once."""
    acquired: int
    """Slots handed out so far."""
    wait_seconds_total: float
    wait_seconds_max: float


class Limiter:
    """A FIFO semaphore (anyio's) with statistics and an optional bound on the wait.

    Slots are not tied to tasks: one task may hold many (a sandbox holds its ``live`` slot
    from creation to removal, across many tasks).
    """

    def __init__(
        self,
        name: str,
        limit: int | None,
        *,
        capacity_timeout: float | None,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.name = name
        self._on_wait = on_wait
        self.limit = limit
        self._capacity_timeout = math.inf if capacity_timeout is None else capacity_timeout
        self._semaphore = None if limit is None else anyio.Semaphore(limit, fast_acquire=True)
        self._active = 0
        self._waiting = 0
        self._peak = 0
        self._acquired = 0
        self._wait_total = 0.0
        self._wait_max = 0.0

    async def acquire(self, *, bounded: bool = True) -> None:
        """Wait for a slot. Raises :class:`CapacityTimeout` past ``capacity_timeout``,
        unless ``bounded`` is false (cleanup must not give up: every holder is bounded).

        Cancellation: a cancelled wait takes no slot.
        """
        if self._semaphore is not None and not (
            # A free slot and nobody queued before us (FIFO): take it without waiting.
            self._waiting == 0 and self._semaphore.value > 0
        ):
            started = anyio.current_time()
            self._waiting += 1
            try:
                with anyio.fail_after(self._capacity_timeout if bounded else math.inf):
                    await self._semaphore.acquire()
            except TimeoutError:
                raise CapacityTimeout(self.name, anyio.current_time() - started) from None
            finally:
                self._waiting -= 1
            waited = anyio.current_time() - started
            self._wait_total += waited
            self._wait_max = max(self._wait_max, waited)
            if self._on_wait is not None:
                self._on_wait(waited)
        elif self._semaphore is not None:
            self._semaphore.acquire_nowait()
        self._active += 1
        self._acquired += 1
        self._peak = max(self._peak, self._active)

    def release(self) -> None:
        self._active -= 1
        if self._semaphore is not None:
            self._semaphore.release()

    @asynccontextmanager
    async def slot(self, *, bounded: bool = True) -> AsyncIterator[None]:
        await self.acquire(bounded=bounded)
        try:
            yield
        finally:
            self.release()

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(
            name=self.name,
            limit=self.limit,
            active=self._active,
            waiting=self._waiting,
            peak_active=self._peak,
            acquired=self._acquired,
            wait_seconds_total=self._wait_total,
            wait_seconds_max=self._wait_max,
        )

    def __repr__(self) -> str:
        limit = "unbounded" if self.limit is None else f"limit {self.limit}"
        return f"<Limiter {self.name} [{self._active} active, {self._waiting} waiting, {limit}]>"
