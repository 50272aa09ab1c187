"""The server's error answers: every failure becomes one JSON :class:`~._wire.ErrorResponse`
with a status and a stable ``code``, which the client maps back onto the asyncsandbox
error tree (``_client._mapped``). The one place that decides which status an error gets.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from asyncsandbox import (
    BackendTimeout,
    BackendUnavailable,
    CapacityTimeout,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxNotFound,
    SandboxOOMKilled,
)
from asyncsandbox.log import get_logger

from . import _wire as w

__all__ = (
    "HttpError",
    "bad_request",
    "error_for",
    "error_response",
    "no_route",
    "not_found",
    "too_large",
)

log = get_logger("asyncsandbox.remote")

CLIENT_CLOSED_REQUEST = 499
"""What the metrics record for a request whose client left before its answer."""


class HttpError(Exception):
    """An error answer: status, a stable code, a message for people."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = w.ErrorBody(code=code, message=message, **fields)
        self.headers = headers or {}

    def response(self) -> Response:
        return Response(
            w.ERROR.encode(w.ErrorResponse(error=self.body)),
            status_code=self.status,
            media_type="application/json",
            headers=self.headers,
        )


def _file_status(exc: SandboxFileError) -> int:
    return {"not_found": 404, "permission": 403, "too_large": 413}.get(exc.reason.value, 409)


def error_for(exc: SandboxError, sandbox_id: str | None = None) -> HttpError:
    """The HTTP answer for an asyncsandbox error (the client maps it back)."""
    message = str(exc)
    if isinstance(exc, InvalidArgument):
        return HttpError(400, "invalid_argument", message)
    if isinstance(exc, SandboxNotFound):
        return HttpError(404, "sandbox_not_found", message, sandbox_id=exc.sandbox_id)
    if isinstance(exc, SandboxClosed):
        return HttpError(
            404, "sandbox_not_found", f"sandbox {sandbox_id!r} was removed", sandbox_id=sandbox_id
        )
    if isinstance(exc, SandboxFileError):
        return HttpError(
            _file_status(exc),
            "file_error",
            message,
            reason=exc.reason.value,
            path=exc.path,
            detail=exc.detail,
        )
    if isinstance(exc, SandboxOOMKilled):
        return HttpError(
            410, "sandbox_oom_killed", message, sandbox_id=exc.sandbox_id, reason=exc.reason
        )
    if isinstance(exc, SandboxDied):
        return HttpError(410, "sandbox_died", message, sandbox_id=exc.sandbox_id, reason=exc.reason)
    if isinstance(exc, CapacityTimeout):
        return HttpError(
            429, "capacity_timeout", f"the server is at capacity: {message}", retryable=True
        )
    if isinstance(exc, BackendUnavailable):
        return HttpError(503, "backend_unavailable", message, retryable=exc.retryable)
    if isinstance(exc, BackendTimeout):
        return HttpError(504, "backend_timeout", message, detail=exc.operation)
    if isinstance(exc, LaunchError):
        # The command never ran: the client raises LaunchError, never an exit status. Not
        # retryable any more: the server's Session already retried it under its own
        # RetryPolicy (a client retrying too would multiply the attempts).
        return HttpError(502, "launch_error", message, sandbox_id=sandbox_id, retryable=False)
    if isinstance(exc, InfrastructureError):
        return HttpError(502, "infrastructure_error", message, retryable=exc.retryable)
    return HttpError(500, "internal_error", f"{type(exc).__name__}: {message}")


def error_response(exc: Exception, *, operation: str, sandbox_id: str | None) -> Response:
    """The answer of a request whose handler raised ``exc``: an :class:`HttpError` as
    is, an asyncsandbox error by :func:`error_for`, anything else (a bug) logged and
    answered 500 without details."""
    if isinstance(exc, HttpError):
        return exc.response()
    if isinstance(exc, SandboxError):
        return error_for(exc, sandbox_id).response()
    if isinstance(exc, ClientDisconnect):
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    log.error("remote.request.failed", operation=operation, error=repr(exc))
    return HttpError(500, "internal_error", "internal server error").response()


def not_found(sandbox_id: str) -> HttpError:
    """The answer for a sandbox this tenant does not have (whoever else may have it)."""
    sandbox_id = sandbox_id[:128]
    return HttpError(
        404, "sandbox_not_found", f"sandbox {sandbox_id!r} not found", sandbox_id=sandbox_id
    )


def bad_request(message: str) -> HttpError:
    return HttpError(400, "invalid_argument", message)


def too_large(limit: int) -> HttpError:
    return HttpError(
        413,
        "request_too_large",
        f"the request body exceeds the server's limit of {limit} bytes",
    )


async def no_route(request: Request, exc: Exception) -> Response:
    """Starlette's answer for an unknown path (404) or method (405), in our format."""
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return HttpError(405, "method_not_allowed", "method not allowed on this path").response()
    return HttpError(404, "not_found", f"no such path: {request.url.path[:200]}").response()
