"""The blocking facade's futures (:mod:`asyncsandbox.sync`): :class:`Handle`, one running
operation, and :func:`wait` and :func:`as_completed` over many."""

from __future__ import annotations

import builtins
import concurrent.futures
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, final

from . import _validate as check
from ._errors import InvalidArgument, OperationCancelled
from ._syncloop import check_blocking_allowed

__all__ = ("Handle", "as_completed", "wait")

T = TypeVar("T")


@final
class Handle(Generic[T]):
    """A running operation of a :class:`SyncSession`: a future for its result.

    Returned at once by every :class:`SyncSandbox` method and :meth:`SyncSession.run`.
    Consume many with :func:`wait` or :func:`as_completed`.

    ``result()`` and ``exception()`` raise :class:`RunningEventLoopError` when called from
    a thread that runs an event loop (even when the handle is done).
    """

    __slots__ = ("_future", "_owner", "name")

    def __init__(self, future: Future[T], name: str, owner: object) -> None:
        self._future = future
        self._owner = owner  # keeps the SyncSandbox (or SyncSession) alive while referenced
        self.name = name
        """What is running, for messages (``exec``, ``read_file``, ...)."""

    def result(self, timeout: float | None = None) -> T:
        """Wait until done, then return the value or raise the operation's error: the same
        exception the async API raises (:class:`~asyncsandbox.ExecTimeout`, ...), or
        :class:`~asyncsandbox.OperationCancelled` if the handle was cancelled.

        Blocks. Past ``timeout`` seconds, raises the builtin :class:`TimeoutError` (saying
        so) and the operation keeps running (an :class:`~asyncsandbox.ExecTimeout`, also a
        ``TimeoutError``, means instead that the *command* ran out of time).
        """
        check_blocking_allowed("Handle.result()")
        limit = check.seconds("timeout", timeout)
        try:
            return self._future.result(limit)
        except concurrent.futures.CancelledError:
            raise OperationCancelled(self.name) from None
        except TimeoutError:
            if self._future.done():
                raise  # the operation's own error (an ExecTimeout...)
            raise self._waited_too_long(limit) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait until done, then return the operation's error (``None`` if it succeeded;
        :class:`~asyncsandbox.OperationCancelled` if cancelled). Blocks; ``timeout`` as for
        :meth:`result`."""
        check_blocking_allowed("Handle.exception()")
        limit = check.seconds("timeout", timeout)
        try:
            return self._future.exception(limit)
        except concurrent.futures.CancelledError:
            return OperationCancelled(self.name)
        except TimeoutError:
            raise self._waited_too_long(limit) from None

    def _waited_too_long(self, limit: float | None) -> TimeoutError:
        return TimeoutError(
            f"{self.name} did not finish within {limit:g}s (the timeout of this wait, not "
            "of the command); it keeps running: wait again, or cancel() it"
        )

    def add_done_callback(self, callback: Callable[[Handle[T]], object]) -> None:
        """Call ``callback(handle)`` once the operation is done (at once if it is). It runs
        in the event loop thread, or in this one if already done: it must not block."""
        self._future.add_done_callback(lambda _: callback(self))

    def done(self) -> bool:
        """True once it finished: with a value, an error, or cancelled. Never blocks."""
        return self._future.done()

    def cancelled(self) -> bool:
        """True if it was cancelled. Never blocks."""
        return self._future.cancelled()

    def cancel(self) -> bool:
        """Cancel the operation; return False if it had already finished.

        Cancellation: cancels the task running the operation in the event loop, as
        cancelling an ``await`` would: a running command is killed (its whole process tree)
        and a sandbox being started is undone. Returns at once; that cleanup finishes in the
        background (``SyncSession.close()`` waits for it). The handle is done immediately.
        """
        return self._future.cancel()

    def __repr__(self) -> str:
        f = self._future
        if not f.done():
            state = "pending"
        elif f.cancelled():
            state = "cancelled"
        else:
            state = "failed" if f.exception() is not None else "done"
        return f"<Handle {self.name} {state}>"


def _check_handles(handles: Iterable[Handle[Any]]) -> builtins.list[Handle[Any]]:
    given: object = handles  # typed as a list, but callers pass anything
    if isinstance(given, Handle):
        raise InvalidArgument("expected a list of Handles, got a single Handle")
    out = builtins.list(dict.fromkeys(handles))
    for handle in out:
        if not isinstance(handle, Handle):
            raise InvalidArgument(
                f"expected Handle objects (from asyncsandbox.sync), got {type(handle).__name__}"
            )
    return out


def wait(
    handles: Iterable[Handle[Any]],
    *,
    num_returns: int | None = None,
    timeout: float | None = None,
) -> tuple[builtins.list[Handle[Any]], builtins.list[Handle[Any]]]:
    """Wait until ``num_returns`` of ``handles`` are done (all, by default) or ``timeout``
    seconds passed; return ``(done, pending)``: ``done`` in order of completion (those
    already done first, in the order given; at most ``num_returns``), ``pending`` in the
    order given. The seeds' loop works as is::

        while pending:
            [handle], pending = wait(pending, num_returns=1)

    A failed or cancelled handle counts as done; ``handle.result()`` raises its error.
    Handles still pending when the wait ends keep running. Blocks.
    """
    check_blocking_allowed("asyncsandbox.sync.wait()")
    items = _check_handles(handles)
    wanted = len(items) if num_returns is None else check.positive_int("num_returns", num_returns)
    deadline = _deadline(timeout)
    done: builtins.list[Handle[Any]] = []
    if wanted and items:
        try:
            for handle in _completed(items, deadline):
                done.append(handle)
                if len(done) >= wanted:
                    break
        except TimeoutError:
            pass
    chosen = set(map(id, done))
    return done, [h for h in items if id(h) not in chosen]


def as_completed(
    handles: Iterable[Handle[Any]], *, timeout: float | None = None
) -> Iterator[Handle[Any]]:
    """Yield each of ``handles`` as it finishes (those already done first, in the order
    given). Blocks while waiting.

    ``timeout`` bounds the whole iteration, from this call; past it, the builtin
    :class:`TimeoutError` is raised and the remaining handles keep running.
    """
    check_blocking_allowed("asyncsandbox.sync.as_completed()")
    return _completed(_check_handles(handles), _deadline(timeout))


def _deadline(timeout: float | None) -> float | None:
    limit = check.seconds("timeout", timeout)
    return None if limit is None else time.monotonic() + limit


def _completed(
    handles: builtins.list[Handle[Any]], deadline: float | None
) -> Iterator[Handle[Any]]:
    # Those already done first, in a deterministic order (concurrent.futures would yield
    # them in set order); its as_completed() removes its waiters when we stop early.
    ready: builtins.list[Handle[Any]] = []
    running: dict[Future[Any], Handle[Any]] = {}
    for handle in handles:
        if handle.done():
            ready.append(handle)
        else:
            running[handle._future] = handle
    yield from ready
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    for future in concurrent.futures.as_completed(running, remaining):
        yield running[future]
