"""The e2b backend: asyncsandbox's API over any E2B-compatible API (E2B's cloud, its
self-hosted infrastructure, or ``asyncsandbox serve``), on httpx (asyncio and trio).

Why httpx and not E2B's SDK: the SDK's async client runs its envd calls on connectrpc's
asyncio-only client (no trio), which turns a cancellation into an error; its sync client
would hold a thread per running command (thousands of commands, thousands of threads) and
could only be cancelled by a kill from another thread. E2B's API is small and documented
(REST for the control plane, Connect with the JSON codec for envd), so the backend speaks
it itself: every call is a cancellable anyio operation, and E2B's errors are translated
where they arrive (``_errors.py``).

Lifetimes: an E2B sandbox ends at its ``timeout``, which the backend uses as a lease: it
creates sandboxes with ``lease_seconds`` and moves their timeout forward while they are
in use, up to their ``max_lifetime``; the sandboxes of an owner that vanished end within
a lease.
"""

from __future__ import annotations

import builtins
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote, urlencode

import anyio
import msgspec

from asyncsandbox import (
    BackendUnavailable,
    InvalidArgument,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
)
from asyncsandbox.abc import (
    Backend,
    BackendCapabilities,
    SandboxHandle,
    SandboxSpec,
    ServiceConnection,
)
from asyncsandbox.log import get_logger

from ._sandbox import E2bSandbox, sandbox_info
from ._transport import ControlPlane, Envd, Http, decode
from ._wire import ListedSandbox, NewSandbox, SandboxAnswer, SandboxDetail, SnapshotInfo

__all__ = ("E2bBackend",)

log = get_logger("asyncsandbox.e2b")

API_KEY_ENV = "E2B_API_KEY"
API_URL_ENV = "E2B_API_URL"
SANDBOX_URL_ENV = "E2B_SANDBOX_URL"
DOMAIN_ENV = "E2B_DOMAIN"
LIMITS_ENV = "ASYNCSANDBOX_E2B_LIMITS"
LIMITS = ("enforce", "best-effort")
LIMITS_NOTE = (
    "an E2B sandbox's CPUs and memory are its template's (set when the template is built) "
    "and E2B sets no per-sandbox process or disk limit; ask for none (Resources(cpus=None, "
    "memory_mb=None, pids=None, disk_mb=None)), or run with the template's: "
    f"backend_options={{'limits': 'best-effort'}} (or ${LIMITS_ENV}=best-effort)"
)
DEFAULT_DOMAIN = "e2b.app"
ROUTED_DOMAINS = frozenset(
    {"e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev", "e2b-juliett.dev"}
)
"""Domains whose sandboxes are reached at ``https://sandbox.<domain>`` and routed by the
``E2b-Sandbox-*`` headers (E2B's SDK: ``e2b/sandbox_domains.py``); elsewhere each
sandbox has its own host, ``<port>-<id>.<domain>``."""
WORKDIR_HEADER = "x-asyncsandbox-workdir"
"""Sent with a create: the sandbox's working directory. ``asyncsandbox serve`` makes it
the sandbox's (its sandboxes have no root to create one); other E2B servers ignore it,
and the backend creates the directory itself (as the user, else as ``root``)."""
PAGE = 100
REFRESHES_AT_ONCE = 16


@dataclass
class _Lease:
    ends: float | None
    """``anyio.current_time()`` at which the sandbox's ``max_lifetime`` is over."""


