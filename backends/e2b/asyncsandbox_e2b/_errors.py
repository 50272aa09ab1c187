"""What E2B's answers and httpx's failures are in asyncsandbox's error tree: the one
place where they are translated (the backend's boundary).

* The control plane answers ``{code, message}`` with an HTTP status.
* A sandbox's envd answers Connect errors (a unary call's status and ``{code, message}``,
  or a stream's end message); E2B's proxy in front of it answers 502 "... was not found"
  for a sandbox that is gone.
* ``/files`` answers plain statuses and messages, which differ between envd versions and
  servers: the file error's reason is read from both.
"""

from __future__ import annotations

import httpx
import msgspec

from asyncsandbox import (
    BackendTimeout,
    BackendUnavailable,
    FileErrorReason,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    RequestNotSent,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxNotFound,
)

from ._wire import ConnectErrorBody, ErrorBody

__all__ = (
    "ConnectFailure",
    "api_error",
    "connect_error",
    "envd_http_error",
    "file_error",
    "gone_message",
    "transport_error",
)

KEY_HINT = "give E2bBackend(api_key=...) or set E2B_API_KEY"


class ConnectFailure(Exception):
    """A Connect error of envd (code and message), before it is given its meaning: the
    caller knows what a ``not_found`` means for its call (a process, a file)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _body(response: httpx.Response) -> ErrorBody:
    try:
        return msgspec.json.decode(response.content, type=ErrorBody)
    except msgspec.DecodeError:
        text = response.content[:300].decode(errors="replace").strip()
        return ErrorBody(code=response.status_code, message=text)


def gone_message(message: str) -> bool:
    """E2B's proxy's answer for a sandbox that does not run (``... was not found``)."""
    return "was not found" in message.lower()


def api_error(
    response: httpx.Response, *, url: str, what: str, sandbox_id: str | None = None
) -> SandboxError:
    """The error for an error answer of the control plane."""
    status = response.status_code
    message = _body(response).message or f"HTTP {status}"
    if status in (401, 403):
        return BackendUnavailable(
            f"the E2B API at {url} refused the API key ({status}: {message}); {KEY_HINT}",
            retryable=False,
        )
    if status == 404 and sandbox_id is not None:
        return SandboxNotFound(sandbox_id, f"sandbox {sandbox_id!r} not found ({message})")
    if status in (400, 404, 409, 413, 422):
        return InvalidArgument(f"the E2B API refused to {what}: {message}")
    if status == 429:
        return BackendUnavailable(f"the E2B API refused to {what}: {message}", retryable=True)
    if status == 501:
        return BackendUnavailable(
            f"the E2B API at {url} does not offer this ({what}): {message}", retryable=False
        )
    if status in (502, 503, 504):
        return BackendUnavailable(
            f"the E2B API at {url} is unavailable ({what}, {status}): {message}", retryable=True
        )
    return InfrastructureError(f"the E2B API answered {status} to {what}: {message}")


def _deadline(exc: httpx.TimeoutException) -> str:
    """The deadline that ran out, as the request carried it (its ``timeout`` extension)."""
    phase = {httpx.ReadTimeout: "read", httpx.WriteTimeout: "write"}.get(type(exc))
    try:
        seconds = exc.request.extensions.get("timeout", {}).get(phase)
    except RuntimeError:  # no request: nothing to say
        return ""
    return f" after {seconds:g}s of silence" if isinstance(seconds, int | float) else ""


def transport_error(exc: httpx.HTTPError, url: str, what: str) -> BackendUnavailable:
    """An httpx failure: the API or the sandbox could not be reached, or the link broke."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        # Raised before the request was written: nothing was sent (the Session's
        # RetryPolicy tries it again).
        return RequestNotSent(f"cannot reach {url} ({what}): {_first(exc)}")
    if isinstance(exc, httpx.TimeoutException):
        return BackendUnavailable(
            f"{url} did not answer in time ({what}: {type(exc).__name__}{_deadline(exc)})",
            retryable=False,
        )
    return BackendUnavailable(
        f"lost the connection to {url} ({what}): {type(exc).__name__}: {_first(exc)}",
        retryable=False,
    )


def _first(exc: BaseException) -> str:
    """The first non-empty message along the chain (a failed TLS handshake on trio says
    nothing itself; its cause does)."""
    seen: BaseException | None = exc
    while seen is not None:
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def launch_error(message: str) -> LaunchError | None:
    """``asyncsandbox serve`` names the error its backend raised (``LaunchError: ...``)
    when a sandbox could not run what was asked (its Session retried it already)."""
    if message.startswith("LaunchError"):
        return LaunchError(f"the E2B sandbox could not run it: {message}", retryable=False)
    return None


