"""The SDK's futures over :mod:`asyncsandbox.sync`'s handles: :class:`OperationRef` (and
its :class:`Process`), :class:`StreamReader`, and the threads that let the SDK's calls be
made from a thread that runs an event loop."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, final

import anyio
import anyio.to_thread

from .. import sync
from .._eventloop import running_event_loop
from ._types import ProcessResult, SandboxTimeoutError, process_result, translate

__all__ = (
    "OperationRef",
    "Process",
    "StreamReader",
    "add_done_callback",
    "in_thread",
    "off_loop",
    "resolved",
    "results",
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S", str, bytes)


class _Source(Protocol[T_co]):
    """What an OperationRef waits on: a sync Handle, a thread's future, or a value."""

    def done(self) -> bool: ...
    def result(self, timeout: float | None = None) -> T_co: ...
    def cancel(self) -> bool: ...
    def add_done_callback(self, callback: Callable[[Any], object]) -> None: ...


class _FutureSource(Generic[T]):
    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> T:
        return self._future.result(timeout)

    def cancel(self) -> bool:
        return self._future.cancel()

    def add_done_callback(self, callback: Callable[[Any], object]) -> None:
        self._future.add_done_callback(lambda _: callback(self))


class _Done(Generic[T]):
    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def cancel(self) -> bool:
        return False

    def add_done_callback(self, callback: Callable[[Any], object]) -> None:
        callback(self)


_hops = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="asyncsandbox.compat")


def off_loop(func: Callable[[], T]) -> T:
    """``func()``, here, or in a worker thread when this thread runs an event loop: the
    blocking facade refuses calls from event loop threads, the SDK's API allows them (its
    calls return futures at once). The hop is as short as a hand-over to the sandbox
    event loop; like the SDK's own calls, it blocks the caller's loop for that long."""
    if running_event_loop() is None:
        return func()
    return _hops.submit(func).result()


def in_thread(func: Callable[[], T], name: str) -> _FutureSource[T]:
    """Run a blocking call in a thread of its own, as a future (the SDK's non-blocking
    ``close()`` and friends)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(func())
        except BaseException as exc:  # noqa: BLE001 - delivered by the future
            future.set_exception(exc)

    threading.Thread(target=run, name=f"asyncsandbox.compat:{name}", daemon=True).start()
    return _FutureSource(future)


class OperationRef(Generic[T]):
    """A running operation (the SDK's future): ``result(timeout=None)`` blocks for its
    value, ``await ref`` waits without blocking the event loop.

    ``result(timeout)`` raises the builtin ``TimeoutError`` past ``timeout`` and leaves the
    operation running, as the SDK does. Errors are the SDK's (``SandboxTimeoutError``,
    ``SandboxFileError``...), with asyncsandbox's original as ``__cause__``.
    """

    def __init__(
        self,
        source: _Source[Any],
        convert: Callable[[Any], T] = lambda value: value,
        *,
        name: str = "operation",
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> None:
        self._source = source
        self._convert = convert
        self._name = name
        self._deadline = deadline  # monotonic; past it the operation is cancelled
        self._timeout = timeout  # for messages

    @classmethod
    def _done(cls, value: T | None = None, error: BaseException | None = None) -> OperationRef[T]:
        return cls(_Done(value, error))

    def result(self, timeout: float | None = None) -> T:
        """Wait until done; return the value or raise the operation's error. Blocks."""
        wait, by_deadline = timeout, False
        if self._deadline is not None:
            remaining = max(0.0, self._deadline - time.monotonic())
            if wait is None or remaining <= wait:
                wait, by_deadline = remaining, True
        try:
            value = self._source.result(wait)
        except TimeoutError as exc:
            if self._source.done():
                raise self._translated(exc) from exc  # the operation's own timeout
            if by_deadline:
                self._source.cancel()
                raise SandboxTimeoutError(
                    f"{self._name} did not finish within {self._timeout:g}s (cancelled)"
                ) from None
            raise
        except sync.RunningEventLoopError:
            raise  # a usage error with its own advice: keep it as it is
        except BaseException as exc:
            translated = self._translated(exc)
            if translated is exc:
                raise
            raise translated from exc
        return self._convert(value)

    def _translated(self, exc: BaseException) -> BaseException:
        return translate(exc, timeout=self._timeout)

    def done(self) -> bool:
        """True once finished (with a value, an error, or cancelled). Never blocks."""
        return self._source.done()

    def cancel(self) -> bool:
        """Cancel the operation (a running command is killed); False if already done."""
        return self._source.cancel()

    async def _wait(self) -> T:
        try:
            return await anyio.to_thread.run_sync(self.result, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self.cancel()  # as the SDK: cancelling the awaiting task cancels the operation
            raise

    def __await__(self) -> Generator[Any, None, T]:
        return self._wait().__await__()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name} {'done' if self.done() else 'pending'}>"


