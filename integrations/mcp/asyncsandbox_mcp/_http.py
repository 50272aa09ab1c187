"""MCP over streamable HTTP: one session per client (the ``Mcp-Session-Id`` the SDK's
session manager hands out), one sandbox per session.

A sandbox lives as long as its session, and sessions exist only in the protocol's
handshake era (2025-11-25 and before): 2026-07-28 made every request stand alone. So this
transport serves the handshake era, and answers a request of a later version with the
protocol's own ``UNSUPPORTED_PROTOCOL_VERSION`` naming the versions it serves; the SDKs'
clients (``mode="auto"``) then fall back to the handshake by themselves. stdio has no such
limit: its one client is its one session.

Around the SDK's application, one ASGI layer (:class:`_Gate`) authenticates (Bearer
keys, the file format of ``asyncsandbox serve``), steers the era, and follows each
session's requests: in flight (not idle), ended by its client (``DELETE``: the sandbox
goes), or expired here (answered ``404`` as the SDK answers an ended session, so a client
never reaches a session whose sandbox is gone).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import mcp_types as types
from asyncsandbox_remote.server import Tenant
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asyncsandbox import Session
from asyncsandbox.log import get_logger

from ._config import McpConfig
from ._server import create_server
from ._version import version
from ._workspaces import Workspaces

__all__ = ("create_app", "serve_http")

log = get_logger("asyncsandbox.mcp")

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
_MAX_REFUSED_BODY = 1 << 20  # a request we refuse is read only to answer its id


def _session_key(ctx: Any) -> str | None:
    request = ctx.request
    if not isinstance(request, Request):
        return None
    return request.headers.get(SESSION_HEADER)


class _Gate:
    def __init__(
        self, app: ASGIApp, workspaces: Workspaces, tenants: Sequence[Tenant] | None
    ) -> None:
        self.app = app
        self.workspaces = workspaces
        self.keys = None if tenants is None else [(t.key_digest, t.name) for t in tenants]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the SDK's session manager
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.keys is not None:
            tenant = self._authenticate(headers.get("authorization", ""))
            if tenant is None:
                client = scope.get("client")
                log.warning("mcp.auth.failed", client=client[0] if client else "?")
                await _unauthorized(scope, receive, send)
                return
            # The SDK's session manager binds each session to the principal that opened it
            # and answers anyone else as if the session did not exist.
            token = AccessToken(token="", client_id=tenant, scopes=[])
            scope = {**scope, "user": AuthenticatedUser(token), "auth": AuthCredentials()}
        requested = headers.get(VERSION_HEADER)
        if requested is not None and requested not in HANDSHAKE_PROTOCOL_VERSIONS:
            await _unsupported_version(requested, scope, receive, send)
            return
        key = headers.get(SESSION_HEADER)
        if key is None:
            await self.app(scope, receive, send)
            return
        if self.workspaces.ended(key):
            await _session_not_found(scope, receive, send)
            return
        status: list[int] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        with self.workspaces.active(key):
            await self.app(scope, receive, watch)
        if scope["method"] == "DELETE" and status and 200 <= status[0] < 300:
            await self.workspaces.end(key, "ended by the client")

    def _authenticate(self, header: str) -> str | None:
        assert self.keys is not None
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return None
        presented = hashlib.sha256(credentials.strip().encode("utf-8", "surrogateescape")).digest()
        found = None
        # Constant time: compare against every key, never stop at the first match.
        for key_digest, tenant in self.keys:
            if hmac.compare_digest(presented, key_digest):
                found = tenant
        return found


async def _unauthorized(scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(
        {"error": "invalid_token", "error_description": "send 'Authorization: Bearer <key>'"},
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer realm="asyncsandbox", error="invalid_token"'},
    )
    await response(scope, receive, send)


async def _unsupported_version(requested: str, scope: Scope, receive: Receive, send: Send) -> None:
    body = b""
    async for chunk in Request(scope, receive).stream():
        body += chunk
        if len(body) > _MAX_REFUSED_BODY:
            break
    try:
        request_id = json.loads(body).get("id")
    except (ValueError, AttributeError):
        request_id = None
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(
            code=types.UNSUPPORTED_PROTOCOL_VERSION,
            message=(
                "Unsupported protocol version: this server gives each session a sandbox, and "
                "sessions need the initialize handshake"
            ),
            data=types.UnsupportedProtocolVersionErrorData(
                supported=list(HANDSHAKE_PROTOCOL_VERSIONS), requested=requested
            ).model_dump(mode="json"),
        ),
    )
    response = Response(
        error.model_dump_json(by_alias=True, exclude_none=True),
        status_code=400,
        media_type="application/json",
    )
    await response(scope, receive, send)


async def _session_not_found(scope: Scope, receive: Receive, send: Send) -> None:
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=None,
        error=types.ErrorData(code=types.INVALID_REQUEST, message="Session not found"),
    )
    response = Response(
        error.model_dump_json(by_alias=True), status_code=404, media_type="application/json"
    )
    await response(scope, receive, send)


def create_app(
    workspaces: Workspaces, *, tenants: Sequence[Tenant] | None, host: str = "127.0.0.1"
) -> ASGIApp:
    """The ASGI application of the MCP server (path ``/mcp``) over ``workspaces``.

    :param tenants: the keys a request must carry as ``Authorization: Bearer KEY``;
        ``None``: no authentication (for loopback only: see :func:`serve_http`).
    :param host: where it listens; on loopback the SDK also refuses requests whose
        ``Host`` or ``Origin`` is not loopback (DNS rebinding).
    """
    server = create_server(workspaces, _session_key, version=version())
    config = workspaces.config
    app = server.streamable_http_app(
        host=host,
        # The same timeout as the sandboxes': the SDK forgets an idle session when its
        # sandbox goes (and _Gate answers it as ended in between).
        session_idle_timeout=config.idle_timeout,
        max_sessions=config.max_sessions,
    )
    return _Gate(app, workspaces, tenants)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host.strip("[]"), port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


async def serve_http(
    session: Session,
    config: McpConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8766,
    tenants: Sequence[Tenant] | None = None,
    ready: Callable[[str], None] | None = None,
) -> bool:
    """Serve MCP over streamable HTTP at ``http://HOST:PORT/mcp`` until SIGTERM/SIGINT
    (or cancellation); return whether it started. Every session's sandbox is removed on
    the way out.

    :param tenants: API keys (see :func:`create_app`); required unless ``host`` is loopback.
    :param ready: called with the endpoint's URL once the server accepts requests (useful
        with ``port=0``, which picks a free port).

    Runs on asyncio only (uvicorn). Cancellation: the server shuts down as on SIGTERM.
    """
    import uvicorn

    from asyncsandbox import InvalidArgument

    if tenants is None and not is_loopback(host):
        raise InvalidArgument(
            f"serving MCP on {host} (not loopback) needs API keys: anyone who reaches it runs "
            "commands in its sandboxes"
        )
    async with Workspaces(session, config, expire_idle=True) as workspaces:
        app = create_app(workspaces, tenants=tenants, host=host)
        sock = _bind(host, port)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"http://{shown}:{bound_port}/mcp"
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_config=None,  # the application configures logging
                server_header=False,
                # Open event streams of idle clients would hold the shutdown for ever.
                timeout_graceful_shutdown=5,
            )
        )

        async def announce() -> None:
            while not server.started:
                if server.should_exit:
                    return
                await anyio.sleep(0.02)
            if ready is not None:
                ready(url)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(announce)
                await server.serve(sockets=[sock])
                tg.cancel_scope.cancel()
        finally:
            sock.close()
    return bool(server.started)


for _obj in (create_app, serve_http):  # shown as the package's (see its __init__)
    _obj.__module__ = "asyncsandbox_mcp"
del _obj