def envd_http_error(response: httpx.Response, *, sandbox_id: str, what: str) -> SandboxError:
    """An error answer of a sandbox's envd (or of E2B's proxy in front of it) that is not
    about a file: the sandbox is gone, refused us, or could not be served."""
    status = response.status_code
    message = _body(response).message or f"HTTP {status}"
    if gone_message(message) or status == 410:
        return SandboxDied(sandbox_id, f"the E2B sandbox is gone ({what}: {message})")
    if (launch := launch_error(message)) is not None:
        return launch
    if status in (401, 403):
        return BackendUnavailable(
            f"the E2B sandbox {sandbox_id} refused the request ({what}, {status}): {message}",
            retryable=False,
        )
    if status == 429:
        return BackendUnavailable(f"the E2B sandbox refused {what}: {message}", retryable=True)
    if status in (502, 503, 504):
        return BackendUnavailable(
            f"the E2B sandbox {sandbox_id} is unavailable ({what}, {status}): {message}",
            retryable=False,
        )
    if status == 400:
        return InvalidArgument(f"the E2B sandbox refused {what}: {message}")
    return InfrastructureError(f"the E2B sandbox answered {status} to {what}: {message}")


def connect_error(failure: ConnectFailure, *, sandbox_id: str, what: str) -> SandboxError:
    """A Connect error of envd that the caller gave no meaning of its own."""
    code, message = failure.code, failure.message
    if gone_message(message):
        return SandboxDied(sandbox_id, f"the E2B sandbox is gone ({what}: {message})")
    if (launch := launch_error(message)) is not None:
        return launch
    if code == "deadline_exceeded":
        return BackendTimeout(what, 0)
    if code == "resource_exhausted":
        return BackendUnavailable(f"the E2B sandbox refused {what}: {message}", retryable=True)
    if code in ("unauthenticated", "permission_denied"):
        return BackendUnavailable(
            f"the E2B sandbox {sandbox_id} refused {what} ({code}): {message}", retryable=False
        )
    if code == "invalid_argument":
        return InvalidArgument(f"the E2B sandbox refused {what}: {message}")
    if code == "unavailable":
        return BackendUnavailable(
            f"the E2B sandbox {sandbox_id} is unavailable ({what}): {message}", retryable=False
        )
    return InfrastructureError(f"the E2B sandbox failed {what} ({code}): {message}")


def connect_body(data: bytes, status: int) -> ConnectFailure:
    """A unary Connect call's error answer (or a proxy's plain one)."""
    try:
        body = msgspec.json.decode(data, type=ConnectErrorBody)
    except msgspec.DecodeError:
        body = ConnectErrorBody(code="unknown", message=data[:300].decode(errors="replace"))
    return ConnectFailure(body.code, body.message or f"HTTP {status}")


_REASONS = (
    ("no such file", FileErrorReason.NOT_FOUND),
    ("not found", FileErrorReason.NOT_FOUND),
    ("does not exist", FileErrorReason.NOT_FOUND),
    ("not a directory", FileErrorReason.NOT_A_DIRECTORY),
    ("is a directory", FileErrorReason.IS_A_DIRECTORY),
    ("too large", FileErrorReason.TOO_LARGE),
    ("exceeds", FileErrorReason.TOO_LARGE),
    ("permission", FileErrorReason.PERMISSION),
    ("read-only", FileErrorReason.PERMISSION),
    ("operation not permitted", FileErrorReason.PERMISSION),
)


def file_error(response: httpx.Response, *, path: str, sandbox_id: str, what: str) -> SandboxError:
    """An error answer of ``/files``: a typed file error, or what the sandbox's is."""
    status = response.status_code
    message = _body(response).message or f"HTTP {status}"
    if (
        gone_message(message)
        or launch_error(message) is not None
        or status in (401, 410, 429, 502, 503, 504)
    ):
        return envd_http_error(response, sandbox_id=sandbox_id, what=what)
    text = message.lower().replace("_", " ")
    # The reason named first in the message wins: "is_a_directory: /x: not a directory"
    # (this server's wording) and "path is not a directory" (envd's) both read right.
    found = sorted(
        (index, reason) for needle, reason in _REASONS if (index := text.find(needle)) >= 0
    )
    if found:
        return SandboxFileError(found[0][1], path, message[:300])
    if status == 404:
        return SandboxFileError(FileErrorReason.NOT_FOUND, path, message[:300])
    if status == 403:
        return SandboxFileError(FileErrorReason.PERMISSION, path, message[:300])
    if status == 413:
        return SandboxFileError(FileErrorReason.TOO_LARGE, path, message[:300])
    if status == 400:
        return SandboxFileError(FileErrorReason.OTHER, path, message[:300])
    return envd_http_error(response, sandbox_id=sandbox_id, what=what)
