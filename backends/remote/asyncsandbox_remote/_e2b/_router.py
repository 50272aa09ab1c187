"""One port for everything: requests that carry ``E2b-Sandbox-Id`` go to that sandbox
(``E2b-Sandbox-Port`` 49983: envd; 49999: the code interpreter, :mod:`._interpreter`),
every other request to the server's own application (its API, SandboxFusion's routes,
E2B's control plane).

A sandbox request needs the sandbox's access token (``X-Access-Token``, from its create;
to the code interpreter, the sandbox's traffic token in ``E2B-Traffic-Access-Token``
will do, as its SDK sends the access token with ``/execute`` only)
and is accounted like every other operation on a sandbox (the tenant's ``max_execs``
quota; its lifetime is not extended). A sandbox that does not run (never did, was killed,
reached its timeout, or is paused) answers 502 with "... was not found", which is how the
SDKs learn that a sandbox ended. envd's Basic ``Authorization`` names a user: the
sandbox's own user is E2B's ``user``; ``root`` is not offered.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import posixpath
import time
from contextlib import nullcontext
from typing import Any

import msgspec
from connectrpc.errors import ConnectError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from asyncsandbox import InvalidArgument, SandboxError, SandboxFileError

from .._errors import HttpError, error_for
from .._serverstate import ServerState
from .._streaming import read_body
from ._control import ControlPlane, e2b_error
from ._envd import applications
from ._fs import resolve
from ._interpreter import Interpreter
from ._state import E2bSandbox

__all__ = ("E2bRouter",)

ENVD_PORT = "49983"
INTERPRETER_PORT = "49999"
USERS = ("", "user")
SANDBOX_ONLY = ("/process.Process/", "/filesystem.Filesystem/", "/health", "/execute", "/contexts")
"""Paths that are a sandbox's alone, envd's or its code interpreter's (``/files`` without
a sandbox is a signed URL's)."""
FILE_STATUS = {"not_found": 404, "permission": 403, "too_large": 413}