@final
class StreamReader(Generic[S]):
    """A command's output stream (``process.stdout``). Iterating gives the output once the
    command finished, as one chunk (asyncsandbox delivers streaming output through
    ``asyncsandbox.Sandbox.exec_stream``; this one does not stream)."""

    def __init__(self, read: Callable[[], S]) -> None:
        self._read: Callable[[], S] = read

    def __iter__(self) -> Iterator[S]:
        data = self._read()
        if data:
            yield data

    async def __aiter__(self) -> AsyncIterator[S]:
        data = await anyio.to_thread.run_sync(self._read, abandon_on_cancel=True)
        if data:
            yield data

    def close(self) -> None:
        """Stop reading (nothing to release here)."""


@final
class Process(OperationRef[ProcessResult]):
    """A command started by :meth:`Sandbox.exec`: a future of its
    :class:`ProcessResult` (str ``stdout``/``stderr``, ``returncode``).

    ``result()`` raises :class:`SandboxTimeoutError` when the command ran past its
    ``timeout_seconds`` (it was killed), :class:`SandboxExecutionError` for ``check=True``
    and a non-zero exit. ``cancel()`` kills it.
    """

    def __init__(self, handle: sync.Handle[Any], command: list[str], timeout: float | None) -> None:
        super().__init__(handle, process_result, name="exec", timeout=timeout)
        self._command = command
        self.stdout: StreamReader[str] = StreamReader(lambda: self.result().stdout)
        """The command's standard output (see :class:`StreamReader`)."""
        self.stderr: StreamReader[str] = StreamReader(lambda: self.result().stderr)
        """The command's standard error."""
        self.stdin: None = None
        """Interactive stdin (``exec(stdin=True)``) is not supported: always None."""

    @property
    def command(self) -> list[str]:
        """The command, as given."""
        return list(self._command)

    @property
    def returncode(self) -> int | None:
        """The exit status once finished (None before, and when it failed to finish)."""
        return self.poll()

    def poll(self) -> int | None:
        """The exit status if finished, else None. Never blocks."""
        if not self.done():
            return None
        try:
            return self.result(0).returncode
        except Exception:  # noqa: BLE001 - a failed command has no exit status
            return None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command and return its exit status. Blocks."""
        return self.result(timeout).returncode


def results(refs: OperationRef[T] | Sequence[OperationRef[T]], /) -> T | list[T]:
    """``.result()`` of one ref, or of each ref of a sequence, in order (the first error
    propagates). Blocks."""
    if isinstance(refs, OperationRef):
        return refs.result()
    return [ref.result() for ref in refs]


def resolved(value: T | None = None, error: BaseException | None = None) -> OperationRef[T]:
    """A ref already done, with ``value`` or raising ``error``."""
    return OperationRef._done(value, error)


def add_done_callback(ref: OperationRef[Any], callback: Callable[[Any], object]) -> None:
    """Call ``callback`` once ``ref`` is done (at once if it is)."""
    ref._source.add_done_callback(callback)
