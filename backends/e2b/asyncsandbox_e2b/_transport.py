"""HTTP for the e2b backend: one pooled httpx client (anyio: asyncio and trio) for E2B's
control plane and every sandbox's envd, and envd's Connect protocol over it.

**Connect.** envd speaks Connect with the JSON codec, uncompressed (as E2B's SDKs call
it). A unary call is a POST of the JSON message (``application/json``); its error is an
HTTP status and ``{code, message}``. A server stream is a POST of one enveloped message
(``application/connect+json``); the answer is a sequence of envelopes (1 byte of flags,
4 bytes of big-endian length, the message), the last one flagged end-of-stream (0x02)
and carrying the stream's error, if any. The connectrpc package implements this for
asyncio only (its async client cancels with asyncio's primitives and turns a
cancellation into an error), so the few lines of framing are here, on httpx.

**Deadlines.** The Session's :class:`~asyncsandbox.Timeouts`, none of this module's own:
connecting, and each read or write of a request, may take ``timeouts.operation`` unless
the call says otherwise (:meth:`Http.within`: a create ``timeouts.create``, a removal
``timeouts.remove``); a Connect stream, which envd keeps alive every
``KEEPALIVE_SECONDS`` while a command is quiet, may be silent that long and
``timeouts.operation`` more; shielded cleanups take at most ``timeouts.cleanup``.

**Retries.** None here: each request is sent once. One whose connection could not be
established was never sent and raises :class:`~asyncsandbox.RequestNotSent`, which the
Session's ``RetryPolicy`` tries again for every call; what was sent is repeated only where
the runtime says it is safe (the lifecycle calls).
"""

from __future__ import annotations

import base64
import ssl
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, cast

import anyio
import httpx
import msgspec

from asyncsandbox import BackendUnavailable, InfrastructureError, Timeouts
from asyncsandbox.log import get_logger

from ._errors import ConnectFailure, api_error, connect_body, envd_http_error, transport_error
from ._wire import ConnectEnd

__all__ = ("ControlPlane", "Envd", "Http", "Messages", "decode", "envelope")

log = get_logger("asyncsandbox.e2b")

ENVD_PORT = 49983
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest Connect message accepted from envd (its output events are 32 KiB)."""
ENVELOPE = struct.Struct(">BI")
END_STREAM = 0x02
COMPRESSED = 0x01
KEEPALIVE_SECONDS = 30
"""Asked of envd (``Keepalive-Ping-Interval``): a silent command's stream carries a
keepalive this often; its reader waits that long and ``timeouts.operation`` more."""


def envelope(message: bytes, flags: int = 0) -> bytes:
    """One Connect envelope."""
    return ENVELOPE.pack(flags, len(message)) + message


class Http:
    """The pooled client (see the module docstring).

    :param timeouts: the Session's deadlines (``Backend.timeouts``).
    """

    def __init__(
        self,
        *,
        timeouts: Timeouts,
        max_connections: int,
        verify: bool | str | ssl.SSLContext,
    ) -> None:
        self.timeouts = timeouts
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self.client = httpx.AsyncClient(
            headers={"user-agent": "asyncsandbox-e2b"},
            timeout=self.within(timeouts.operation),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=min(64, max_connections),
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

    def kept_alive(self) -> httpx.Timeout:
        """Deadlines for a Connect stream, which envd keeps alive every
        ``KEEPALIVE_SECONDS``: a read may wait that long and ``timeouts.operation`` more."""
        operation = self.timeouts.operation
        return self.within(None if operation is None else KEEPALIVE_SECONDS + operation)

    async def send(
        self,
        request: httpx.Request,
        *,
        what: str,
        origin: str,
        stream: bool = False,
    ) -> httpx.Response:
        """Send ``request`` once and return the answer, whatever its status. httpx errors
        become :class:`BackendUnavailable` (:class:`RequestNotSent` when nothing was sent)."""
        try:
            return await self.client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise transport_error(exc, origin, what) from exc

    async def close_response(self, response: httpx.Response) -> None:
        # Shielded and bounded: the connection must be released even when we are cancelled.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(self.cleanup),
            suppress(httpx.HTTPError),
        ):
            await response.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.cleanup):
            await self.client.aclose()


class ControlPlane:
    """E2B's REST API (``X-API-KEY``)."""

    def __init__(self, http: Http, url: str, api_key: str) -> None:
        self.http = http
        self.url = url
        self._headers = {"x-api-key": api_key}

    async def call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        sandbox_id: str | None = None,
        body: bytes | None = None,
        params: Any = None,
        headers: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201, 204),
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """One call, its answer read whole; an answer outside ``ok`` raises its error.
        ``timeout``: its deadlines (:meth:`Http.within`), if not the client's."""
        headers = {**self._headers, **(headers or {})}
        if body is not None:
            headers["content-type"] = "application/json"
        request = self.http.client.build_request(
            method,
            self.url + path,
            content=body,
            params=params,
            headers=headers,
            timeout=timeout or self.http.client.timeout,
        )
        response = await self.http.send(request, what=what, origin=self.url)
        if response.status_code not in ok:
            raise api_error(response, url=self.url, what=what, sandbox_id=sandbox_id)
        return response