class E2bRouter:
    """The ASGI application in front of the server's (see the module docstring)."""

    def __init__(self, app: Starlette, server: ServerState, control: ControlPlane) -> None:
        self.app = app
        self.state = app.state
        self.server = server
        self.tenancy = server.tenancy
        self.metrics = server.metrics
        self.config = server.config
        self.registry = control.registry
        self.connect_apps = applications(control.sandbox_of())
        self.interpreter = Interpreter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        sandbox_id = headers.get("e2b-sandbox-id")
        if sandbox_id is None and scope["path"] == "/files":
            await self._signed(scope, receive, send)
            return
        if sandbox_id is None and scope["path"].startswith(SANDBOX_ONLY):
            await e2b_error(
                400,
                "envd's and the code interpreter's routes are a sandbox's: send its id as "
                "E2b-Sandbox-Id (and E2b-Sandbox-Port, X-Access-Token)",
            )(scope, receive, send)
            return
        if sandbox_id is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._sandbox_request(scope, receive, counted, headers, sandbox_id)
        finally:
            name = "e2b_envd" if headers.get("e2b-sandbox-port") == ENVD_PORT else "e2b_port"
            self.metrics.observe(name, scope["method"], status, time.perf_counter() - started)

    async def _sandbox_request(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, sandbox_id: str
    ) -> None:
        sandbox = self.registry.get(sandbox_id)
        if sandbox is None or not sandbox.running or sandbox.record is None:
            shown = sandbox_id[:64]
            await e2b_error(502, f"The sandbox {shown} was not found")(scope, receive, send)
            return
        port = headers.get("e2b-sandbox-port", "")
        token = headers.get("x-access-token", "")
        # The interpreter's SDK sends the access token with /execute only, and the traffic
        # token (E2B's for a sandbox's other ports) with every request.
        traffic = headers.get("e2b-traffic-access-token", "") if port == INTERPRETER_PORT else ""
        if not (sandbox.token_matches(token) or (traffic and sandbox.traffic_matches(traffic))):
            self.tenancy.refused(Request(scope), had_key=bool(token or traffic))
            await e2b_error(
                401,
                "invalid or missing access token: send the sandbox's envdAccessToken "
                "as X-Access-Token (or, to its code interpreter, its trafficAccessToken as "
                "E2B-Traffic-Access-Token)",
            )(scope, receive, send)
            return
        record = sandbox.record
        if port == INTERPRETER_PORT:
            try:
                async with self.tenancy.use(sandbox.tenant, record):
                    await self.interpreter(scope, receive, send, sandbox)
            except HttpError as exc:  # the tenant's quota
                await e2b_error(exc.status, exc.body.message, exc.headers)(scope, receive, send)
            return
        if port != ENVD_PORT:
            await e2b_error(
                502,
                f"The sandbox {sandbox.id} is running but port is not open: asyncsandbox "
                "serve serves envd (49983) and the code interpreter (49999) only; sandboxes "
                "have no network",
            )(scope, receive, send)
            return
        user = _basic_user(headers.get("authorization", ""))
        if user not in USERS:
            await e2b_error(
                403,
                f"user {user[:32]!r} is not available: commands and files run as the "
                "sandbox's own unprivileged user (E2B's 'user')",
            )(scope, receive, send)
            return
        try:
            async with self.tenancy.use(sandbox.tenant, record):
                await self._envd(scope, receive, send, sandbox)
        except HttpError as exc:  # the tenant's quota
            await e2b_error(exc.status, exc.body.message, exc.headers)(scope, receive, send)

    async def _signed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/files`` by a signed URL (no headers): the sandbox whose token signed it."""
        request = Request(scope, receive)
        query = request.query_params
        signature = query.get("signature", "")
        expiration = query.get("signature_expiration", "")
        operation = "read" if request.method == "GET" else "write"
        found = None
        if signature:
            for sandbox in self.registry.running():
                if sandbox.signs(
                    signature,
                    query.get("path", ""),
                    operation,
                    query.get("username", ""),
                    expiration,
                ):
                    found = sandbox
        if found is None or found.record is None:
            self.tenancy.refused(request, had_key=bool(signature))
            await e2b_error(401, "missing or invalid file URL signature")(scope, receive, send)
            return
        if expiration and (not expiration.isdigit() or int(expiration) < time.time()):
            await e2b_error(401, "signature is already expired")(scope, receive, send)
            return
        try:
            async with self.tenancy.use(found.tenant, found.record):
                await self._envd(scope, receive, send, found)
        except HttpError as exc:
            await e2b_error(exc.status, exc.body.message, exc.headers)(scope, receive, send)

    async def _envd(self, scope: Scope, receive: Receive, send: Send, sandbox: E2bSandbox) -> None:
        path = scope["path"]
        for prefix, app in self.connect_apps.items():
            if path.startswith(prefix):
                await app(scope, receive, send)
                return
        request = Request(scope, receive)
        if path == "/health" and request.method == "GET":
            await Response(status_code=204)(scope, receive, send)
            return
        if path == "/files" and request.method in ("GET", "POST"):
            try:
                if request.method == "GET":
                    response = await self._read(request, sandbox)
                else:
                    response = await self._write(request, sandbox)
            except _FileError as exc:
                response = e2b_error(exc.status, str(exc))
            except HttpError as exc:
                response = e2b_error(exc.status, exc.body.message)
            except ClientDisconnect:
                return
            await response(scope, receive, send)
            return
        await e2b_error(404, f"no such envd route: {path[:200]}")(scope, receive, send)

    # -- /files ---------------------------------------------------------------------------

    def _user_of(self, request: Request) -> None:
        user = request.query_params.get("username", "")
        if user not in USERS:
            raise _FileError(403, f"user {user[:32]!r} is not available (only 'user')")

    async def _read(self, request: Request, sandbox: E2bSandbox) -> Response:
        self._user_of(request)
        path = resolve(request.query_params.get("path", ""))
        assert sandbox.record is not None
        try:
            data = await sandbox.record.sandbox.read_file(
                path, max_bytes=self.config.max_file_bytes
            )
        except (InvalidArgument, SandboxError) as exc:
            raise _file_error(exc, path) from None
        headers = {}
        if "gzip" in request.headers.get("accept-encoding", ""):
            data = gzip.compress(data, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return Response(data, media_type="application/octet-stream", headers=headers)

    async def _write(self, request: Request, sandbox: E2bSandbox) -> Response:
        self._user_of(request)
        assert sandbox.record is not None
        target = sandbox.record.sandbox
        limit = self.config.max_file_bytes
        kind = request.headers.get("content-type", "")
        files: list[tuple[str, bytes]] = []
        if kind.startswith("multipart/form-data"):
            try:
                form = await request.form(max_files=1000, max_fields=1000, max_part_size=limit)
            except Exception as exc:  # noqa: BLE001 - a malformed upload is the client's
                raise _FileError(400, f"invalid multipart upload: {exc}") from None
            try:
                for _, value in form.multi_items():
                    if isinstance(value, str):
                        continue
                    name = value.filename or request.query_params.get("path", "")
                    files.append((resolve(name), await value.read(limit + 1)))
            finally:
                await form.close()
        else:
            data = await read_body(request, limit)
            if request.headers.get("content-encoding", "") == "gzip":
                data = _gunzip(data, limit)
            files.append((resolve(request.query_params.get("path", "")), data))
        metadata = _metadata(request.headers)
        fs = sandbox.fs
        written = []
        for path, data in files:
            if len(data) > limit:
                raise _FileError(413, f"{path[:200]} exceeds the server's limit of {limit} bytes")
            async with (
                sandbox.watchers.writing(path, empty=not data)
                if sandbox.watchers is not None
                else nullcontext()
            ):
                try:
                    await target.write_file(path, data)
                except (InvalidArgument, SandboxError) as exc:
                    raise _file_error(exc, path) from None
                if fs is not None and (metadata or path in fs.tagged):
                    # envd's upload replaces the file's metadata (none: it clears it).
                    try:
                        await fs.tag(path, metadata)
                    except ConnectError as exc:
                        raise _FileError(400, f"{path[:200]}: {exc.message}") from None
            entry: dict[str, Any] = {"path": path, "name": posixpath.basename(path), "type": "file"}
            if metadata:
                entry["metadata"] = metadata
            written.append(entry)
        return Response(msgspec.json.encode(written), media_type="application/json")


class _FileError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _file_error(exc: Exception, path: str) -> _FileError:
    if isinstance(exc, SandboxFileError):
        status = FILE_STATUS.get(exc.reason.value, 400)
        return _FileError(status, f"{exc.reason.value}: {path[:300]}: {exc.detail or exc}")
    if isinstance(exc, InvalidArgument):
        return _FileError(400, str(exc))
    if isinstance(exc, SandboxError):
        # Named as a command's end event names it ("LaunchError: ..."): the e2b backend
        # tells a file operation that could not be run from a file error by it.
        answer = error_for(exc)
        status = 502 if answer.status == 410 else answer.status
        return _FileError(status, f"{type(exc).__name__}: {answer.body.message}")
    return _FileError(500, "internal error")


def _gunzip(data: bytes, limit: int) -> bytes:
    decompressor = gzip.zlib.decompressobj(16 + gzip.zlib.MAX_WBITS)  # type: ignore[attr-defined]
    try:
        out: bytes = decompressor.decompress(data, limit + 1)
    except gzip.zlib.error as exc:  # type: ignore[attr-defined]
        raise _FileError(400, f"invalid gzip body: {exc}") from None
    if len(out) > limit:
        raise _FileError(413, f"the file exceeds the server's limit of {limit} bytes")
    return out


METADATA_PREFIX = "x-metadata-"
MAX_METADATA = 64


def _metadata(headers: Headers) -> dict[str, str]:
    """An upload's metadata: its ``X-Metadata-<key>`` headers (names lowercased, as HTTP
    header names are case-insensitive)."""
    found = {
        name[len(METADATA_PREFIX) :]: value
        for name, value in headers.items()
        if name.startswith(METADATA_PREFIX) and len(name) > len(METADATA_PREFIX)
    }
    if len(found) > MAX_METADATA:
        raise _FileError(400, f"at most {MAX_METADATA} metadata entries per upload")
    return found


def _basic_user(header: str) -> str:
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return "?"
    return decoded.partition(":")[0]
