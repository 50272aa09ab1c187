"""The handlers of files (``read_file``, ``write_file``, ``upload_archive``,
``download_archive``): one method per operation of :data:`~._openapi.OPERATIONS`, by its
name, through the server's state (:mod:`._serverstate`). They answer errors by raising
them; the application (:mod:`._app`) turns what they raise into answers.

Archives go through the public :class:`asyncsandbox.Sandbox` like everything else (the
Session's limits, error translation and dead-sandbox marking apply).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from asyncsandbox import SandboxError
from asyncsandbox.log import get_logger

from ._errors import HttpError, bad_request, error_for
from ._serverstate import ServerState
from ._streaming import RequestBody, Streamed, read_body, start_response, until_disconnect

__all__ = ("FileHandlers",)

log = get_logger("asyncsandbox.remote")

DEFAULT_READ_LIMIT = 100 * 1024 * 1024
LOOKAHEAD = 1024 * 1024
"""Bytes of an archive read before answering, so that its errors can still get a status."""


class FileHandlers:
    """The file handlers of one server (see the module docstring)."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.config = server.config
        self.tenancy = server.tenancy
        self.metrics = server.metrics

    # -- files ----------------------------------------------------------------

    async def read_file(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)
        limit = _query_int(request, "max_bytes", DEFAULT_READ_LIMIT)
        if limit < 1:
            raise bad_request("max_bytes must be >= 1")
        limit = min(limit, self.config.max_file_bytes)
        async with self.tenancy.use(tenant, record):
            data = await record.sandbox.read_file(path, max_bytes=limit)
        return Response(data, media_type="application/octet-stream")

    async def write_file(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)
        mode = _query_int(request, "mode", 0o644, base=8)
        if not 0 <= mode <= 0o7777:
            raise bad_request("mode must be permission bits in octal, such as 644")
        async with self.tenancy.use(tenant, record):
            data = await read_body(request, self.config.max_file_bytes)
            await record.sandbox.write_file(path, data, mode=mode)
        return Response(status_code=204)

    async def upload_archive(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)
        body = RequestBody(request, self.config.max_upload_bytes)
        async with self.tenancy.use(tenant, record):
            try:
                await record.sandbox.put_archive(path, body)
            except Exception:
                body.raise_stopped()
                raise
        return Response(status_code=204)

    async def download_archive(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            started = False
            failure: HttpError | None = None

            async def work() -> None:
                nonlocal started, failure

                async def emit(chunk: bytes) -> None:
                    nonlocal started
                    if not started:
                        await start_response(send, "application/x-tar")
                        started = True
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})

                try:
                    # Look ahead up to LOOKAHEAD bytes before answering: an archive that
                    # fits is answered only once the backend said it succeeded, so its
                    # errors get a proper status. Past that, it streams (bounded memory),
                    # and a late error can only cut the stream.
                    head = bytearray()
                    ended = False
                    async with record.sandbox.get_archive(path) as chunks:
                        iterator = aiter(chunks)
                        while not ended and len(head) < LOOKAHEAD:
                            try:
                                head += await anext(iterator)
                            except StopAsyncIteration:
                                ended = True
                        if not ended:
                            await emit(bytes(head))
                            head.clear()
                            async for chunk in iterator:
                                await emit(chunk)
                    if ended:
                        await emit(bytes(head))
                except SandboxError as exc:
                    failure = error_for(exc, record.id)
                    if started:
                        # Too late for a status: cut the stream so the client sees it broke.
                        log.warning("remote.archive.failed", sandbox_id=record.id, error=str(exc))
                        raise

            try:
                async with AsyncExitStack() as stack:
                    await stack.enter_async_context(self.tenancy.use(tenant, record))
                    if await until_disconnect(receive, work):
                        return
            except HttpError as exc:
                failure = exc
            except SandboxError as exc:
                failure = failure or error_for(exc, record.id)
                if started:
                    return  # an incomplete body: the client reports a broken transfer
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif failure is not None:
                await failure.response()(scope, receive, send)

        return Streamed(run)


def _query_int(request: Request, name: str, default: int, *, base: int = 10) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw, base)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {raw[:50]!r}") from None
    return value


def _query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise bad_request("the 'path' query parameter is required")
    return path
