"""The server: an ASGI application (Starlette) over one :class:`asyncsandbox.Session`.

Design
------
* **One Session, per-tenant bookkeeping.** The Session's limits protect the *backend*
  (a Docker daemon wedges under bursts of lifecycle calls whoever sends them), so they
  must be global; a Session per tenant would multiply them by the number of tenants.
  Tenant quotas are different: they must refuse at once (429) rather than queue, so
  they are counters checked before any work starts.
* **Tenancy.** Every sandbox is a record owned by one tenant; a lookup by another tenant
  answers 404 exactly as an unknown id does, so ids of others cannot be probed. The
  client's labels are stored in the record and returned verbatim; on the backend the
  sandbox carries the server's own owner labels plus a ``remote-tenant:NAME`` tag.
* **Leases.** Each record has a lease, renewed by every use and by heartbeats. A
  background task removes sandboxes whose lease expired and that have no request in
  flight: the sandboxes of a client that vanished.
* **Cancellation.** Exec requests watch for the client's disconnect and cancel the
  command, and ``DELETE .../execs/{exec_id}`` cancels it by id and answers once the
  process tree is gone; the runtime kills the tree in both cases.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.abc
import msgspec
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from asyncsandbox import (
    BackendTimeout,
    BackendUnavailable,
    CapacityTimeout,
    ExecResult,
    ExecTimeout,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    Resources,
    Sandbox,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxNotFound,
    SandboxOOMKilled,
    SandboxStatus,
    Session,
    create_backend,
)
from asyncsandbox.abc import Backend
from asyncsandbox.log import get_logger

from . import _wire as w
from ._config import ServerConfig, Tenant
from ._metrics import Metrics
from ._openapi import OPERATIONS, openapi
from ._served import ServedBackend

__all__ = ("create_app",)

log = get_logger("asyncsandbox.remote")

T = TypeVar("T")

TENANT_TAG_PREFIX = "remote-tenant:"
MAX_TOMBSTONES = 1024
DEFAULT_READ_LIMIT = 100 * 1024 * 1024
LOOKAHEAD = 1024 * 1024
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


# -- errors -------------------------------------------------------------------------------


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


def _not_found(sandbox_id: str) -> HttpError:
    sandbox_id = sandbox_id[:128]
    return HttpError(
        404, "sandbox_not_found", f"sandbox {sandbox_id!r} not found", sandbox_id=sandbox_id
    )


def _bad_request(message: str) -> HttpError:
    return HttpError(400, "invalid_argument", message)


# -- state --------------------------------------------------------------------------------


@dataclass(eq=False)
class _Activity:
    """One request working on a sandbox; ``scope`` cancels it."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class _Record:
    id: str
    tenant: _TenantState
    sandbox: Sandbox
    labels: dict[str, str]
    image: str | None
    workdir: str
    created_at: float
    lease_seconds: float
    lease_deadline: float = 0.0
    busy: int = 0
    execs: dict[str, _Activity] = field(default_factory=dict)
    cancelled_execs: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_TOMBSTONES))
    removing: bool = False
    sandbox_backend: str = ""

    def renew(self) -> None:
        self.lease_deadline = time.monotonic() + self.lease_seconds

    def describe(self, status: str) -> w.SandboxDescription:
        remaining = max(0.0, self.lease_deadline - time.monotonic())
        return w.SandboxDescription(
            id=self.id,
            status=status,
            labels=self.labels,
            image=self.image,
            workdir=self.workdir,
            created_at=self.created_at,
            lease_expires_at=round(time.time() + remaining, 3),
            backend=self.sandbox_backend,
        )


@dataclass(eq=False)
class _Creation:
    """What an idempotency key stands for."""

    fingerprint: bytes
    state: str = "pending"  # pending, done, abandoned
    scope: anyio.CancelScope | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: w.SandboxDescription | None = None
    sandbox_id: str | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _TenantState:
    name: str
    max_live: int | None
    max_execs: int | None
    records: dict[str, _Record] = field(default_factory=dict)
    creating: int = 0
    in_flight: int = 0
    keys: OrderedDict[str, _Creation] = field(default_factory=OrderedDict)

    @property
    def tag(self) -> str:
        return TENANT_TAG_PREFIX + self.name


# -- helpers ------------------------------------------------------------------------------


def _json(codec: w.Codec[T], value: T, status: int = 200, **headers: str) -> Response:
    return Response(
        codec.encode(value), status_code=status, media_type="application/json", headers=headers
    )


