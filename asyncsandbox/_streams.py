"""What a Sandbox's streamed calls give (``exec_stream``, ``run_code_stream``): a stream the
caller iterates, fed by the call running in a task beside the caller's block; and
``run_code``'s callbacks, as one event callback."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Generic, Self, TypeVar, cast

import anyio

from ._errors import InvalidArgument
from ._interpreter._models import CodeEvent, Execution, ExecutionError, OutputMessage, Result
from ._models import ExecResult, OutputChunk, Stream
from ._util import single_error

__all__ = ("Callbacks", "CodeStream", "ExecStream", "OutputHandler", "code_stream", "exec_stream")

E = TypeVar("E")
Item = TypeVar("Item")
Outcome = TypeVar("Outcome")

OutputHandler = Callable[[E], Awaitable[object] | object]
"""A ``run_code`` callback (``on_stdout=``, ...): a function or a coroutine function of
one event, called as the event comes (in the event loop's thread)."""


class _Feed(Generic[Item, Outcome]):
    """A call running in a task beside its caller's block, and the channel its items come
    to the caller by: what both streams are made of."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[Item](16)
        self._outcome: Outcome | None = None
        self._error: Exception | None = None

    async def forward(self, item: Item) -> None:
        # The reader may have left the block; the call is being cancelled then.
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._send.send(item)

    async def next(self) -> Item:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def outcome(self) -> Outcome:
        """The call's outcome, once it ended (the items not taken yet are dropped); its
        error is raised."""
        with suppress(StopAsyncIteration):
            while True:
                await self.next()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome

    @asynccontextmanager
    async def running(self, call: Callable[[], Awaitable[Outcome]]) -> AsyncIterator[None]:
        """Run ``call`` in a task for the block; leaving the block cancels it."""

        async def produce() -> None:
            async with self._send:
                try:
                    self._outcome = await call()
                except Exception as exc:  # noqa: BLE001 - delivered by outcome()
                    self._error = exc

        with single_error():
            async with anyio.create_task_group() as tg, self._receive:
                tg.start_soon(produce)
                yield
                tg.cancel_scope.cancel()


class ExecStream:
    """A running command from :meth:`Sandbox.exec_stream`: iterate for output chunks."""

    _feed: _Feed[OutputChunk, ExecResult]

    @classmethod
    def _of(cls, feed: _Feed[OutputChunk, ExecResult]) -> Self:
        # Not an __init__: the stream is the Sandbox's to make (the reference shows none).
        stream = cls.__new__(cls)
        stream._feed = feed
        return stream

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> OutputChunk:
        return await self._feed.next()

    async def wait(self) -> ExecResult:
        """Wait for the command to finish (discarding output not iterated yet) and return
        its result; raises as :meth:`Sandbox.exec` would (:class:`ExecTimeout`, ...)."""
        return await self._feed.outcome()


class CodeStream:
    """Running code from :meth:`Sandbox.run_code_stream`: iterate for its events
    (:class:`OutputMessage`, :class:`Result`, :class:`ExecutionError`) as they come."""

    _feed: _Feed[CodeEvent, Execution]

    @classmethod
    def _of(cls, feed: _Feed[CodeEvent, Execution]) -> Self:
        # Not an __init__: the stream is the Sandbox's to make (the reference shows none).
        stream = cls.__new__(cls)
        stream._feed = feed
        return stream

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> CodeEvent:
        return await self._feed.next()

    async def wait(self) -> Execution:
        """Wait for the code to finish (discarding events not iterated yet) and return its
        :class:`Execution`; raises as :meth:`Sandbox.run_code` would
        (:class:`ExecTimeout`, ...)."""
        return await self._feed.outcome()


@asynccontextmanager
async def exec_stream(
    run: Callable[[Callable[[Stream, bytes], Awaitable[None]]], Awaitable[ExecResult]],
) -> AsyncIterator[ExecStream]:
    """An :class:`ExecStream` of ``run(forward)``, a command run in a task beside the
    block, which forwards its output as it comes; leaving the block cancels it."""
    feed = _Feed[OutputChunk, ExecResult]()

    async def forward(name: Stream, data: bytes) -> None:
        await feed.forward(OutputChunk(name, data))

    async with feed.running(lambda: run(forward)):
        yield ExecStream._of(feed)


@asynccontextmanager
async def code_stream(
    run: Callable[[Callable[[CodeEvent], Awaitable[None]]], Awaitable[Execution]],
) -> AsyncIterator[CodeStream]:
    """A :class:`CodeStream` of ``run(forward)``, code run in a task beside the block,
    which forwards its events as they come; leaving the block cancels it."""
    feed = _Feed[CodeEvent, Execution]()
    async with feed.running(lambda: run(feed.forward)):
        yield CodeStream._of(feed)


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
