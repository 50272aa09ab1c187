"""Bodies as streams, at the ASGI level: request bodies read within a limit (whole, or
as chunks handed to the runtime), responses that stream (exec frames, archives), and the
client's disconnect turned into a cancellation of the work it asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from asyncsandbox import SandboxError

from . import _wire as w
from ._errors import bad_request, too_large

__all__ = (
    "RequestBody",
    "Streamed",
    "decode",
    "json_response",
    "read_body",
    "start_response",
    "until_disconnect",
)

T = TypeVar("T")


# -- requests ---------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused (413) past ``limit`` bytes, declared or read."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise bad_request("invalid Content-Length") from None
        if declared > limit:
            raise too_large(limit)
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > limit:
            raise too_large(limit)
    return bytes(chunks)


async def decode(request: Request, codec: w.Codec[T], limit: int) -> T:
    """The body as the wire type of ``codec`` (400 if it is not one)."""
    data = await read_body(request, limit)
    try:
        return codec.decode(data)
    except msgspec.DecodeError as exc:
        raise bad_request(f"invalid request body: {exc}") from None


class _BodyStopped(SandboxError):
    """Raised in a :class:`RequestBody` handed to the runtime (which lets asyncsandbox
    errors pass untouched): the body could not be read to its end."""


class RequestBody:
    """A streamed request body as chunks for the runtime (``Sandbox.put_archive``),
    bounded by ``limit`` bytes and never held whole. When it stops early, the backend
    reading it fails in its own way; :meth:`raise_stopped` then raises the real cause."""

    def __init__(self, request: Request, limit: int | None) -> None:
        self._request = request
        self._limit = limit
        self._stopped: Exception | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        try:
            async for chunk in self._request.stream():
                total += len(chunk)
                if self._limit is not None and total > self._limit:
                    self._stopped = too_large(self._limit)
                    raise _BodyStopped("the request body is too large")
                if chunk:
                    yield chunk
        except ClientDisconnect as exc:
            self._stopped = exc
            raise _BodyStopped("the client disconnected") from None

    def raise_stopped(self) -> None:
        """If the body stopped early, raise why: 413, or the client's disconnect."""
        if self._stopped is not None:
            raise self._stopped from None


async def until_disconnect(receive: Receive, work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work``; cancel it if the client disconnects. Return True if it did.

    Only for requests whose body was read already (the watcher consumes ``receive``).
    """
    disconnected = False
    error: Exception | None = None

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal disconnected
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                scope.cancel()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group
            error = exc
        finally:
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return disconnected


# -- responses --------------------------------------------------------------------------------


def json_response(codec: w.Codec[T], value: T, status: int = 200, **headers: str) -> Response:
    return Response(
        codec.encode(value), status_code=status, media_type="application/json", headers=headers
    )


class Streamed(Response):
    """A response that runs its own ASGI exchange (streams, disconnect watching)."""

    def __init__(self, run: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._run = run
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._run(scope, receive, send)


async def start_response(send: Send, media_type: str) -> None:
    """Start a streamed 200 answer (its status can no longer change)."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", media_type.encode()),
                (b"cache-control", b"no-store"),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
