"""Waiting for a condition: a test never sleeps to let another task or process get
somewhere. It waits for an event, for ``anyio.wait_all_tasks_blocked()``, or for a condition
it can observe, polled under a deadline with :func:`eventually` (blocking callers) or
:func:`eventually_async`; :func:`watch` samples what it cannot be told about. A test whose
code must print before its timeout takes its timeouts from :func:`until_printed`."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterator

import anyio

POLL_INTERVAL = 0.02
"""How often a condition is looked at again (what another process does cannot be awaited)."""


def eventually(
    predicate: Callable[[], object], *, within: float = 10.0, what: str = "the condition"
) -> None:
    """Return once ``predicate()`` is true; fail the test if it is not within ``within``
    seconds (a bound on a failure, never a measure of speed). For blocking callers."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {within:g}s: {what}")
        time.sleep(POLL_INTERVAL)


async def eventually_async(
    predicate: Callable[[], object | Awaitable[object]],
    *,
    within: float = 10.0,
    what: str = "the condition",
) -> None:
    """:func:`eventually` for async callers: ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + within
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {within:g}s: {what}")
        await anyio.sleep(POLL_INTERVAL)


async def watch(look: Callable[[], object], *, every: float = POLL_INTERVAL) -> None:
    """Call ``look()`` every ``every`` seconds until cancelled: an observer that samples
    what it cannot be told about (the host's processes, a directory), waiting for nothing."""
    while True:
        look()
        await anyio.sleep(every)


def until_printed(first: float, *, last: float = 32.0) -> Iterator[float]:
    """Timeouts for code that must print before its timeout: ``first``, then twice the one
    before, up to ``last``. A loaded machine can take seconds to run a program's first line
    (CI: node over 3 s), so a test runs the code again with the next while a run ended
    before anything was printed, and breaks out once it printed; what it then checks is
    the same at any timeout."""
    timeout = first
    while timeout <= last:
        yield timeout
        timeout *= 2
