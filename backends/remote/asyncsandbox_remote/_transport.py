"""The transport: one pooled httpx client (:class:`Api`) and the one place where HTTP and
transport failures become asyncsandbox errors (users never see httpx exceptions).

Who retries what: the Session's runtime alone (:class:`~asyncsandbox.RetryPolicy`), so
attempts never multiply. :class:`Api` sends each request once. A request whose connection
could not be established (httpx's ``ConnectError``/``ConnectTimeout``, raised before
anything was written) becomes :class:`~asyncsandbox.RequestNotSent`, which the runtime
retries for every call, commands and files included: nothing of it reached the server. A
request that was sent is never repeated by the client; the runtime repeats it only where
that is safe: the lifecycle calls (create, attach, list, inspect, remove, delete snapshot)
on a ``retryable`` error (a lost answer to a create that was then undone, a ``retryable``
error answer: 503, 429, ...), and a command that never ran (``LaunchError``, which the
server sends as final: its own Session retried it already). The backend's own calls
(server info when it opens, lease renewals, cancelling a command, abandoning a create)
are sent once: the runtime retries opening the backend, a renewal is tried again at the
next period, and a kill or an abandon that fails is reported as unconfirmed.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import msgspec

from asyncsandbox import (
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
    SandboxOOMKilled,
    Timeouts,
)

from . import _wire as w

__all__ = (
    "API_KEY_ENV",
    "JSON_HEADERS",
    "Api",
    "decode",
    "died",
    "mapped",
    "sandbox_path",
    "snapshot_path",
    "transport_error",
)

API_KEY_ENV = "ASYNCSANDBOX_API_KEY"
JSON_HEADERS = {"content-type": "application/json"}


# -- errors -------------------------------------------------------------------------------


def _error_body(response: httpx.Response) -> w.ErrorBody | None:
    try:
        return w.ERROR.decode(response.content).error
    except msgspec.DecodeError:
        return None


def _reason(value: str | None) -> FileErrorReason:
    try:
        return FileErrorReason(value or "other")
    except ValueError:
        return FileErrorReason.OTHER


def mapped(
    status: int, body: w.ErrorBody | None, *, base_url: str, sandbox_id: str | None
) -> SandboxError:
    """The asyncsandbox error for an error answer of the server."""
    code = body.code if body is not None else ""
    message = body.message if body is not None else f"HTTP {status}"
    sid = (body.sandbox_id if body is not None else None) or sandbox_id or "?"
    if status == 401 or code == "unauthorized":
        return BackendUnavailable(
            f"the sandbox server at {base_url} refused the API key (401 unauthorized): give "
            f"RemoteBackend(api_key=...) or set {API_KEY_ENV} to a key the server knows",
            retryable=False,
        )
    if code == "sandbox_not_found" or (status == 404 and sandbox_id is not None and not code):
        return SandboxNotFound(sid, message)
    if code == "file_error" and body is not None:
        return SandboxFileError(_reason(body.reason), body.path or "?", body.detail)
    if code == "sandbox_oom_killed":
        return SandboxOOMKilled(sid, (body.reason if body else None) or "out of memory")
    if code == "sandbox_died" or status == 410:
        return SandboxDied(sid, (body.reason if body else None) or message)
    if code == "launch_error" and body is not None:
        return LaunchError(
            f"the sandbox server could not start the command: {message}",
            retryable=body.retryable,
        )
    if status in (400, 413, 422) or code in ("invalid_argument", "request_too_large"):
        return InvalidArgument(f"the sandbox server refused the request: {message}")
    if status == 429:
        return BackendUnavailable(f"the sandbox server refused: {message}", retryable=True)
    if status == 503:
        return BackendUnavailable(
            f"the sandbox server at {base_url} is unavailable: {message}",
            retryable=body.retryable if body is not None else True,
        )
    return InfrastructureError(f"the sandbox server answered {status}: {message}", retryable=False)


def _first_message(exc: BaseException) -> str:
    """The first non-empty message along the chain: on trio, httpx's ConnectError for a
    failed TLS handshake says nothing itself, its cause (the ssl error) does."""
    seen: BaseException | None = exc
    while seen is not None:
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def _deadline(exc: httpx.TimeoutException) -> str:
    """The deadline that ran out, as the request carried it (its ``timeout`` extension)."""
    phase = {httpx.ReadTimeout: "read", httpx.WriteTimeout: "write"}.get(type(exc))
    try:
        seconds = exc.request.extensions.get("timeout", {}).get(phase)
    except RuntimeError:  # no request: nothing to say
        return ""
    return f" after {seconds:g}s of silence" if isinstance(seconds, int | float) else ""


def transport_error(exc: httpx.HTTPError, base_url: str, what: str) -> BackendUnavailable:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        # Raised while connecting, before the request was written (httpx raises them from
        # the connection's setup only): the server never saw it.
        return RequestNotSent(
            f"cannot reach the sandbox server at {base_url} ({what}): {_first_message(exc)}"
        )
    if isinstance(exc, httpx.TimeoutException):
        return BackendUnavailable(
            f"the sandbox server at {base_url} did not answer in time ({what}: "
            f"{type(exc).__name__}{_deadline(exc)})",
            retryable=False,
        )
    return BackendUnavailable(
        f"lost the connection to the sandbox server at {base_url} ({what}): "
        f"{type(exc).__name__}: {exc}",
        retryable=False,
    )


def died(exc: SandboxError) -> SandboxError:
    """Inside a sandbox, "no such sandbox" means it is gone: the contract says SandboxDied."""
    if isinstance(exc, SandboxNotFound):
        return SandboxDied(exc.sandbox_id, "not found on the server (removed, or lease expired)")
    return exc


def decode(codec: w.Codec[Any], response: httpx.Response) -> Any:
    """A successful answer's body, decoded; one the wire type refuses is an
    :class:`~asyncsandbox.InfrastructureError`."""
    try:
        return codec.decode(response.content)
    except msgspec.DecodeError as exc:
        raise InfrastructureError(f"invalid answer from the sandbox server: {exc}") from None


def snapshot_path(snapshot_id: str) -> str:
    return f"/v1/snapshots/{quote(snapshot_id, safe='')}"


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


# -- HTTP ---------------------------------------------------------------------------------


class Api:
    """One pooled httpx client; it sends each request once (see the module docstring).

    Its deadlines are the Session's :class:`~asyncsandbox.Timeouts`, none of its own:
    connecting, and each read or write of a request, may take ``timeouts.operation``
    unless the call says otherwise (:meth:`within`: a create its ``timeouts.create``, a
    removal its ``timeouts.remove``); an answer the server pings while it is quiet (an
    exec's, a run_code's) may be silent for the server's ping interval more
    (:meth:`pinged`).

    :param timeouts: the Session's deadlines (``Backend.timeouts``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeouts: Timeouts,
        max_connections: int,
        verify: bool | str | ssl.SSLContext,
    ) -> None:
        self.base_url = base_url
        self.timeouts = timeouts
        self.ping_interval = 0.0
        """Seconds after which the server pings a quiet streamed answer (its terms, once
        known: ``ServerInfo.ping_interval``)."""
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self.client = httpx.AsyncClient(
            base_url=base_url,
            headers={"authorization": f"Bearer {api_key}", "user-agent": "asyncsandbox-remote"},
            timeout=self.within(timeouts.operation),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=min(64, max_connections),
                # Shorter than the server's keep-alive (60 s): we never reuse a connection
                # the server is closing, so a request is never lost to that race.
                keepalive_expiry=15.0,
            ),
            verify=verify,
            follow_redirects=False,
        )
        self.cleanup = timeouts.cleanup
        """Seconds a shielded cleanup may take (the Session's ``Timeouts.cleanup``)."""

    def within(self, seconds: float | None) -> httpx.Timeout:
        """Deadlines for a request each of whose reads and writes may take ``seconds``
        (None: no limit); connecting may take ``timeouts.operation``."""
        return httpx.Timeout(seconds, connect=self.timeouts.operation, pool=None)

    def pinged(self) -> httpx.Timeout:
        """Deadlines for a request whose answer the server pings while it is quiet: a
        read may wait for the ping interval and ``timeouts.operation`` more."""
        operation = self.timeouts.operation
        return self.within(None if operation is None else self.ping_interval + operation)

    async def send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        stream: bool = False,
        params: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """Send a request once and return the answer, whatever its status; one whose
        connection could not be established raises :class:`~asyncsandbox.RequestNotSent`.
        ``timeout``: its deadlines (:meth:`within`, :meth:`pinged`), if not the client's."""
        request = self.client.build_request(
            method,
            path,
            params=params,
            content=content,
            headers=headers,
            timeout=timeout or self.client.timeout,
        )
        try:
            return await self.client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.base_url, what) from exc

    async def call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        sandbox_id: str | None = None,
        params: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """A unary call: the answer, read whole; error answers raise mapped errors."""
        response = await self.send(
            method,
            path,
            what=what,
            params=params,
            content=content,
            headers=headers,
            timeout=timeout,
        )
        if response.status_code >= 400:
            raise self.error(response, sandbox_id)
        return response

    def error(self, response: httpx.Response, sandbox_id: str | None) -> SandboxError:
        return mapped(
            response.status_code,
            _error_body(response),
            base_url=self.base_url,
            sandbox_id=sandbox_id,
        )

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        what: str,
        sandbox_id: str | None,
        params: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """A streamed answer (status checked). Leaving the block closes the connection if
        the body was not read to the end: that is how the server learns we are gone."""
        response = await self.send(
            method,
            path,
            what=what,
            stream=True,
            params=params,
            content=content,
            headers=headers,
            timeout=timeout,
        )
        try:
            if response.status_code >= 400:
                try:
                    await response.aread()
                except httpx.HTTPError as exc:
                    raise transport_error(exc, self.base_url, what) from exc
                raise self.error(response, sandbox_id)
            yield response
        finally:
            await self._close(response)

    async def _close(self, response: httpx.Response) -> None:
        # Shielded and bounded: the connection must be released even when we are cancelled
        # (closing it is what tells the server to kill a streaming command).
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(self.cleanup),
            suppress(httpx.HTTPError),
        ):
            await response.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.cleanup):
            await self.client.aclose()
