"""First-come, first-served concurrency limits that count what they do."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import anyio
import msgspec

from ._errors import CapacityTimeout

__all__ = ("Limiter", "LimiterStatistics")

WARNING_INTERVAL = 30.0
"""Seconds between two slow-wait warnings of one limit."""


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
        warn_after: float | None = None,
        on_slow_wait: Callable[[Limiter, float], None] | None = None,
    ) -> None:
        self.name = name
        self._on_wait = on_wait
        self._warn_after = warn_after if on_slow_wait is not None else None
        self._on_slow_wait = on_slow_wait
        self._last_warning = -math.inf
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
            acquired = False
            try:
                with anyio.fail_after(self._capacity_timeout if bounded else math.inf):
                    if self._warn_after is None:
                        await self._semaphore.acquire()
                        acquired = True
                    else:
                        # The warning comes from a timer beside the wait: leaving the queue
                        # to warn and joining it again would lose our place (FIFO).
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._warn_later, started, self._warn_after)
                            await self._semaphore.acquire()
                            acquired = True
                            tg.cancel_scope.cancel()
            except BaseException as exc:
                if acquired:  # cancelled while leaving the task group: give the slot back
                    self._semaphore.release()
                if isinstance(exc, TimeoutError):
                    raise CapacityTimeout(self.name, anyio.current_time() - started) from None
                raise
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

    async def _warn_later(self, started: float, delay: float) -> None:
        await anyio.sleep(delay)
        now = anyio.current_time()
        # One warning per limit at most every WARNING_INTERVAL, however many tasks wait.
        if now - self._last_warning < WARNING_INTERVAL or self._on_slow_wait is None:
            return
        self._last_warning = now
        with suppress(Exception):  # a broken log sink must not fail the wait
            self._on_slow_wait(self, now - started)

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
