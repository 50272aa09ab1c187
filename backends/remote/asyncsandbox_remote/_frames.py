"""The frame readers of streamed answers: an exec's frames (:class:`Frames`), a
``run_code`` call's (:func:`code_frames`) and a download's chunks (:class:`Chunks`).
Each stream is newline-delimited JSON; every failure is translated by ``_transport``."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Self, cast

import anyio
import httpx
import msgspec

from asyncsandbox import BackendUnavailable, Execution, InfrastructureError, SandboxError
from asyncsandbox.abc import CodeEventCallback, ExitStatus, OutputCallback

from . import _wire as w
from ._transport import mapped, transport_error

__all__ = ("TIMEOUT_GRACE", "Chunks", "Frames", "code_frames")

TIMEOUT_GRACE = 1.0
"""How long past a command's timeout the client waits for the server to report that it
killed the command (the server starts the clock later, by the request's latency), before
killing it by id instead."""
MAX_FRAME_BYTES = 64 * 1024 * 1024


async def _lines(response: httpx.Response, what: str) -> AsyncGenerator[bytes, None]:
    """The non-empty lines of a streamed answer, read to its end (the connection is
    reused, and nothing of it is left to the garbage collector)."""
    buffer = bytearray()
    raw = cast(AsyncGenerator[bytes, None], response.aiter_raw())
    async with aclosing(raw) as chunks:
        async for chunk in chunks:
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                line = bytes(buffer[start:end])
                start = end + 1
                if line:
                    yield line
            del buffer[:start]
            if len(buffer) > MAX_FRAME_BYTES:
                raise InfrastructureError(f"the server sent {what} frame over 64 MiB")


class Frames:
    """The frames of one command's exec stream, read by a task of their own in a shielded
    scope: a cancellation of the exec never cuts a read short (httpx closes a connection
    whose read was cancelled), so the exec can still receive the command's end from the
    server, which enforces the command's timeout (:meth:`end_at`).

    :param base_url: the server (for error messages).
    :param sandbox_id: the sandbox the command runs in.
    """

    def __init__(
        self,
        response: httpx.Response,
        on_output: OutputCallback,
        *,
        base_url: str,
        sandbox_id: str,
    ) -> None:
        self._response = response
        self._on_output = on_output
        self._base_url = base_url
        self._sandbox_id = sandbox_id
        self._scope = anyio.CancelScope(shield=True)
        self.done = anyio.Event()
        self._status: ExitStatus | None = None
        self._timed_out = False
        """The server killed the command at its timeout."""
        self._error: Exception | None = None

    @property
    def over(self) -> bool:
        """The server said the command ended (its exit status, or an error but a lost link)."""
        return self._status is not None or (
            self._error is not None and not isinstance(self._error, BackendUnavailable)
        )

    async def read(self) -> None:
        """Read to the end of the stream (or until :meth:`end_at` gives up on it)."""
        with self._scope:
            try:
                await self._read()
            except Exception as exc:  # noqa: BLE001 - raised by outcome(), in the exec's task
                self._error = exc
        self.done.set()

    async def end_at(self, deadline: float | None, *, cleanup: float) -> None:
        """The exec is cancelled: stop reading, except when the cancellation is the
        command's own timeout (it came within ``TIMEOUT_GRACE`` of ``deadline``). The
        server kills the command then and sends its exit frame: wait for it, shielded,
        for ``TIMEOUT_GRACE`` past the deadline (at most ``cleanup``). Without it, the
        caller kills the command by id."""
        with anyio.CancelScope(shield=True):
            now = anyio.current_time()
            if deadline is not None and deadline - now <= TIMEOUT_GRACE:
                with anyio.move_on_after(min(deadline + TIMEOUT_GRACE - now, cleanup)):
                    await self.done.wait()
        self._scope.cancel()

    async def outcome(self) -> ExitStatus:
        """How the command ended, once :meth:`read` is done: its exit status, or the
        error that stopped the stream."""
        if self._error is not None:
            raise self._error
        assert self._status is not None
        if self._timed_out:
            # The server's timeout fired first, which means our own deadline has passed
            # too (the server started the command after us) and its cancellation is on its
            # way: a status returned now would be taken as the command's own end.
            with anyio.move_on_after(TIMEOUT_GRACE):
                await anyio.sleep_forever()
        return self._status

    async def _read(self) -> None:
        try:
            async with aclosing(_lines(self._response, "an exec")) as lines:
                async for line in lines:
                    await self._frame(line)
        except httpx.HTTPError as exc:
            if self._error is not None or self._status is not None:
                return  # the command's end arrived; only the connection's end was lost
            raise transport_error(exc, self._base_url, "exec") from exc
        if self._error is None and self._status is None:  # the exit or error frame is last
            raise InfrastructureError(
                "the sandbox server ended the exec stream without the command's exit status",
                retryable=False,
            )

    async def _frame(self, line: bytes) -> None:
        """Deliver an output frame; note how the command ended if this frame says so."""
        try:
            frame = w.decode_frame(line)
        except msgspec.DecodeError as exc:
            raise InfrastructureError(f"invalid exec frame from the server: {exc}") from None
        if isinstance(frame, w.OutputFrame):
            if frame.stream == "stdout":
                await self._on_output("stdout", frame.data)
            elif frame.stream == "stderr":
                await self._on_output("stderr", frame.data)
        elif isinstance(frame, w.ExitFrame):
            self._status = ExitStatus(
                returncode=frame.returncode,
                signal=frame.signal,
                oom_killed=frame.oom_killed,
                cpu_time=frame.cpu_time,
            )
            self._timed_out = frame.timed_out
        elif isinstance(frame, w.ErrorFrame):
            self._error = mapped(
                500, frame.error, base_url=self._base_url, sandbox_id=self._sandbox_id
            )


async def code_frames(
    response: httpx.Response, on_event: CodeEventCallback, *, base_url: str, sandbox_id: str
) -> Execution:
    """Deliver a ``run_code`` stream's events; return the execution of its end frame (or
    raise the error of an error frame) once the stream is read to its end."""
    execution: Execution | None = None
    error: SandboxError | None = None
    try:
        async with aclosing(_lines(response, "a run_code")) as lines:
            async for line in lines:
                try:
                    frame = w.decode_code_frame(line)
                except msgspec.DecodeError as exc:
                    raise InfrastructureError(
                        f"invalid run_code frame from the server: {exc}"
                    ) from None
                if isinstance(frame, w.CodeEndFrame):
                    execution = frame.execution
                elif isinstance(frame, w.ErrorFrame):
                    error = mapped(500, frame.error, base_url=base_url, sandbox_id=sandbox_id)
                elif frame is not None and not isinstance(frame, w.PingFrame):
                    await on_event(frame)
    except httpx.HTTPError as exc:
        if execution is None and error is None:
            raise transport_error(exc, base_url, "run_code") from exc
    if error is not None:
        raise error
    if execution is None:
        raise InfrastructureError(
            "the sandbox server ended the run_code stream without the execution",
            retryable=False,
        )
    return execution


class Chunks:
    """The body of a download, with transport errors translated."""

    def __init__(self, response: httpx.Response, base_url: str) -> None:
        self._chunks = response.aiter_raw()
        self._base_url = base_url

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._chunks)
        except httpx.HTTPError as exc:
            raise transport_error(exc, self._base_url, "download") from exc

    async def aclose(self) -> None:
        await self._chunks.aclose()  # type: ignore[attr-defined]