class Envd:
    """One sandbox's envd: its Connect services and ``/files``, through E2B's routing
    headers (``E2b-Sandbox-Id``, ``E2b-Sandbox-Port``) and its access token."""

    def __init__(self, http: Http, url: str, sandbox_id: str, token: str | None, user: str) -> None:
        self.http = http
        self.url = url.rstrip("/")
        self.sandbox_id = sandbox_id
        basic = base64.b64encode(f"{user}:".encode()).decode()
        self.headers = {
            "e2b-sandbox-id": sandbox_id,
            "e2b-sandbox-port": str(ENVD_PORT),
            "authorization": f"Basic {basic}",
            "keepalive-ping-interval": str(KEEPALIVE_SECONDS),
        }
        if token:
            self.headers["x-access-token"] = token
        self._token = token

    def as_user(self, user: str) -> Envd:
        """The same envd, for requests made as ``user``."""
        return Envd(self.http, self.url, self.sandbox_id, self._token, user)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Request:
        return self.http.client.build_request(
            method,
            self.url + path,
            params=params,
            content=content,
            headers={**self.headers, **(headers or {})},
            timeout=timeout or self.http.client.timeout,
        )

    async def unary(self, method: str, message: bytes, *, what: str) -> bytes:
        """A unary Connect call: its answer's message. A Connect error raises
        :class:`ConnectFailure` (the caller gives it its meaning); the sandbox gone, or
        the link lost, raises the asyncsandbox error."""
        request = self.request(
            "POST",
            f"/{method}",
            content=message,
            headers={"content-type": "application/json", "connect-protocol-version": "1"},
        )
        response = await self.http.send(request, what=what, origin=self.url)
        if response.status_code == 200:
            return response.content
        if _is_connect_error(response):
            raise connect_body(response.content, response.status_code)
        raise envd_http_error(response, sandbox_id=self.sandbox_id, what=what)

    @asynccontextmanager
    async def stream(self, method: str, message: bytes, *, what: str) -> AsyncIterator[Messages]:
        """A server-streaming Connect call: its messages, as they come (see
        :class:`Messages`). Leaving the block closes the connection if the stream was not
        read to its end."""
        request = self.request(
            "POST",
            f"/{method}",
            content=envelope(message),
            headers={"content-type": "application/connect+json", "connect-protocol-version": "1"},
            timeout=self.http.kept_alive(),
        )
        response = await self.http.send(request, what=what, origin=self.url, stream=True)
        try:
            if response.status_code != 200:
                try:
                    await response.aread()
                except httpx.HTTPError as exc:
                    raise transport_error(exc, self.url, what) from exc
                if _is_connect_error(response):
                    raise connect_body(response.content, response.status_code)
                raise envd_http_error(response, sandbox_id=self.sandbox_id, what=what)
            messages = Messages(response, origin=self.url, what=what, cleanup=self.http.cleanup)
            try:
                yield messages
            finally:
                await messages.aclose()
        finally:
            await self.http.close_response(response)


