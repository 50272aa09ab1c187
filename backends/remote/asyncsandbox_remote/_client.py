"""The client half: a :class:`~asyncsandbox.abc.Backend` whose sandboxes live on a
server (``asyncsandbox serve``), reached over HTTP with httpx.

httpx runs on anyio, so this backend works on asyncio and trio. All policy stays where
it belongs: the client's Session applies its limits, deadlines and retries as for any
backend, and the server applies its own over its backend. This module only speaks the
protocol and translates every HTTP and transport failure into the asyncsandbox error tree
at the boundary (users never see httpx exceptions).

Who retries what. Every call is retried by one layer only, so attempts never multiply:

* The Session's runtime (:class:`~asyncsandbox.RetryPolicy`) retries the lifecycle calls
  (create, attach, list, inspect, remove) when they fail with a ``retryable`` error: a
  connection failure, a lost answer to a create that was then undone, a ``retryable``
  error answer (503, 429, ...). This module sends each of them once per attempt.
* The transport (:meth:`_Api.send`) retries only a request that was never sent: a
  connection that could not be established (httpcore's rule), up to ``attempts`` tries.
  It does so only for the calls the runtime does not retry: commands, files, archives,
  and this backend's own calls (server info, lease renewals, cancelling a command,
  abandoning a create). A request that was sent is never repeated here; a command is
  never repeated at all, except by the runtime when it never ran (``LaunchError``, which
  the server sends as final: its own Session retried it already).
"""

from __future__ import annotations

import builtins
import os
import random
import ssl
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager, suppress
from typing import Any, Self, cast
from urllib.parse import quote

import anyio
import anyio.abc
import httpx
import msgspec
from anyio import TypedAttributeSet, typed_attribute

from asyncsandbox import (
    BackendUnavailable,
    CodeContext,
    Execution,
    FileErrorReason,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxInfo,
    SandboxNotFound,
    SandboxOOMKilled,
    SandboxStatus,
)
from asyncsandbox.abc import (
    Backend,
    BackendCapabilities,
    CodeEventCallback,
    CodeRequest,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
)
from asyncsandbox.judge import Checker, JudgeRequest, JudgeResult
from asyncsandbox.log import get_logger

from . import _wire as w

__all__ = ("RemoteAttributes", "RemoteBackend")

BASE_URL_ENV = "ASYNCSANDBOX_BASE_URL"
API_KEY_ENV = "ASYNCSANDBOX_API_KEY"
MAX_TIMEOUT = 10 * 365 * 86400.0
"""Longest command timeout the wire takes; a longer one is sent as none (the runtime
enforces it all the same)."""
TIMEOUT_GRACE = 1.0
"""How long past a command's timeout the client waits for the server to report that it
killed the command (the server starts the clock later, by the request's latency), before
killing it by id instead."""
MAX_FRAME_BYTES = 64 * 1024 * 1024
JSON_HEADERS = {"content-type": "application/json"}

log = get_logger("asyncsandbox.remote")


class RemoteAttributes(TypedAttributeSet):
    """Typed attributes of remote sandboxes (``sandbox.extra(RemoteAttributes.base_url)``)."""

    base_url: str = typed_attribute()
    """The server the sandbox lives on."""
    server_backend: str = typed_attribute()
    """The backend the server runs it on (``process``, ``docker``, ...)."""


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