async def _until_disconnect(receive: Receive, work: Callable[[], Awaitable[None]]) -> bool:
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


def _valid_id(value: str) -> bool:
    return 0 < len(value) <= 255 and all(c in _ID_CHARS for c in value)


def _labels_filter(values: Iterable[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _bad_request(f"label filters are KEY=VALUE, got {item[:100]!r}")
        labels[key] = value
    return labels


def _statuses(values: Iterable[str]) -> set[str] | None:
    wanted = set(values)
    known = {s.value for s in SandboxStatus}
    if wanted - known:
        raise _bad_request(f"unknown status {sorted(wanted - known)}; known: {sorted(known)}")
    return wanted or None


def _exec_response(result: ExecResult) -> w.ExecResponse:
    return w.ExecResponse(
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr,
        duration=result.duration,
        timed_out=result.timed_out,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        stdout_size=result.stdout_size,
        stderr_size=result.stderr_size,
        signal=result.signal,
        oom_killed=result.oom_killed,
    )


class _Streamed(Response):
    """A response that runs its own ASGI exchange (streams, disconnect watching)."""

    def __init__(self, run: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._run = run
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._run(scope, receive, send)


async def _start(send: Send, media_type: str) -> None:
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


class _BodyStopped(SandboxError):
    """Raised in a request body handed to the runtime (which lets asyncsandbox errors pass
    untouched): the body could not be read to its end; :meth:`_Body.raise_stopped` says why."""


class _Body:
    """A streamed request body as chunks for the runtime, bounded by ``limit`` bytes."""

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
                    self._stopped = RemoteServer._too_large(self._limit)
                    raise _BodyStopped("the request body is too large")
                if chunk:
                    yield chunk
        except ClientDisconnect as exc:
            self._stopped = exc
            raise _BodyStopped("the client disconnected") from None

    def raise_stopped(self) -> None:
        """If the body stopped, raise why (413, or the client's disconnect), whatever the
        backend made of it."""
        if self._stopped is not None:
            raise self._stopped from None


# -- the server ---------------------------------------------------------------------------


class RemoteServer:
    """The server's state and request handlers (one per application)."""

    def __init__(
        self,
        config: ServerConfig,
        tenants: Iterable[Tenant],
        backend: Backend | None = None,
        *,
        version: str = "",
    ) -> None:
        self.config = config
        self.version = version
        self._backend_given = backend
        self._tenant_keys: list[tuple[bytes, _TenantState]] = []
        self._tenants: dict[str, _TenantState] = {}
        for tenant in tenants:
            state = self._tenants.get(tenant.name)
            if state is None:
                state = self._tenants[tenant.name] = _TenantState(
                    tenant.name,
                    tenant.max_live if tenant.max_live is not None else config.max_live_per_tenant,
                    tenant.max_execs
                    if tenant.max_execs is not None
                    else config.max_execs_per_tenant,
                )
            self._tenant_keys.append((tenant.key_digest, state))
        if not self._tenant_keys:
            raise InvalidArgument(
                "the server needs at least one API key: pass --keys FILE or set "
                "ASYNCSANDBOX_API_KEYS (TENANT:KEY entries)"
            )
        self._records: dict[str, _Record] = {}
        self._session: Session | None = None
        self._served: ServedBackend | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self.closing = False
        self.metrics = Metrics()
        self._openapi = w.Codec[Any](dict).encode(openapi(version))

    # -- lifecycle ----------------------------------------------------------------------

    def _make_backend(self) -> Backend:
        if self._backend_given is not None:
            return self._backend_given
        return create_backend(self.config.backend, dict(self.config.backend_options))

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Open the Session and the lease reaper; on exit remove (or keep) the sandboxes."""
        served = self._served = ServedBackend(self._make_backend())
        session = Session(
            served,
            limits=self.config.limits,
            timeouts=self.config.timeouts,
            sweep=self.config.sweep,
        )
        async with session:
            self._session = session
            caps = served.capabilities
            log.info(
                "remote.server.started",
                backend=served.inner.name,
                isolation=caps.isolation,
                tenants=sorted(self._tenants),
            )
            try:
                async with anyio.create_task_group() as tg:
                    self._task_group = tg
                    tg.start_soon(self._reap_forever)
                    try:
                        yield
                    finally:
                        self.closing = True
                        tg.cancel_scope.cancel()
            finally:
                self.closing = True
                live = len(self._records)
                if self.config.on_shutdown == "keep":
                    served.keep = True
                log.info(
                    "remote.server.stopping",
                    sandboxes=live,
                    policy=self.config.on_shutdown,
                )
        self._records.clear()
        for tenant in self._tenants.values():
            tenant.records.clear()

    @property
    def session(self) -> Session:
        if self._session is None:
            raise HttpError(503, "shutting_down", "the server is not running", retryable=True)
        return self._session

    async def _reap_forever(self) -> None:
        interval = max(0.05, min(self.config.lease_seconds / 4, 5.0))
        while True:
            await anyio.sleep(interval)
            await self.reap()

    async def reap(self) -> list[str]:
        """Remove sandboxes whose lease expired and that nothing uses; forget old keys."""
        now = time.monotonic()
        expired = [
            r
            for r in self._records.values()
            if r.busy == 0 and not r.removing and r.lease_deadline <= now
        ]
        for tenant in self._tenants.values():
            while tenant.keys:
                key, creation = next(iter(tenant.keys.items()))
                if creation.state == "pending" or now - creation.at < self.config.idempotency_ttl:
                    break
                del tenant.keys[key]
        if not expired:
            return []

        async def remove(record: _Record) -> None:
            log.info("remote.lease.expired", sandbox_id=record.id, tenant=record.tenant.name)
            self.metrics.leases_expired += 1
            await self._drop(record)

        async with anyio.create_task_group() as tg:
            for record in expired:
                tg.start_soon(remove, record)
        return [r.id for r in expired]

    async def _drop(self, record: _Record) -> None:
        """Remove a sandbox and forget it (whatever the removal's outcome)."""
        if record.removing:
            return
        record.removing = True
        try:
            await record.sandbox.stop()
        except SandboxError as exc:
            # stop() always releases; an error only says the removal was not graceful.
            log.warning("remote.sandbox.remove_failed", sandbox_id=record.id, error=str(exc))
        finally:
            self._records.pop(record.id, None)
            record.tenant.records.pop(record.id, None)
        log.debug("remote.sandbox.removed", sandbox_id=record.id, tenant=record.tenant.name)

    # -- request plumbing ---------------------------------------------------------------

    def authenticate(self, request: Request) -> _TenantState:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        found: _TenantState | None = None
        if scheme.lower() == "bearer" and token:
            presented = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
            # Constant time: compare against every key, never stop at the first match.
            for key_digest, tenant in self._tenant_keys:
                if hmac.compare_digest(presented, key_digest):
                    found = tenant
        if found is None:
            self.metrics.auth_failures += 1
            client = request.client.host if request.client else "?"
            log.warning("remote.auth.failed", client=client, had_token=bool(token))
            raise HttpError(
                401,
                "unauthorized",
                "missing or invalid API key: send 'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": 'Bearer realm="asyncsandbox"'},
            )
        return found

    def record(self, tenant: _TenantState, sandbox_id: str) -> _Record:
        found = tenant.records.get(sandbox_id)
        if found is None or found.removing:
            # Another tenant's sandbox answers exactly like one that does not exist.
            raise _not_found(sandbox_id)
        return found

    async def body(self, request: Request, limit: int) -> bytes:
        length = request.headers.get("content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise _bad_request("invalid Content-Length") from None
            if declared > limit:
                raise self._too_large(limit)
        chunks = bytearray()
        async for chunk in request.stream():
            chunks += chunk
            if len(chunks) > limit:
                raise self._too_large(limit)
        return bytes(chunks)

    @staticmethod
    def _too_large(limit: int) -> HttpError:
        return HttpError(
            413,
            "request_too_large",
            f"the request body exceeds the server's limit of {limit} bytes",
        )

    async def decode(self, request: Request, codec: w.Codec[T]) -> T:
        data = await self.body(request, self.config.max_request_bytes)
        try:
            return codec.decode(data)
        except msgspec.DecodeError as exc:
            raise _bad_request(f"invalid request body: {exc}") from None

    @asynccontextmanager
    async def use(
        self, tenant: _TenantState, record: _Record, *, exec_id: str | None = None
    ) -> AsyncIterator[_Activity]:
        """Account one operation on a sandbox: the tenant's exec quota, the lease, and the
        cancel-by-id registry."""
        if exec_id is not None and exec_id in record.cancelled_execs:
            raise HttpError(409, "exec_cancelled", f"exec {exec_id!r} was cancelled")
        if exec_id is not None and exec_id in record.execs:
            raise _bad_request(f"exec id {exec_id!r} is already running")
        if tenant.max_execs is not None and tenant.in_flight >= tenant.max_execs:
            self.metrics.quota_rejections[(tenant.name, "max_execs")] += 1
            log.info("remote.quota.exceeded", tenant=tenant.name, quota="max_execs")
            raise HttpError(
                429,
                "quota_exceeded",
                f"tenant {tenant.name!r} already runs {tenant.in_flight} commands and file "
                f"transfers (its max_execs quota is {tenant.max_execs}); retry when some finish",
                retryable=True,
                headers={"Retry-After": "1"},
            )
        activity = _Activity()
        tenant.in_flight += 1
        record.busy += 1
        record.renew()
        if exec_id is not None:
            record.execs[exec_id] = activity
        try:
            yield activity
        finally:
            tenant.in_flight -= 1
            record.busy -= 1
            record.renew()
            if exec_id is not None:
                record.execs.pop(exec_id, None)
            activity.done.set()

    # -- handlers: server ---------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        status = "shutting_down" if self.closing else "ok"
        return _json(w.HEALTH, w.Health(status=status, version=self.version))

    async def info(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        served = self._served
        caps = served.capabilities if served is not None else None
        networks = sorted(caps.network_modes) if caps else ["none"]
        if not self.config.allow_host_network:
            networks = [n for n in networks if n != "host"]
        return _json(
            w.INFO,
            w.ServerInfo(
                tenant=tenant.name,
                backend=served.inner.name if served is not None else self.config.backend,
                version=self.version,
                capabilities=w.Capabilities(
                    isolation=caps.isolation if caps else "",
                    enforced_limits=sorted(caps.enforced_limits) if caps else [],
                    network_modes=networks,
                    reports_signal=caps.reports_signal if caps else False,
                ),
                lease_seconds=self.config.lease_seconds,
                max_lease_seconds=self.config.max_lease_seconds,
                max_live=tenant.max_live,
                max_execs=tenant.max_execs,
                max_request_bytes=self.config.max_request_bytes,
                max_file_bytes=self.config.max_file_bytes,
                max_upload_bytes=self.config.max_upload_bytes,
            ),
        )

    async def metrics_text(self, request: Request) -> Response:
        session = self._session
        text = self.metrics.render(
            tenants={
                name: (len(t.records), t.creating, t.in_flight)
                for name, t in sorted(self._tenants.items())
            },
            statistics=session.statistics() if session is not None else None,
        )
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi_json(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    # -- handlers: sandboxes ------------------------------------------------------------

    async def create_sandbox(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        key = request.headers.get("idempotency-key")
        if key is not None and not (
            0 < len(key) <= 255 and key.isascii() and key.isprintable() and " " not in key
        ):
            raise _bad_request("Idempotency-Key must be 1-255 printable ASCII characters")
        spec = await self.decode(request, w.CREATE)
        fingerprint = hashlib.sha256(w.CREATE.encode(spec)).digest()
        if key is not None:
            creation = tenant.keys.get(key)
            while creation is not None:
                if creation.state == "abandoned":
                    raise HttpError(
                        409, "create_abandoned", "the create with this key was abandoned"
                    )
                if creation.fingerprint != fingerprint:
                    raise HttpError(
                        422,
                        "idempotency_conflict",
                        "this Idempotency-Key was used with a different request",
                    )
                if creation.state == "done" and creation.answer is not None:
                    self.metrics.idempotent_replays += 1
                    return _json(
                        w.DESCRIPTION, creation.answer, 200, **{"Idempotent-Replayed": "true"}
                    )
                await creation.done.wait()
                creation = tenant.keys.get(key)  # a failed create released the key
        if self.closing:
            raise HttpError(503, "shutting_down", "the server is shutting down", retryable=True)
        if tenant.max_live is not None and len(tenant.records) + tenant.creating >= tenant.max_live:
            self.metrics.quota_rejections[(tenant.name, "max_live")] += 1
            log.info("remote.quota.exceeded", tenant=tenant.name, quota="max_live")
            raise HttpError(
                429,
                "quota_exceeded",
                f"tenant {tenant.name!r} has {len(tenant.records) + tenant.creating} sandboxes "
                f"(its max_live quota is {tenant.max_live}); remove some first",
                retryable=True,
                headers={"Retry-After": "1"},
            )
        if spec.network != "none" and not (
            spec.network == "host" and self.config.allow_host_network
        ):
            raise _bad_request(f"network={spec.network!r} is not allowed on this server")
        res = spec.resources
        try:
            sandbox = self.session.sandbox(
                image=spec.image,
                env=spec.env,
                workdir=spec.workdir,
                resources=Resources(cpus=res.cpus, memory_mb=res.memory_mb, pids=res.pids),
                network=spec.network,
                max_lifetime=spec.max_lifetime,
                tags=(tenant.tag,),
            )
        except SandboxError as exc:
            raise error_for(exc) from None
        lease = min(spec.lease_seconds or self.config.lease_seconds, self.config.max_lease_seconds)
        creation = None
        if key is not None:
            creation = tenant.keys[key] = _Creation(fingerprint)
        tenant.creating += 1
        try:
            with anyio.CancelScope() as scope:
                if creation is not None:
                    creation.scope = scope
                await sandbox.start()
            if creation is not None and creation.state == "abandoned":
                await sandbox.stop()
                raise HttpError(409, "create_abandoned", "the create with this key was abandoned")
            assert sandbox.id is not None
            record = _Record(
                id=sandbox.id,
                tenant=tenant,
                sandbox=sandbox,
                labels=dict(spec.labels),
                image=spec.image,
                workdir=sandbox.config.workdir,
                created_at=round(time.time(), 3),
                lease_seconds=lease,
                sandbox_backend=self._served.inner.name if self._served else "",
            )
            record.renew()
            self._records[record.id] = record
            tenant.records[record.id] = record
            answer = record.describe(SandboxStatus.RUNNING.value)
            if creation is not None:
                creation.state = "done"
                creation.answer = answer
                creation.sandbox_id = record.id
        except BaseException:
            if creation is not None and creation.state == "pending":
                tenant.keys.pop(key or "", None)
            raise
        finally:
            tenant.creating -= 1
            if creation is not None:
                creation.scope = None
                creation.done.set()
        log.debug("remote.sandbox.created", sandbox_id=record.id, tenant=tenant.name)
        return _json(w.DESCRIPTION, answer, 201)

    async def abandon_create(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        key = request.path_params["idempotency_key"]
        creation = tenant.keys.get(key)
        if creation is None:
            # Not seen yet (the request may still be on its way): refuse it when it comes.
            tenant.keys[key] = _Creation(b"", state="abandoned")
        elif creation.state == "pending":
            creation.state = "abandoned"
            if creation.scope is not None:
                creation.scope.cancel()
            with anyio.move_on_after(self.config.timeouts.cleanup):
                await creation.done.wait()
        elif creation.state == "done":
            creation.state = "abandoned"
            record = tenant.records.get(creation.sandbox_id or "")
            if record is not None:
                await self._drop(record)
        return Response(status_code=204)

    async def _statuses_of(self, tenant: _TenantState) -> dict[str, str]:
        infos = await self.session.list(tags=[tenant.tag], this_session=True)
        return {i.id: i.status.value for i in infos}

    def _select(
        self, tenant: _TenantState, request: Request
    ) -> tuple[list[_Record], set[str] | None]:
        labels = _labels_filter(request.query_params.getlist("label"))
        wanted = _statuses(request.query_params.getlist("status"))
        chosen = [
            r
            for r in list(tenant.records.values())
            if not r.removing and all(r.labels.get(k) == v for k, v in labels.items())
        ]
        return chosen, wanted

    async def list_sandboxes(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        chosen, wanted = self._select(tenant, request)
        statuses = await self._statuses_of(tenant) if chosen else {}
        items = []
        for record in chosen:
            status = statuses.get(record.id, SandboxStatus.DEAD.value)
            if wanted is None or status in wanted:
                items.append(record.describe(status))
        return _json(w.LIST, w.SandboxList(items=items))

    async def delete_sandboxes(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        if not request.query_params.getlist("label"):
            raise _bad_request("deleting needs at least one label filter (refusing to delete all)")
        chosen, wanted = self._select(tenant, request)
        if wanted is not None and chosen:
            statuses = await self._statuses_of(tenant)
            chosen = [r for r in chosen if statuses.get(r.id, SandboxStatus.DEAD.value) in wanted]
        async with anyio.create_task_group() as tg:
            for record in chosen:
                tg.start_soon(self._drop, record)
        return _json(w.DELETED, w.DeletedSandboxes(ids=[r.id for r in chosen]))

    async def get_sandbox(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        record.renew()
        try:
            info = await record.sandbox.info()
            status = info.status.value
        except SandboxDied:
            status = SandboxStatus.DEAD.value
        except (SandboxNotFound, SandboxClosed):
            await self._drop(record)
            raise _not_found(record.id) from None
        return _json(w.DESCRIPTION, record.describe(status))

    async def delete_sandbox(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        await self._drop(record)
        return Response(status_code=204)

    async def renew_lease(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        record.renew()
        return _json(w.LEASES, w.Leases(renewed=[record.id], lease_seconds=record.lease_seconds))

    async def renew_leases(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        renewal = await self.decode(request, w.RENEWAL)
        renewed, missing = [], []
        for sandbox_id in dict.fromkeys(renewal.ids):
            record = tenant.records.get(sandbox_id)
            if record is None or record.removing:
                missing.append(sandbox_id)
            else:
                record.renew()
                renewed.append(sandbox_id)
        return _json(
            w.LEASES,
            w.Leases(renewed=renewed, missing=missing, lease_seconds=self.config.lease_seconds),
        )

    # -- handlers: commands -------------------------------------------------------------

    async def exec(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        body = await self.decode(request, w.EXEC)
        result: ExecResult | None = None

        async def work() -> None:
            nonlocal result
            try:
                result = await record.sandbox.exec(
                    body.argv,
                    cwd=body.cwd,
                    env=body.env,
                    stdin=body.stdin,
                    timeout=body.timeout,
                    max_output_bytes=body.max_output_bytes,
                )
            except ExecTimeout as exc:
                result = exc.result

        async with self.use(tenant, record, exec_id=body.exec_id) as activity:
            with activity.scope:
                if await _until_disconnect(request.receive, work):
                    self.metrics.disconnect_kills += 1
                    log.info("remote.exec.disconnected", sandbox_id=record.id)
        if result is None:
            raise HttpError(409, "exec_cancelled", "the command was cancelled")
        return _json(w.EXEC_RESPONSE, _exec_response(result))

    async def exec_stream(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        body = await self.decode(request, w.EXEC)
        ping = self.config.ping_interval

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            started = False
            failure: HttpError | None = None

            async def emit(frame: w.ExecFrame) -> None:
                line = w.FRAME.encode(frame) + b"\n"
                await send({"type": "http.response.body", "body": line, "more_body": True})

            async def work() -> None:
                nonlocal started, failure
                try:
                    async with record.sandbox.exec_stream(
                        body.argv,
                        cwd=body.cwd,
                        env=body.env,
                        stdin=body.stdin,
                        timeout=body.timeout,
                        max_output_bytes=1,  # output goes out as frames; keep none here
                    ) as stream:
                        await _start(send, "application/x-ndjson")
                        started = True
                        while True:
                            with anyio.move_on_after(ping) as quiet:
                                try:
                                    chunk = await stream.__anext__()
                                except StopAsyncIteration:
                                    break
                            if quiet.cancelled_caught:
                                await emit(w.PingFrame())
                            else:
                                await emit(w.OutputFrame(stream=chunk.stream, data=chunk.data))
                        try:
                            result = await stream.wait()
                        except ExecTimeout as exc:
                            result = exc.result
                    await emit(
                        w.ExitFrame(
                            returncode=result.returncode,
                            signal=result.signal,
                            oom_killed=result.oom_killed,
                            timed_out=result.timed_out,
                            duration=result.duration,
                            stdout_size=result.stdout_size,
                            stderr_size=result.stderr_size,
                        )
                    )
                except SandboxError as exc:
                    failure = error_for(exc, record.id)
                    if started:
                        await emit(w.ErrorFrame(error=failure.body))

            try:
                async with self.use(tenant, record, exec_id=body.exec_id) as activity:
                    with activity.scope:
                        if await _until_disconnect(receive, work):
                            self.metrics.disconnect_kills += 1
                            log.info("remote.exec.disconnected", sandbox_id=record.id)
                            return
                    if activity.scope.cancelled_caught:
                        failure = HttpError(409, "exec_cancelled", "the command was cancelled")
                        if started:
                            await emit(w.ErrorFrame(error=failure.body))
            except HttpError as exc:
                failure = exc
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif failure is not None:
                await failure.response()(scope, receive, send)

        return _Streamed(run)

    async def cancel_exec(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        exec_id = request.path_params["exec_id"]
        activity = record.execs.get(exec_id)
        if activity is None:
            record.cancelled_execs.append(exec_id)  # refuse it if it arrives later
        else:
            activity.scope.cancel()
            # The runtime kills the process tree before the cancellation completes.
            with anyio.move_on_after(self.config.timeouts.cleanup):
                await activity.done.wait()
        return Response(status_code=204)

    # -- handlers: files ----------------------------------------------------------------

    def _query_int(self, request: Request, name: str, default: int, *, base: int = 10) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw, base)
        except ValueError:
            raise _bad_request(f"{name} must be an integer, got {raw[:50]!r}") from None
        return value

    def _query_path(self, request: Request) -> str:
        path = request.query_params.get("path")
        if not path:
            raise _bad_request("the 'path' query parameter is required")
        return path

    async def read_file(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        path = self._query_path(request)
        limit = self._query_int(request, "max_bytes", DEFAULT_READ_LIMIT)
        if limit < 1:
            raise _bad_request("max_bytes must be >= 1")
        limit = min(limit, self.config.max_file_bytes)
        async with self.use(tenant, record):
            data = await record.sandbox.read_file(path, max_bytes=limit)
        return Response(data, media_type="application/octet-stream")

    async def write_file(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        path = self._query_path(request)
        mode = self._query_int(request, "mode", 0o644, base=8)
        if not 0 <= mode <= 0o7777:
            raise _bad_request("mode must be permission bits in octal, such as 644")
        async with self.use(tenant, record):
            data = await self.body(request, self.config.max_file_bytes)
            await record.sandbox.write_file(path, data, mode=mode)
        return Response(status_code=204)

    async def upload_archive(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        path = self._query_path(request)
        body = _Body(request, self.config.max_upload_bytes)
        async with self.use(tenant, record):
            try:
                await record.sandbox.put_archive(path, body)
            except Exception:
                body.raise_stopped()
                raise
        return Response(status_code=204)

    async def download_archive(self, request: Request) -> Response:
        tenant = self.authenticate(request)
        record = self.record(tenant, request.path_params["sandbox_id"])
        path = self._query_path(request)

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            started = False
            failure: HttpError | None = None

            async def work() -> None:
                nonlocal started, failure

                async def emit(chunk: bytes) -> None:
                    nonlocal started
                    if not started:
                        await _start(send, "application/x-tar")
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
                    await stack.enter_async_context(self.use(tenant, record))
                    if await _until_disconnect(receive, work):
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

        return _Streamed(run)

    # -- application --------------------------------------------------------------------

    def endpoint(
        self, name: str, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                response = await handler(request)
            except HttpError as exc:
                response = exc.response()
            except SandboxError as exc:
                response = error_for(exc, request.path_params.get("sandbox_id")).response()
            except ClientDisconnect:
                response = Response(status_code=499)
            except Exception as exc:  # noqa: BLE001 - a bug: logged, answered 500
                log.error("remote.request.failed", operation=name, error=repr(exc))
                response = HttpError(500, "internal_error", "internal server error").response()
            self.metrics.observe(
                name, request.method, response.status_code, time.perf_counter() - started
            )
            return response

        return endpoint

    def routes(self) -> list[Route]:
        routes = [Route("/openapi.json", self.openapi_json, methods=["GET"])]
        for op in OPERATIONS:
            handler = getattr(self, "metrics_text" if op.name == "metrics" else op.name)
            routes.append(Route(op.path, self.endpoint(op.name, handler), methods=[op.method]))
        return routes


async def _no_route(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return HttpError(405, "method_not_allowed", "method not allowed on this path").response()
    return HttpError(404, "not_found", f"no such path: {request.url.path[:200]}").response()


def create_app(
    config: ServerConfig,
    tenants: Iterable[Tenant],
    *,
    backend: Backend | None = None,
    version: str = "",
) -> Starlette:
    """The ASGI application of the server (serve it with uvicorn, on asyncio).

    :param backend: a backend instance to serve instead of ``config.backend`` by name.
    """
    server = RemoteServer(config, tenants, backend, version=version)
    app = Starlette(
        routes=server.routes(),
        lifespan=server.lifespan,
        exception_handlers={404: _no_route, 405: _no_route},
    )
    app.state.server = server
    return app
