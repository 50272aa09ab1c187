"""What a Sandbox's streamed calls give (``exec_stream``, ``run_code_stream``): a stream the
caller iterates, fed by the call running in a task beside the caller's block; and
``run_code``'s callbacks, as one event callback."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Self, TypeVar, cast

import anyio
import anyio.abc

from ._errors import InvalidArgument
from ._interpreter._models import CodeEvent, Execution, ExecutionError, OutputMessage, Result
from ._models import ExecResult, OutputChunk, Stream
from ._util import single_error

__all__ = ("Callbacks", "CodeStream", "ExecStream", "OutputHandler", "code_stream", "exec_stream")

E = TypeVar("E")

OutputHandler = Callable[[E], Awaitable[object] | object]
"""A ``run_code`` callback (``on_stdout=``, ...): a function or a coroutine function of
one event, called as the event comes (in the event loop's thread)."""


class ExecStream:
    """A running command from :meth:`Sandbox.exec_stream`: iterate for output chunks."""

    def __init__(self, receive: anyio.abc.ObjectReceiveStream[OutputChunk]) -> None:
        self._receive = receive
        self._result: ExecResult | None = None
        self._error: Exception | None = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> OutputChunk:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def wait(self) -> ExecResult:
        """Wait for the command to finish (discarding output not iterated yet) and return
        its result; raises as :meth:`Sandbox.exec` would (:class:`ExecTimeout`, ...)."""
        async for _ in self:
            pass
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class CodeStream:
    """Running code from :meth:`Sandbox.run_code_stream`: iterate for its events
    (:class:`OutputMessage`, :class:`Result`, :class:`ExecutionError`) as they come."""

    def __init__(self, receive: anyio.abc.ObjectReceiveStream[CodeEvent]) -> None:
        self._receive = receive
        self._execution: Execution | None = None
        self._error: Exception | None = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> CodeEvent:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def wait(self) -> Execution:
        """Wait for the code to finish (discarding events not iterated yet) and return its
        :class:`Execution`; raises as :meth:`Sandbox.run_code` would
        (:class:`ExecTimeout`, ...)."""
        async for _ in self:
            pass
        if self._error is not None:
            raise self._error
        assert self._execution is not None
        return self._execution


@asynccontextmanager
async def exec_stream(
    run: Callable[[Callable[[Stream, bytes], Awaitable[None]]], Awaitable[ExecResult]],
) -> AsyncIterator[ExecStream]:
    """An :class:`ExecStream` of ``run(forward)``, a command run in a task beside the
    block, which forwards its output as it comes; leaving the block cancels it."""
    send, receive = anyio.create_memory_object_stream[OutputChunk](16)
    stream = ExecStream(receive)

    async def forward(name: Stream, data: bytes) -> None:
        # The reader may have left the block; the command is being killed then.
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await send.send(OutputChunk(name, data))

    async def produce() -> None:
        async with send:
            try:
                stream._result = await run(forward)
            except Exception as exc:  # noqa: BLE001 - delivered by stream.wait()
                stream._error = exc

    with single_error():
        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(produce)
            yield stream
            tg.cancel_scope.cancel()


@asynccontextmanager
async def code_stream(
    run: Callable[[Callable[[CodeEvent], Awaitable[None]]], Awaitable[Execution]],
) -> AsyncIterator[CodeStream]:
    """A :class:`CodeStream` of ``run(forward)``, code run in a task beside the block,
    which forwards its events as they come; leaving the block cancels it."""
    send, receive = anyio.create_memory_object_stream[CodeEvent](16)
    stream = CodeStream(receive)

    async def forward(event: CodeEvent) -> None:
        # The reader may have left the block; the code is being interrupted then.
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await send.send(event)

    async def produce() -> None:
        async with send:
            try:
                stream._execution = await run(forward)
            except Exception as exc:  # noqa: BLE001 - delivered by stream.wait()
                stream._error = exc

    with single_error():
        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(produce)
            yield stream
            tg.cancel_scope.cancel()


class Callbacks:
    """``run_code``'s E2B-style callbacks, as one event callback."""

    def __init__(
        self,
        on_stdout: OutputHandler[OutputMessage] | None,
        on_stderr: OutputHandler[OutputMessage] | None,
        on_result: OutputHandler[Result] | None,
        on_error: OutputHandler[ExecutionError] | None,
    ) -> None:
        for name, value in (
            ("on_stdout", on_stdout),
            ("on_stderr", on_stderr),
            ("on_result", on_result),
            ("on_error", on_error),
        ):
            if value is not None and not callable(value):
                raise InvalidArgument(f"{name} must be callable, got {value!r}")
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_result = on_result
        self._on_error = on_error

    async def __call__(self, event: CodeEvent) -> None:
        handler: Callable[[Any], object] | None
        if isinstance(event, OutputMessage):
            handler = cast(Any, self._on_stderr if event.error else self._on_stdout)
        elif isinstance(event, Result):
            handler = cast(Any, self._on_result)
        else:
            handler = cast(Any, self._on_error)
        if handler is not None:
            outcome = handler(event)
            if inspect.isawaitable(outcome):
                await outcome
