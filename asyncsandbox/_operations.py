"""Operations running in the background of a Session, and helpers to consume them as they
complete (``wait``, ``as_completed``), for code that launches many commands at once."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterable
from contextlib import suppress
from typing import Any, Generic, TypeVar, cast, final

import anyio
import anyio.abc

from ._errors import InvalidArgument, OperationCancelled
from ._validate import positive_int, seconds

__all__ = ("Operation", "as_completed", "start", "wait")

T = TypeVar("T")

_PENDING, _DONE, _FAILED, _CANCELLED = range(4)


@final
class Operation(Generic[T]):
    """A handle to an awaitable running in a Session's task group (``session.submit``).

    Await it (``await op``) for its value, or its exception. Failures stay inside the
    handle: they never crash the session or other operations.
    """

    def __init__(self, awaitable: Awaitable[T], name: str) -> None:
        self.name = name
        self._awaitable: Awaitable[T] | None = awaitable
        self._state = _PENDING
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._cancel_requested = False
        self._callbacks: list[Callable[[Operation[Any]], None]] = []

    async def _run(self) -> None:
        awaitable, self._awaitable = self._awaitable, None
        assert awaitable is not None
        try:
            with anyio.CancelScope() as self._scope:
                if self._cancel_requested:
                    self._scope.cancel()
                value = await awaitable
                self._finish(_DONE, value=value)
        except Exception as exc:  # noqa: BLE001 - kept in the handle, raised by result()
            self._finish(_FAILED, error=exc)
        finally:
            # Cancelled by op.cancel() (absorbed by our scope) or by the session closing
            # (propagates on from here): either way, waiters must wake up.
            if self._state == _PENDING:
                self._finish(_CANCELLED)

    def _discard(self) -> None:
        """Never started (its session closed first): mark cancelled, close the coroutine."""
        awaitable, self._awaitable = self._awaitable, None
        if awaitable is not None and hasattr(awaitable, "close"):
            awaitable.close()
        if self._state == _PENDING:
            self._finish(_CANCELLED)

    def _finish(
        self, state: int, *, value: T | None = None, error: BaseException | None = None
    ) -> None:
        self._state, self._value, self._error = state, value, error
        self._done.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def _on_done(self, callback: Callable[[Operation[Any]], None]) -> None:
        if self._state == _PENDING:
            self._callbacks.append(callback)
        else:
            callback(self)

    def done(self) -> bool:
        """True once it finished: with a value, an error, or cancelled."""
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self) -> None:
        """Cancel it (its command is killed, its sandbox call undone). No effect once done."""
        if self._state != _PENDING:
            return
        self._cancel_requested = True
        if self._scope is not None:
            self._scope.cancel()

    def exception(self) -> BaseException | None:
        """Its error, ``None`` if it succeeded. Only valid once done."""
        if self._state == _PENDING:
            raise InvalidArgument(f"operation {self.name!r} is still running")
        if self._state == _CANCELLED:
            return OperationCancelled(self.name)
        return self._error

    def result(self) -> T:
        """Its value, or raise its error. Only valid once done (use ``await op`` to wait)."""
        error = self.exception()
        if error is not None:
            raise error
        return self._value  # type: ignore[return-value]

    async def wait(self) -> T:
        """Wait until done, then return its value or raise its error.

        Cancellation: cancelling the waiter does not cancel the operation.
        """
        await self._done.wait()
        return self.result()

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        state = ("pending", "done", "failed", "cancelled")[self._state]
        return f"<Operation {self.name} {state}>"


def _check_ops(ops: Iterable[Operation[Any]], function: str) -> list[Operation[Any]]:
    given: object = ops  # typed as a list, but callers pass anything
    if isinstance(given, Operation):
        raise InvalidArgument(f"{function}() takes a list of operations, not one operation")
    checked = list(ops)
    for op in cast("list[object]", checked):
        if not isinstance(op, Operation):
            kind = type(op)
            if kind.__module__ == "asyncsandbox.sync" or kind.__name__ == "Handle":
                raise InvalidArgument(
                    f"asyncsandbox.{function}() waits for Operations of the async API (from "
                    f"session.submit); for Handles of asyncsandbox.sync use "
                    f"asyncsandbox.sync.{function}(), which blocks"
                )
            raise InvalidArgument(
                f"expected Operation handles (from session.submit), got {kind.__name__}"
            )
    return checked


def wait(
    operations: Iterable[Operation[Any]],
    *,
    num_returns: int | None = None,
    timeout: float | None = None,
) -> Coroutine[Any, Any, tuple[list[Operation[Any]], list[Operation[Any]]]]:
    """Wait until ``num_returns`` of ``operations`` are done (all, by default) or ``timeout``
    seconds passed; return ``(done, pending)``: ``done`` in order of completion (at most
    ``num_returns``), ``pending`` in the order given. Use it as ``await wait(...)``.

    A failed operation counts as done; its error is raised by ``op.result()``. Operations
    still pending when the wait ends keep running. The arguments are checked when it is
    called (before any ``await``): Handles of :mod:`asyncsandbox.sync` raise
    :class:`InvalidArgument` at once, pointing to :func:`asyncsandbox.sync.wait`.

    Cancellation: cancelling the wait does not cancel the operations.
    """
    ops = _check_ops(operations, "wait")
    wanted = len(ops) if num_returns is None else positive_int("num_returns", num_returns)
    return _wait(ops, min(wanted, len(ops)), seconds("timeout", timeout))


async def _wait(
    ops: list[Operation[Any]], wanted: int, limit: float | None
) -> tuple[list[Operation[Any]], list[Operation[Any]]]:
    enough = anyio.Event()
    completed: list[Operation[Any]] = []

    def on_done(op: Operation[Any]) -> None:
        completed.append(op)
        if len(completed) >= wanted:
            enough.set()

    if wanted == 0:
        enough.set()
    for op in ops:
        op._on_done(on_done)
    with anyio.move_on_after(math.inf if limit is None else limit):
        await enough.wait()
    # Freeze the answer now: callbacks of operations finishing later must not change it.
    done = completed[:wanted]
    chosen = set(map(id, done))
    return done, [op for op in ops if id(op) not in chosen]


def start(
    awaitable: Awaitable[T], name: str, task_group: anyio.abc.TaskGroup | None
) -> Operation[T]:
    """The operation of ``awaitable``, running in ``task_group``; with none (its session
    is closed), cancelled before it started (its coroutine closed)."""
    op = Operation(awaitable, name)
    if task_group is None:
        op._discard()
    else:
        task_group.start_soon(op._run, name=f"asyncsandbox:{op.name}")
    return op


def as_completed(
    operations: Iterable[Operation[Any]], *, timeout: float | None = None
) -> AsyncIterator[Operation[Any]]:
    """Yield each of ``operations`` as it finishes (fastest first): ``async for op in
    as_completed(ops)``.

    ``timeout`` bounds the whole iteration; past it, :class:`TimeoutError` is raised and
    the remaining operations keep running. The arguments are checked when it is called, as
    for :func:`wait`.
    """
    ops = _check_ops(operations, "as_completed")
    return _as_completed(ops, seconds("timeout", timeout))


async def _as_completed(
    ops: list[Operation[Any]], limit: float | None
) -> AsyncIterator[Operation[Any]]:
    deadline = math.inf if limit is None else anyio.current_time() + limit
    send, receive = anyio.create_memory_object_stream[Operation[Any]](len(ops) or 1)

    def on_done(op: Operation[Any]) -> None:
        # The iteration may have ended (timeout, break) before this operation finished.
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            send.send_nowait(op)

    with send, receive:
        for op in ops:
            op._on_done(on_done)
        for _ in ops:
            # The deadline scope covers only the receive, never the yield (flake8-async 119).
            with anyio.fail_after(deadline - anyio.current_time() if limit is not None else None):
                op = await receive.receive()
            yield op