def _mapped(
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


def _transport_error(exc: httpx.HTTPError, base_url: str, what: str) -> BackendUnavailable:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return BackendUnavailable(
            f"cannot reach the sandbox server at {base_url} ({what}): {_first_message(exc)}",
            retryable=True,
        )
    if isinstance(exc, httpx.TimeoutException):
        return BackendUnavailable(
            f"the sandbox server at {base_url} did not answer in time ({what}: "
            f"{type(exc).__name__})",
            retryable=False,
        )
    return BackendUnavailable(
        f"lost the connection to the sandbox server at {base_url} ({what}): "
        f"{type(exc).__name__}: {exc}",
        retryable=False,
    )


def _unsent(exc: SandboxError) -> bool:
    """Whether ``exc`` says a request never left: its connection could not be established."""
    return isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


def _died(exc: SandboxError) -> SandboxError:
    """Inside a sandbox, "no such sandbox" means it is gone: the contract says SandboxDied."""
    if isinstance(exc, SandboxNotFound):
        return SandboxDied(exc.sandbox_id, "not found on the server (removed, or lease expired)")
    return exc


# -- HTTP ---------------------------------------------------------------------------------


class _Api:
    """One pooled httpx client; retries only what was never sent (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float,
        connect_timeout: float,
        attempts: int,
        backoff: float,
        max_connections: int,
        verify: bool | str | ssl.SSLContext,
        cleanup: float,
    ) -> None:
        self.base_url = base_url
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self.client = httpx.AsyncClient(
            base_url=base_url,
            headers={"authorization": f"Bearer {api_key}", "user-agent": "asyncsandbox-remote"},
            timeout=httpx.Timeout(timeout, connect=connect_timeout, pool=None),
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
        self.attempts = attempts
        self.backoff = backoff
        self.cleanup = cleanup
        """Seconds a shielded cleanup may take (the Session's ``Timeouts.cleanup``)."""

    async def _sleep(self, attempt: int) -> None:
        await anyio.sleep(random.uniform(0, min(2.0, self.backoff * 2 ** (attempt - 1))))

    async def send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        reconnect: bool,
        stream: bool = False,
        params: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> httpx.Response:
        """Send a request once and return the answer, whatever its status. With
        ``reconnect`` (a call the runtime does not retry), a connection that could not be
        established is tried again, up to ``attempts`` tries: nothing was sent. Nothing
        else is ever retried here."""
        attempt = 0
        while True:
            attempt += 1
            timeout = self.client.timeout
            if read_timeout is not None:
                timeout = httpx.Timeout(
                    connect=timeout.connect, read=read_timeout, write=timeout.write, pool=None
                )
            request = self.client.build_request(
                method, path, params=params, content=content, headers=headers, timeout=timeout
            )
            try:
                return await self.client.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Raised while connecting, before the request was written (httpx raises
                # them from the connection's setup only).
                if reconnect and attempt < self.attempts:
                    log.debug(
                        "remote.client.reconnect", what=what, attempt=attempt, error=repr(exc)
                    )
                    await self._sleep(attempt)
                    continue
                raise _transport_error(exc, self.base_url, what) from exc
            except httpx.HTTPError as exc:
                raise _transport_error(exc, self.base_url, what) from exc

    async def call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        reconnect: bool,
        sandbox_id: str | None = None,
        params: Any = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> httpx.Response:
        """A unary call: the answer, read whole; error answers raise mapped errors."""
        response = await self.send(
            method,
            path,
            what=what,
            reconnect=reconnect,
            params=params,
            content=content,
            headers=headers,
            read_timeout=read_timeout,
        )
        if response.status_code >= 400:
            raise self.error(response, sandbox_id)
        return response

    def error(self, response: httpx.Response, sandbox_id: str | None) -> SandboxError:
        return _mapped(
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
    ) -> AsyncIterator[httpx.Response]:
        """A streamed answer (status checked). Leaving the block closes the connection if
        the body was not read to the end: that is how the server learns we are gone."""
        response = await self.send(
            method,
            path,
            what=what,
            reconnect=True,  # commands and archives: the runtime never retries them
            stream=True,
            params=params,
            content=content,
            headers=headers,
        )
        try:
            if response.status_code >= 400:
                try:
                    await response.aread()
                except httpx.HTTPError as exc:
                    raise _transport_error(exc, self.base_url, what) from exc
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


# -- the backend --------------------------------------------------------------------------


class RemoteBackend(Backend):
    """Sandboxes on a server (``asyncsandbox serve``), over HTTP: ``Session("remote")``.

    :param base_url: the server, such as ``https://sandboxes.example:8765`` (default:
        ``$ASYNCSANDBOX_BASE_URL``).
    :param api_key: the tenant's API key, sent as a bearer token (default:
        ``$ASYNCSANDBOX_API_KEY``). Never logged nor shown in ``repr``.
    :param timeout: seconds any single read or write on the connection may take (the
        server pings silent commands, so long commands are fine).
    :param connect_timeout: seconds to establish a connection.
    :param attempts: tries of a request whose connection could not be established
        (nothing was sent), with jittered exponential backoff from ``backoff`` seconds,
        for the calls the Session does not retry itself: commands, files, archives and
        this backend's own calls. Lifecycle calls (create, remove, ...) are retried by the
        Session's :class:`~asyncsandbox.RetryPolicy` alone, and a request that was sent
        is never repeated by the backend (see the module docstring). A create carries an
        idempotency key: when its answer is lost, it is undone before it is retried.
    :param lease_seconds: lease asked for each sandbox (default: the server's). The
        backend renews the leases of its sandboxes in the background; when this process
        vanishes, the server removes them once the lease expires.
    :param verify: TLS verification: True, False, a CA bundle path or an ``SSLContext``.
    :param max_connections: size of the connection pool (each running command holds one).

    Works on asyncio and trio. Errors are asyncsandbox errors: a refused key is
    :class:`~asyncsandbox.BackendUnavailable` (not retryable) saying so, quotas answer
    ``BackendUnavailable`` (retryable), a sandbox the server no longer has is
    :class:`~asyncsandbox.SandboxDied` inside it and
    :class:`~asyncsandbox.SandboxNotFound` from :meth:`attach`.
    """

    name = "remote"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        attempts: int = 4,
        backoff: float = 0.2,
        lease_seconds: float | None = None,
        verify: bool | str | ssl.SSLContext = True,
        max_connections: int = 512,
    ) -> None:
        url: object = base_url if base_url is not None else os.environ.get(BASE_URL_ENV, "")
        key: object = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"the remote backend needs the server's URL: RemoteBackend(base_url="
                f"'http://host:port') or ${BASE_URL_ENV} (got {url!r})"
            )
        if not isinstance(key, str) or not key.strip():
            raise InvalidArgument(
                f"the remote backend needs an API key: RemoteBackend(api_key=...) or ${API_KEY_ENV}"
            )
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if not 0 < value < float("inf"):
                raise InvalidArgument(f"{name} must be a positive number of seconds")
        if attempts < 1:
            raise InvalidArgument("attempts must be an integer >= 1")
        if lease_seconds is not None and not 0 < lease_seconds < float("inf"):
            raise InvalidArgument("lease_seconds must be a positive number of seconds or None")
        self.base_url = url.rstrip("/")
        self._key = key.strip()
        self._options: dict[str, Any] = {
            "timeout": float(timeout),
            "connect_timeout": float(connect_timeout),
            "attempts": attempts,
            "backoff": backoff,
            "max_connections": max_connections,
            "verify": verify,
        }
        self._lease_seconds = lease_seconds
        self._api: _Api | None = None
        self._info: w.ServerInfo | None = None
        self._caps: BackendCapabilities | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._leased: set[str] = set()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._api else "new")
        return f"<RemoteBackend {self.base_url} {state} leased={len(self._leased)}>"

    @property
    def capabilities(self) -> BackendCapabilities:
        if self._caps is not None:
            return self._caps
        # Until entered (and the server asked) only what the client itself can promise.
        return BackendCapabilities(
            isolation=f"remote server at {self.base_url} (not connected yet)",
            network_modes=frozenset({"none", "host"}),
        )

    @property
    def api(self) -> _Api:
        if self._api is None:
            raise BackendUnavailable(
                "the remote backend is not open (use it through a Session)", retryable=False
            )
        return self._api

    async def __aenter__(self) -> Self:
        if self._closed or self._api is not None:
            raise InvalidArgument("a RemoteBackend can be opened once")
        self._api = _Api(self.base_url, self._key, cleanup=self.timeouts.cleanup, **self._options)
        task_group = anyio.create_task_group()
        try:
            response = await self._api.call("GET", "/v1/info", what="info", reconnect=True)
            try:
                info = w.INFO.decode(response.content)
            except msgspec.DecodeError as exc:
                raise BackendUnavailable(
                    f"{self.base_url} does not answer like an asyncsandbox server: {exc}",
                    retryable=False,
                ) from None
            self._info = info
            caps = info.capabilities
            self._caps = BackendCapabilities(
                isolation=f"remote: {caps.isolation} ({info.backend} at {self.base_url})",
                enforced_limits=frozenset(caps.enforced_limits),
                best_effort_limits=caps.best_effort_limits,
                limits_note=caps.limits_note,
                network_modes=frozenset(caps.network_modes),
                reports_signal=caps.reports_signal,
                snapshots=caps.snapshots,
            )
            # Exited in aclose(), which the Session calls from this same task.
            await task_group.__aenter__()
        except BaseException:
            self._closed = True
            await self._api.aclose()
            raise
        self._task_group = task_group
        task_group.start_soon(self._keep_leases)
        return self

    async def aclose(self) -> None:
        if self._closed and self._task_group is None:
            return
        self._closed = True
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
        if self._api is not None:
            await self._api.aclose()

    async def _keep_leases(self) -> None:
        lease = self._lease_seconds or (self._info.lease_seconds if self._info else 60.0)
        period = max(0.2, lease / 3)
        while True:
            await anyio.sleep(period)
            ids = sorted(self._leased)
            if not ids:
                continue
            try:
                response = await self.api.call(
                    "POST",
                    "/v1/leases",
                    what="renew leases",
                    reconnect=True,
                    content=w.RENEWAL.encode(w.LeaseRenewal(ids=ids)),
                    headers=JSON_HEADERS,
                )
                missing = w.LEASES.decode(response.content).missing
            except (SandboxError, msgspec.DecodeError) as exc:
                log.warning("remote.lease.renew_failed", error=str(exc))
                continue
            self._leased.difference_update(missing)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.api.call(
            "DELETE",
            _snapshot_path(snapshot_id),
            what="delete snapshot",
            reconnect=True,  # idempotent
        )

    def _handle(self, description: w.SandboxDescription) -> RemoteSandbox:
        self._leased.add(description.id)
        return RemoteSandbox(self, description)

    def _create_body(self, spec: SandboxSpec) -> w.CreateSandbox:
        res = spec.resources
        return w.CreateSandbox(
            image=spec.image,
            env=dict(spec.env),
            workdir=spec.workdir,
            resources=w.ResourceLimits(cpus=res.cpus, memory_mb=res.memory_mb, pids=res.pids),
            network=spec.network,
            labels=dict(spec.labels),
            max_lifetime=spec.max_lifetime,
            lease_seconds=self._lease_seconds,
            snapshot=spec.snapshot,
        )

    async def judge(self, request: JudgeRequest) -> JudgeResult:
        """The whole judgement on the server, in one request (``POST /v1/judge``, whose
        body is the request itself): the cases run where the sandbox is, with no round
        trip each."""
        # The server enforces every limit; wait as long as they may take, one case at a
        # time (a checker's run counts as another case), the builds, and a margin.
        per_case = 5 if isinstance(request.comparison, Checker) else 1
        cases = sum(case.time_limit or request.time_limit for case in request.cases)
        budget = 2 * request.compile_timeout + per_case * cases + 60
        response = await self.api.call(
            "POST",
            "/v1/judge",
            what="judge",
            reconnect=False,  # not idempotent: a lost answer is an infrastructure error
            content=w.JUDGE.encode(request),
            headers=JSON_HEADERS,
            read_timeout=budget,
        )
        try:
            return w.JUDGE_RESULT.decode(response.content)
        except msgspec.DecodeError as exc:
            raise InfrastructureError(f"invalid answer to judge: {exc}") from None

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        key = uuid.uuid4().hex
        body = self._create_body(spec)
        api = self.api
        try:
            response = await api.send(
                "POST",
                "/v1/sandboxes",
                what="create",
                reconnect=False,  # the Session retries creates (RetryPolicy)
                content=w.CREATE.encode(body),
                headers={**JSON_HEADERS, "idempotency-key": key},
            )
        except BackendUnavailable as exc:
            if _unsent(exc):
                raise  # the server never saw this create: nothing to undo (retryable)
            # Sent, and its answer lost: undo whatever it did. Once that is confirmed the
            # create left nothing behind, and the Session may try again.
            exc.retryable = await self._abandon(key)
            raise
        except BaseException:
            await self._abandon(key)  # cancelled: the outcome is unknown
            raise
        if response.status_code >= 500:
            await self._abandon(key)
        if response.status_code >= 400:
            raise api.error(response, None)
        try:
            description = w.DESCRIPTION.decode(response.content)
        except msgspec.DecodeError as exc:
            await self._abandon(key)
            raise InfrastructureError(f"invalid answer to create: {exc}") from None
        return self._handle(description)

    async def _abandon(self, key: str) -> bool:
        """Undo a create whose outcome we do not know (shielded, bounded); whether the
        server confirmed that nothing of it is left."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.api.cleanup):
            try:
                await self.api.call(
                    "DELETE", f"/v1/creates/{key}", what="abandon create", reconnect=True
                )
            except SandboxError as exc:
                log.warning("remote.create.abandon_failed", error=str(exc))
            else:
                return True
        return False

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        response = await self.api.call(
            "GET", _sandbox_path(sandbox_id), what="attach", reconnect=False, sandbox_id=sandbox_id
        )
        return self._handle(_decode(w.DESCRIPTION, response))

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        params = [("label", f"{key}={value}") for key, value in labels.items()]
        response = await self.api.call(
            "GET", "/v1/sandboxes", what="list", reconnect=False, params=params
        )
        return [_info(item) for item in _decode(w.LIST, response).items]


def _snapshot_path(snapshot_id: str) -> str:
    from urllib.parse import quote

    return f"/v1/snapshots/{quote(snapshot_id, safe='')}"


def _sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    from urllib.parse import quote

    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def _decode(codec: w.Codec[Any], response: httpx.Response) -> Any:
    try:
        return codec.decode(response.content)
    except msgspec.DecodeError as exc:
        raise InfrastructureError(f"invalid answer from the sandbox server: {exc}") from None


def _status(value: str) -> SandboxStatus:
    try:
        return SandboxStatus(value)
    except ValueError:
        return SandboxStatus.DEAD


def _info(item: w.SandboxDescription) -> SandboxInfo:
    return SandboxInfo(
        id=item.id,
        status=_status(item.status),
        labels=dict(item.labels),
        image=item.image,
        created_at=item.created_at,
        backend=RemoteBackend.name,
    )


async def _aiter(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk


class RemoteSandbox(SandboxHandle):
    """One sandbox on the server."""

    def __init__(self, backend: RemoteBackend, description: w.SandboxDescription) -> None:
        self._backend = backend
        self._id = description.id
        self._server_backend = description.backend

    @property
    def id(self) -> str:
        return self._id

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            RemoteAttributes.base_url: lambda: self._backend.base_url,
            RemoteAttributes.server_backend: lambda: self._server_backend,
        }

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,  # advisory (see the contract)
    ) -> ExitStatus:
        api = self._backend.api
        exec_id = uuid.uuid4().hex
        # The server enforces the command's timeout itself: it kills the process tree and
        # ends the stream with the exit frame, which is all a timed-out command costs.
        deadline = None if timeout is None else anyio.current_time() + timeout
        body = w.EXEC.encode(
            w.ExecRequest(
                argv=list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=stdin,
                timeout=timeout if timeout is not None and timeout <= MAX_TIMEOUT else None,
                exec_id=exec_id,
            )
        )
        frames: _Frames | None = None
        over = cancelled = False  # over: the server said the command ended (or never ran)
        try:
            async with api.stream(
                "POST",
                _sandbox_path(self._id, "/exec/stream"),
                what="exec",
                sandbox_id=self._id,
                content=body,
                headers=JSON_HEADERS,
            ) as response:
                frames = _Frames(self, response, on_output)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(frames.read)
                    try:
                        await frames.done.wait()
                    except anyio.get_cancelled_exc_class():
                        await frames.end_at(deadline, cleanup=api.cleanup)
                        raise
                return await frames.outcome()
        except SandboxError as exc:
            # An error answer, or the error the server reported instead of an exit status:
            # the command is over. Only a lost connection leaves it maybe running.
            over = not isinstance(exc, BackendUnavailable)
            raise _died(exc) from exc.__cause__
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise
        finally:
            if frames is not None and frames.over:
                over = True
            if not over:
                # Cancelled (or the link broke) while the command may run: kill it by id and
                # wait until the server says its process tree is gone (shielded, bounded).
                unconfirmed = await self._kill(exec_id)
                if cancelled and unconfirmed is not None:
                    # Not the cancellation: it would pass the command off as killed (and
                    # its timeout as its own outcome), while it may still run.
                    raise BackendUnavailable(
                        f"the sandbox server at {self._backend.base_url} did not confirm that "
                        f"the command was killed ({unconfirmed}); it may still run",
                        retryable=False,
                    )

    async def _kill(self, exec_id: str) -> str | None:
        """Kill a command by its id, shielded and bounded by ``Timeouts.cleanup``: None
        once the server confirmed that its process tree is gone, else why it did not."""
        api = self._backend.api
        with anyio.CancelScope(shield=True), anyio.move_on_after(api.cleanup):
            try:
                await api.call(
                    "DELETE",
                    _sandbox_path(self._id, f"/execs/{exec_id}"),
                    what="cancel exec",
                    reconnect=True,
                    sandbox_id=self._id,
                )
            except SandboxNotFound:
                return None  # the sandbox is gone, and the command with it
            except SandboxError as exc:
                log.debug("remote.exec.cancel_failed", error=str(exc))
                return str(exc)
            return None
        return "no answer"

    # -- the code interpreter: run where the sandbox is (a CodeInterpreter) ---------------

    async def run_code(self, request: CodeRequest, *, on_event: CodeEventCallback) -> Execution:
        """The whole call on the server (``POST .../code/run``), its events delivered as
        its frames come. The server enforces the timeout (a timed-out execution comes back
        as data); leaving early closes the connection, which interrupts the code there."""
        api = self._backend.api
        try:
            async with api.stream(
                "POST",
                _sandbox_path(self._id, "/code/run"),
                what="run_code",
                sandbox_id=self._id,
                content=w.CODE_REQUEST.encode(request),
                headers=JSON_HEADERS,
            ) as response:
                return await self._code_frames(response, on_event)
        except SandboxError as exc:
            raise _died(exc) from exc.__cause__

    async def _code_frames(
        self, response: httpx.Response, on_event: CodeEventCallback
    ) -> Execution:
        """Deliver the events; return the execution of the end frame (or raise the error
        of an error frame) once the stream is read to its end: the connection is reused,
        and nothing of it is left to the garbage collector."""
        buffer = bytearray()
        base_url = self._backend.base_url
        execution: Execution | None = None
        error: SandboxError | None = None
        try:
            raw = cast(AsyncGenerator[bytes, None], response.aiter_raw())
            async with aclosing(raw) as chunks:
                async for chunk in chunks:
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        line = bytes(buffer[start:end])
                        start = end + 1
                        if not line:
                            continue
                        try:
                            frame = w.decode_code_frame(line)
                        except msgspec.DecodeError as exc:
                            raise InfrastructureError(
                                f"invalid run_code frame from the server: {exc}"
                            ) from None
                        if isinstance(frame, w.CodeEndFrame):
                            execution = frame.execution
                        elif isinstance(frame, w.ErrorFrame):
                            error = _mapped(
                                500, frame.error, base_url=base_url, sandbox_id=self._id
                            )
                        elif frame is not None and not isinstance(frame, w.PingFrame):
                            await on_event(frame)
                    del buffer[:start]
                    if len(buffer) > MAX_FRAME_BYTES:
                        raise InfrastructureError("the server sent a run_code frame over 64 MiB")
        except httpx.HTTPError as exc:
            if execution is None and error is None:
                raise _transport_error(exc, base_url, "run_code") from exc
        if error is not None:
            raise error
        if execution is None:
            raise InfrastructureError(
                "the sandbox server ended the run_code stream without the execution",
                retryable=False,
            )
        return execution

    async def create_code_context(self, *, cwd: str, language: str) -> CodeContext:
        response = await self._code_call(
            "POST",
            "/code/contexts",
            "create code context",
            content=w.NEW_CONTEXT.encode(w.NewCodeContext(cwd=cwd, language=language)),
        )
        context: CodeContext = _decode(w.CONTEXT, response)
        return context

    async def list_code_contexts(self) -> builtins.list[CodeContext]:
        response = await self._code_call("GET", "/code/contexts", "list code contexts")
        listed: w.CodeContextList = _decode(w.CONTEXTS, response)
        return listed.items

    async def restart_code_context(self, context_id: str) -> None:
        await self._code_call(
            "POST", f"/code/contexts/{quote(context_id, safe='')}/restart", "restart code context"
        )

    async def remove_code_context(self, context_id: str) -> None:
        await self._code_call(
            "DELETE", f"/code/contexts/{quote(context_id, safe='')}", "remove code context"
        )

    async def _code_call(
        self, method: str, suffix: str, what: str, *, content: bytes | None = None
    ) -> httpx.Response:
        try:
            return await self._backend.api.call(
                method,
                _sandbox_path(self._id, suffix),
                what=what,
                reconnect=True,
                sandbox_id=self._id,
                content=content,
                headers=JSON_HEADERS if content is not None else None,
            )
        except SandboxError as exc:
            raise _died(exc) from None

    # -- files -------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        try:
            response = await self._backend.api.call(
                "GET",
                _sandbox_path(self._id, "/files"),
                what="read file",
                reconnect=True,
                sandbox_id=self._id,
                params={"path": path, "max_bytes": max_bytes},
            )
        except SandboxError as exc:
            raise _died(exc) from None
        return response.content

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        try:
            await self._backend.api.call(
                "PUT",
                _sandbox_path(self._id, "/files"),
                what="write file",
                reconnect=True,
                sandbox_id=self._id,
                params={"path": path, "mode": format(mode, "o")},
                content=data,
                headers={"content-type": "application/octet-stream"},
            )
        except SandboxError as exc:
            raise _died(exc) from None

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        try:
            await self._backend.api.call(
                "PUT",
                _sandbox_path(self._id, "/archive"),
                what="upload",
                reconnect=True,  # the stream was not read yet when a connection failed
                sandbox_id=self._id,
                params={"path": path},
                content=_aiter(archive),
                headers={"content-type": "application/x-tar"},
            )
        except SandboxError as exc:
            raise _died(exc) from None

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        api = self._backend.api
        try:
            async with (
                api.stream(
                    "GET",
                    _sandbox_path(self._id, "/archive"),
                    what="download",
                    sandbox_id=self._id,
                    params={"path": path},
                ) as response,
                aclosing(_Chunks(response, self._backend.base_url)) as chunks,
            ):
                yield chunks
        except SandboxError as exc:
            raise _died(exc) from None

    async def inspect(self) -> SandboxInfo:
        response = await self._backend.api.call(
            "GET", _sandbox_path(self._id), what="inspect", reconnect=False, sandbox_id=self._id
        )
        return _info(_decode(w.DESCRIPTION, response))

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        # The server keeps a tenant's snapshots until the tenant deletes them: labels are
        # for backends that list their snapshots for gc, which this one does not.
        # Sent once (a retry would take another snapshot); its answer lost, the snapshot
        # stays the tenant's until the server goes (it is not this session's to delete).
        response = await self._backend.api.call(
            "POST",
            _sandbox_path(self._id) + "/snapshot",
            what="snapshot",
            reconnect=False,
            sandbox_id=self._id,
        )
        created: w.SnapshotCreated = _decode(w.SNAPSHOT, response)
        return created.id

    async def remove(self) -> None:
        try:
            await self._backend.api.call(
                "DELETE",
                _sandbox_path(self._id),
                what="remove",
                reconnect=False,
                sandbox_id=self._id,
            )
        except SandboxNotFound:
            pass  # already gone: removing is idempotent
        finally:
            self._backend._leased.discard(self._id)


class _Frames:
    """The frames of one command's exec stream, read by a task of their own in a shielded
    scope: a cancellation of the exec never cuts a read short (httpx closes a connection
    whose read was cancelled), so the exec can still receive the command's end from the
    server, which enforces the command's timeout (:meth:`end_at`)."""

    def __init__(
        self, sandbox: RemoteSandbox, response: httpx.Response, on_output: OutputCallback
    ) -> None:
        self._sandbox = sandbox
        self._response = response
        self._on_output = on_output
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
        buffer = bytearray()
        sandbox = self._sandbox
        try:
            raw = cast(AsyncGenerator[bytes, None], self._response.aiter_raw())
            async with aclosing(raw) as chunks:
                async for chunk in chunks:
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        line = bytes(buffer[start:end])
                        start = end + 1
                        if line:
                            await self._frame(line)
                    del buffer[:start]
                    if len(buffer) > MAX_FRAME_BYTES:
                        raise InfrastructureError("the server sent an exec frame over 64 MiB")
        except httpx.HTTPError as exc:
            if self._error is not None or self._status is not None:
                return  # the command's end arrived; only the connection's end was lost
            raise _transport_error(exc, sandbox._backend.base_url, "exec") from exc
        # Read to its end (the exit or error frame is the last one): the connection is
        # reused, and nothing of it is left to the garbage collector.
        if self._error is None and self._status is None:
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
                returncode=frame.returncode, signal=frame.signal, oom_killed=frame.oom_killed
            )
            self._timed_out = frame.timed_out
        elif isinstance(frame, w.ErrorFrame):
            sandbox = self._sandbox
            self._error = _mapped(
                500, frame.error, base_url=sandbox._backend.base_url, sandbox_id=sandbox.id
            )


class _Chunks:
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
            raise _transport_error(exc, self._base_url, "download") from exc

    async def aclose(self) -> None:
        await self._chunks.aclose()  # type: ignore[attr-defined]