class E2bBackend(Backend):
    """Sandboxes of an E2B-compatible API: ``Session("e2b")``.

    :param api_key: the API key, sent as ``X-API-KEY`` (default: ``$E2B_API_KEY``). Never
        logged nor shown in ``repr``.
    :param api_url: the control plane (default: ``$E2B_API_URL``, else
        ``https://api.<domain>``).
    :param sandbox_url: where every sandbox's envd is reached (default:
        ``$E2B_SANDBOX_URL``, else derived from the domain as E2B's SDK derives it). For
        ``asyncsandbox serve``, the server's URL, like ``api_url``.
    :param domain: E2B's domain (default: ``$E2B_DOMAIN``, else ``e2b.app``).
    :param template: the template of sandboxes that name no image (an image is a
        template's name or id: ``session.sandbox(image="code-interpreter-v1")``).
    :param user: the sandbox user commands and files run as (E2B's images: ``user``).
    :param limits: ``"enforce"`` (default): a sandbox asking for a
        :class:`~asyncsandbox.Resources` limit is refused, as E2B cannot set one per
        sandbox (a template fixes them); ``"best-effort"``: such sandboxes run with their
        template's (the Session warns once). Default: ``$ASYNCSANDBOX_E2B_LIMITS``, else
        ``"enforce"``.
    :param lease_seconds: the timeout each sandbox is given and kept at while in use
        (see the module docstring).
    :param timeout: removed, like ``connect_timeout``: the deadlines are the Session's
        :class:`~asyncsandbox.Timeouts`: connecting and each read or write of a request
        take at most ``operation`` (a create ``create``, a removal ``remove``); a
        command's stream may be silent for envd's keepalive interval (30 s) and
        ``operation`` more.
    :param max_connections: size of the connection pool (each running command holds one).
    :param verify: TLS verification: True, False, a CA bundle path or an ``SSLContext``.

    Works on asyncio and trio. Commands need ``python3`` in the template: each runs under
    a small shepherd that kills its process tree (see the package's README).
    """

    name = "e2b"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        domain: str | None = None,
        template: str = "base",
        user: str = "user",
        limits: str | None = None,
        lease_seconds: float = 120.0,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        max_connections: int = 512,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        key: object = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        if not isinstance(key, str) or not key.strip():
            raise InvalidArgument(
                f"the e2b backend needs an API key: E2bBackend(api_key=...) or ${API_KEY_ENV}"
            )
        self.domain = domain or os.environ.get(DOMAIN_ENV) or DEFAULT_DOMAIN
        url: object = api_url or os.environ.get(API_URL_ENV) or f"https://api.{self.domain}"
        sandboxes: object = sandbox_url or os.environ.get(SANDBOX_URL_ENV) or None
        for label, value in (("api_url", url), ("sandbox_url", sandboxes)):
            if value is not None and (
                not isinstance(value, str) or not value.startswith(("http://", "https://"))
            ):
                raise InvalidArgument(f"{label} must be an http(s) URL, got {value!r}")
        for label, gone in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if gone is not None:
                raise InvalidArgument(
                    f"E2bBackend({label}=...) is gone: each request is bounded by the "
                    "Session's Timeouts (operation; create and remove for those calls): "
                    f"Session(..., timeouts=Timeouts(operation={gone!r}))"
                )
        if not 0 < lease_seconds < math.inf:
            raise InvalidArgument("lease_seconds must be a positive number of seconds")
        if not template or not user:
            raise InvalidArgument("template and user must be non-empty")
        chosen = limits if limits is not None else os.environ.get(LIMITS_ENV) or "enforce"
        if chosen not in LIMITS:
            where = "limits" if limits is not None else f"${LIMITS_ENV}"
            raise InvalidArgument(f"{where} must be one of {', '.join(LIMITS)}; got {chosen!r}")
        self.best_effort_limits = chosen == "best-effort"
        assert isinstance(url, str)
        self.api_url = url.rstrip("/")
        self.sandbox_url = sandboxes.rstrip("/") if isinstance(sandboxes, str) else None
        self.template = template
        self.user = user
        self.lease_seconds = float(lease_seconds)
        self._key = key.strip()
        self._options: dict[str, Any] = {
            "max_connections": max_connections,
            "verify": verify,
        }
        self._connection: ServiceConnection[Http] = ServiceConnection("an E2bBackend")
        self._control: ControlPlane | None = None
        self._leases: dict[str, _Lease] = {}

    def __repr__(self) -> str:
        state = self._connection.state
        return f"<E2bBackend {self.api_url} {state} leased={len(self._leases)}>"

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            isolation=f"E2B sandboxes of the E2B-compatible API at {self.api_url}",
            best_effort_limits=self.best_effort_limits,
            limits_note=LIMITS_NOTE,
            network_modes=frozenset({"none", "host"}),
            snapshots=True,
        )

    @property
    def control(self) -> ControlPlane:
        if self._control is None or self._connection.client is None:
            raise BackendUnavailable(
                "the e2b backend is not open (use it through a Session)", retryable=False
            )
        return self._control

    # -- opening and closing ----------------------------------------------------------

    async def __aenter__(self) -> Self:
        def connect() -> Http:
            return Http(timeouts=self.timeouts, **self._options)

        await self._connection.open(connect, self._check, self._keep_leases)
        return self

    async def _check(self, http: Http) -> None:
        """The key and the API, checked once: a wrong one fails here, clearly."""
        self._control = ControlPlane(http, self.api_url, self._key)
        await self._control.call("GET", "/v2/sandboxes", what="list sandboxes", params={"limit": 1})

    async def aclose(self) -> None:
        await self._connection.aclose()

    # -- leases -----------------------------------------------------------------------

    def _timeout(self, lease: _Lease) -> int | None:
        """The timeout to give a sandbox now: a lease, or what is left of its lifetime
        (None: its lifetime is over, let it end)."""
        seconds = self.lease_seconds
        if lease.ends is not None:
            seconds = min(seconds, lease.ends - anyio.current_time())
            if seconds <= 0:
                return None
        return max(1, math.ceil(seconds))

    async def _keep_leases(self) -> None:
        period = max(0.5, self.lease_seconds / 3)
        limiter = anyio.CapacityLimiter(REFRESHES_AT_ONCE)
        while True:
            await anyio.sleep(period)
            async with anyio.create_task_group() as tg:
                for sandbox_id, lease in list(self._leases.items()):
                    tg.start_soon(self._refresh, sandbox_id, lease, limiter)

    async def _refresh(
        self, sandbox_id: str, lease: _Lease, limiter: anyio.CapacityLimiter
    ) -> None:
        seconds = self._timeout(lease)
        if seconds is None:
            self._leases.pop(sandbox_id, None)
            return
        async with limiter:
            try:
                await self.control.call(
                    "POST",
                    f"/sandboxes/{quote(sandbox_id, safe='')}/timeout",
                    what="extend the sandbox's timeout",
                    sandbox_id=sandbox_id,
                    body=msgspec.json.encode({"timeout": seconds}),
                )
            except SandboxNotFound:
                self._leases.pop(sandbox_id, None)
            except SandboxError as exc:
                log.warning("e2b.lease.refresh_failed", sandbox=sandbox_id, error=str(exc))

    # -- sandboxes --------------------------------------------------------------------

    def envd(self, sandbox_id: str, token: str | None, domain: str | None) -> Envd:
        """The envd of a sandbox (see ``sandbox_url``)."""
        http = self._connection.client
        assert http is not None
        url = self.sandbox_url
        if url is None:
            where = domain or self.domain
            url = (
                f"https://sandbox.{where}"
                if where in ROUTED_DOMAINS
                else f"https://49983-{sandbox_id}.{where}"
            )
        return Envd(http, url, sandbox_id, token, self.user)

    def _handle(
        self,
        answer: SandboxAnswer | SandboxDetail,
        template: str,
        labels: Mapping[str, str],
        created_at: float | None,
    ) -> E2bSandbox:
        envd = self.envd(answer.sandbox_id, answer.envd_access_token, answer.domain)
        return E2bSandbox(
            self, envd, template=template, user=self.user, labels=labels, created_at=created_at
        )

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        template = spec.snapshot or spec.image or self.template
        lease = _Lease(
            ends=None if spec.max_lifetime is None else anyio.current_time() + spec.max_lifetime
        )
        timeout = self._timeout(lease) or 1
        body = NewSandbox(
            template_id=template,
            timeout=timeout,
            metadata=dict(spec.labels),
            env_vars=dict(spec.env),
            allow_internet_access=spec.network == "host",
        )
        control = self.control
        # Sent shielded (bounded by the create deadline): a create cancelled in flight
        # would leave a sandbox nobody knows the id of, until its timeout. Its answer is
        # waited for, and what it made removed, before the cancellation goes on.
        answer: SandboxAnswer | None = None
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeouts.create or math.inf):
            response = await control.call(
                "POST",
                "/v2/sandboxes",
                what="create a sandbox",
                body=msgspec.json.encode(body),
                headers={WORKDIR_HEADER: spec.workdir},
                ok=(201,),
                timeout=control.http.within(self.timeouts.create),
            )
            answer = decode(response.content, SandboxAnswer, "create")
        if answer is None:
            raise BackendUnavailable(
                f"the E2B API at {self.api_url} did not answer a create in time; a sandbox it "
                f"made ends at its timeout ({timeout} s)",
                retryable=False,
            )
        handle = self._handle(answer, template, spec.labels, None)
        self._leases[handle.id] = lease
        try:
            await anyio.lowlevel.checkpoint()  # cancelled meanwhile: remove it, below
            await handle.prepare(spec.workdir)
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeouts.cleanup):
                try:
                    await self.kill(handle.id)
                except SandboxError as exc:
                    log.warning("e2b.create.cleanup_failed", sandbox=handle.id, error=str(exc))
            raise
        return handle

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        detail = await self.detail(sandbox_id)
        return self._handle(
            detail, detail.template_id, detail.metadata or {}, sandbox_info(detail).created_at
        )

    async def detail(self, sandbox_id: str) -> SandboxDetail:
        """The control plane's description of a sandbox (SandboxNotFound if it has none).

        Cancellation: nothing to undo (a read).
        """
        response = await self.control.call(
            "GET",
            f"/sandboxes/{quote(sandbox_id, safe='')}",
            what="describe a sandbox",
            sandbox_id=sandbox_id,
        )
        detail: SandboxDetail = decode(response.content, SandboxDetail, "describe")
        return detail

    async def kill(self, sandbox_id: str) -> None:
        """Remove a sandbox (idempotent).

        Cancellation: the sandbox may or may not be gone; its lease is no longer kept, so
        it ends at its timeout at the latest.
        """
        self._leases.pop(sandbox_id, None)
        await self.control.call(
            "DELETE",
            f"/sandboxes/{quote(sandbox_id, safe='')}",
            what="remove a sandbox",
            ok=(200, 204, 404),
            timeout=self.control.http.within(self.timeouts.remove),
        )

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        params: dict[str, Any] = {"state": "running,paused", "limit": PAGE}
        if labels:
            params["metadata"] = urlencode(dict(labels))
        found: builtins.list[SandboxInfo] = []
        while True:
            response = await self.control.call(
                "GET", "/v2/sandboxes", what="list sandboxes", params=params
            )
            page = decode(response.content, builtins.list[ListedSandbox], "list")
            found.extend(
                sandbox_info(item)
                for item in page
                if all((item.metadata or {}).get(k) == v for k, v in labels.items())
            )
            token = response.headers.get("x-next-token")
            if not token or not page:
                return found
            params["nextToken"] = token

    # -- snapshots --------------------------------------------------------------------

    async def snapshot_of(self, sandbox_id: str) -> str:
        """A filesystem-only snapshot of a sandbox (E2B: a template to create sandboxes
        from); its id.

        Cancellation: a snapshot taken meanwhile stays the API's (E2B gives no way to find
        it again but listing the snapshots).
        """
        response = await self.control.call(
            "POST",
            f"/sandboxes/{quote(sandbox_id, safe='')}/snapshots",
            what="snapshot a sandbox",
            sandbox_id=sandbox_id,
            body=msgspec.json.encode({"memory": False}),
            ok=(200, 201),
        )
        info: SnapshotInfo = decode(response.content, SnapshotInfo, "snapshot")
        return info.snapshot_id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.control.call(
            "DELETE",
            f"/templates/{quote(snapshot_id, safe='')}",
            what="delete a snapshot",
            ok=(200, 204, 404),
        )