def _is_connect_error(response: httpx.Response) -> bool:
    """A Connect error answer (JSON whose ``code`` is a string), not a proxy's page."""
    if not response.headers.get("content-type", "").startswith("application/json"):
        return False
    try:
        code = msgspec.json.decode(response.content, type=dict[str, Any]).get("code")
    except msgspec.DecodeError:
        return False
    return isinstance(code, str)


class Messages:
    """The messages of a Connect server stream. Iterate for each message's JSON; the
    stream's end raises its error (:class:`ConnectFailure`), if it had one; a stream that
    stops without its end, or a broken link, raises :class:`BackendUnavailable`."""

    def __init__(self, response: httpx.Response, *, origin: str, what: str, cleanup: float) -> None:
        self._cleanup = cleanup
        self._chunks = cast(AsyncGenerator[bytes, None], response.aiter_raw())
        self._origin = origin
        self._what = what
        self._buffer = bytearray()
        self.ended = False
        """The end-of-stream message arrived."""

    def __aiter__(self) -> Messages:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if len(self._buffer) >= ENVELOPE.size:
                flags, length = ENVELOPE.unpack_from(self._buffer)
                if length > MAX_MESSAGE_BYTES:
                    raise InfrastructureError(
                        f"envd sent a {length}-byte message ({self._what}); the limit is "
                        f"{MAX_MESSAGE_BYTES}"
                    )
                end = ENVELOPE.size + length
                if len(self._buffer) >= end:
                    message = bytes(self._buffer[ENVELOPE.size : end])
                    del self._buffer[:end]
                    if flags & COMPRESSED:
                        raise InfrastructureError(f"envd sent a compressed message ({self._what})")
                    if flags & END_STREAM:
                        self.ended = True
                        await self._drain()
                        self._finish(message)
                        raise StopAsyncIteration
                    return message
            if self.ended:
                raise StopAsyncIteration
            try:
                chunk = await anext(self._chunks, None)
            except httpx.HTTPError as exc:
                raise transport_error(exc, self._origin, self._what) from exc
            if chunk is None:
                raise BackendUnavailable(
                    f"the stream from {self._origin} ended before its end message ({self._what})",
                    retryable=False,
                )
            self._buffer += chunk

    async def _drain(self) -> None:
        """Read the body to its end after the end message (nothing should follow it):
        the connection is reused, and no reader of it is left to the garbage collector."""
        try:
            async for _ in self._chunks:
                pass
        except httpx.HTTPError:
            pass  # the stream's end arrived; only the connection's was lost

    async def aclose(self) -> None:
        """Close the body's reader (shielded, bounded: it must not be left to the garbage
        collector, which trio warns about)."""
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(self._cleanup),
            suppress(httpx.HTTPError),
        ):
            await self._chunks.aclose()

    def _finish(self, message: bytes) -> None:
        try:
            end = msgspec.json.decode(message or b"{}", type=ConnectEnd)
        except msgspec.DecodeError as exc:
            raise InfrastructureError(f"envd sent an invalid end of stream: {exc}") from None
        if end.error is not None:
            raise ConnectFailure(end.error.code, end.error.message)


def decode(message: bytes, kind: type[Any], what: str) -> Any:
    """A message of envd or of the control plane, or an infrastructure error saying why not."""
    try:
        return msgspec.json.decode(message, type=kind)
    except msgspec.DecodeError as exc:
        raise InfrastructureError(f"invalid answer from E2B ({what}): {exc}") from None
