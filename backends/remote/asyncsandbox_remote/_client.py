"""The client half: a :class:`~asyncsandbox.abc.Backend` whose sandboxes live on a
server (``asyncsandbox serve``), reached over HTTP with httpx.

httpx runs on anyio, so this backend works on asyncio and trio. All policy stays where
it belongs: the client's Session applies its limits, deadlines and retries as for any
backend, and the server applies its own over its backend. The client speaks the protocol
in four modules: this one (the backend: connection, leases, create, attach, list, judge),
``_sandbox`` (one sandbox's calls), ``_frames`` (the readers of streamed answers) and
``_transport`` (the HTTP client, and the one place where HTTP and transport failures
become asyncsandbox errors; who retries what is said there).
"""

from __future__ import annotations

import builtins
import os
import ssl
import uuid
from collections.abc import Mapping
from typing import Any, Self

import anyio
import msgspec

from asyncsandbox import (
    BackendUnavailable,
    InfrastructureError,
    InvalidArgument,
    RequestNotSent,
    SandboxError,
    SandboxInfo,
)
from asyncsandbox.abc import (
    Backend,
    BackendCapabilities,
    SandboxHandle,
    SandboxSpec,
    ServiceConnection,
)
from asyncsandbox.judge import Checker, JudgeRequest, JudgeResult
from asyncsandbox.log import get_logger

from . import _wire as w
from ._sandbox import BACKEND_NAME, RemoteAttributes, RemoteSandbox, info
from ._transport import (
    API_KEY_ENV,
    JSON_HEADERS,
    Api,
    decode,
    sandbox_path,
    snapshot_path,
)

__all__ = ("RemoteAttributes", "RemoteBackend")

BASE_URL_ENV = "ASYNCSANDBOX_BASE_URL"

log = get_logger("asyncsandbox.remote")


class RemoteBackend(Backend):
    """Sandboxes on a server (``asyncsandbox serve``), over HTTP: ``Session("remote")``.

    :param base_url: the server, such as ``https://sandboxes.example:8765`` (default:
        ``$ASYNCSANDBOX_BASE_URL``).
    :param api_key: the tenant's API key, sent as a bearer token (default:
        ``$ASYNCSANDBOX_API_KEY``). Never logged nor shown in ``repr``.
    :param timeout: removed, like ``connect_timeout``: the deadlines are the Session's
        :class:`~asyncsandbox.Timeouts` (see below).
    :param lease_seconds: lease asked for each sandbox (default: the server's). The
        backend renews the leases of its sandboxes in the background; when this process
        vanishes, the server removes them once the lease expires.
    :param verify: TLS verification: True, False, a CA bundle path or an ``SSLContext``.
    :param max_connections: size of the connection pool (each running command holds one).

    Each request is sent once; the Session's :class:`~asyncsandbox.RetryPolicy` retries
    (see the module docstring of ``_transport``): every call whose connection could not be
    established (:class:`~asyncsandbox.RequestNotSent`: nothing was sent), and the
    lifecycle calls on ``retryable`` errors. A create carries an idempotency key: when its
    answer is lost, it is undone before it is retried.

    Deadlines are the Session's :class:`~asyncsandbox.Timeouts`: connecting, and each read
    or write of a request, may take ``operation``, or ``create`` and ``remove`` for those
    calls; a command's or code's answer may be silent for the server's ping interval and
    ``operation`` more (the server pings it while it is quiet, so long commands are
    fine); shielded cleanups take at most ``cleanup``.

    Works on asyncio and trio. Errors are asyncsandbox errors: a refused key is
    :class:`~asyncsandbox.BackendUnavailable` (not retryable) saying so, quotas answer
    ``BackendUnavailable`` (retryable), a sandbox the server no longer has is
    :class:`~asyncsandbox.SandboxDied` inside it and
    :class:`~asyncsandbox.SandboxNotFound` from :meth:`attach`.
    """

    name = BACKEND_NAME

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        connect_timeout: float | None = None,
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
            if value is not None:
                raise InvalidArgument(
                    f"RemoteBackend({name}=...) is gone: each request is bounded by the "
                    "Session's Timeouts (operation; create and remove for those calls): "
                    f"Session(..., timeouts=Timeouts(operation={value!r}))"
                )
        if lease_seconds is not None and not 0 < lease_seconds < float("inf"):
            raise InvalidArgument("lease_seconds must be a positive number of seconds or None")
        self.base_url = url.rstrip("/")
        self._key = key.strip()
        self._options: dict[str, Any] = {
            "max_connections": max_connections,
            "verify": verify,
        }
        self._lease_seconds = lease_seconds
        self._connection: ServiceConnection[Api] = ServiceConnection("a RemoteBackend")
        self._info: w.ServerInfo | None = None
        self._caps: BackendCapabilities | None = None
        self._leased: set[str] = set()

    def __repr__(self) -> str:
        state = self._connection.state
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
    def api(self) -> Api:
        api = self._connection.client
        if api is None:
            raise BackendUnavailable(
                "the remote backend is not open (use it through a Session)", retryable=False
            )
        return api

    async def __aenter__(self) -> Self:
        def connect() -> Api:
            return Api(self.base_url, self._key, timeouts=self.timeouts, **self._options)

        await self._connection.open(connect, self._ask_info, self._keep_leases)
        return self

    async def _ask_info(self, api: Api) -> None:
        """The server's terms and capabilities (``GET /v1/info``), asked once on opening."""
        response = await api.call("GET", "/v1/info", what="info")
        try:
            info = w.INFO.decode(response.content)
        except msgspec.DecodeError as exc:
            raise BackendUnavailable(
                f"{self.base_url} does not answer like an asyncsandbox server: {exc}",
                retryable=False,
            ) from None
        self._info = info
        api.ping_interval = info.ping_interval
        caps = info.capabilities
        self._caps = BackendCapabilities(
            isolation=f"remote: {caps.isolation} ({info.backend} at {self.base_url})",
            enforced_limits=frozenset(caps.enforced_limits),
            best_effort_limits=caps.best_effort_limits,
            limits_note=caps.limits_note,
            network_modes=frozenset(caps.network_modes),
            reports_signal=caps.reports_signal,
            snapshots=caps.snapshots,
            reset=caps.reset,
        )

    async def aclose(self) -> None:
        await self._connection.aclose()

    async def _keep_leases(self) -> None:
        assert self._info is not None  # asked before this task started
        lease = self._lease_seconds or self._info.lease_seconds
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
            snapshot_path(snapshot_id),
            what="delete snapshot",
        )

    def _handle(self, description: w.SandboxDescription) -> RemoteSandbox:
        self._leased.add(description.id)
        return RemoteSandbox(self.api, description, forget=self._leased.discard)

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
        # time (a checker's run counts as another case), the builds, and the short-call
        # deadline for the rest.
        per_case = 5 if isinstance(request.comparison, Checker) else 1
        cases = sum(case.time_limit or request.time_limit for case in request.cases)
        operation = self.timeouts.operation
        budget = 2 * request.compile_timeout + per_case * cases
        response = await self.api.call(
            "POST",
            "/v1/judge",
            what="judge",
            content=w.JUDGE.encode(request),
            headers=JSON_HEADERS,
            timeout=self.api.within(None if operation is None else budget + operation),
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
                content=w.CREATE.encode(body),
                headers={**JSON_HEADERS, "idempotency-key": key},
                timeout=api.within(self.timeouts.create),
            )
        except RequestNotSent:
            raise  # the server never saw this create: nothing to undo (retryable)
        except BackendUnavailable as exc:
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
                await self.api.call("DELETE", f"/v1/creates/{key}", what="abandon create")
            except SandboxError as exc:
                log.warning("remote.create.abandon_failed", error=str(exc))
            else:
                return True
        return False

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        response = await self.api.call(
            "GET", sandbox_path(sandbox_id), what="attach", sandbox_id=sandbox_id
        )
        return self._handle(decode(w.DESCRIPTION, response))

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        params = [("label", f"{key}={value}") for key, value in labels.items()]
        response = await self.api.call("GET", "/v1/sandboxes", what="list", params=params)
        return [info(item) for item in decode(w.LIST, response).items]
