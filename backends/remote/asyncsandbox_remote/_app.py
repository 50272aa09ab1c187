"""The server: an ASGI application (Starlette) over one :class:`asyncsandbox.Session`.

**One Session, per-tenant bookkeeping.** The Session's limits protect the *backend* (a
Docker daemon wedges under bursts of lifecycle calls whoever sends them), so they must be
global; a Session per tenant would multiply them by the number of tenants. What belongs
to tenants (keys, records, leases, quotas) is in :mod:`._tenancy`.

This module runs the application: it opens the Session over the served backend and the
lease reaper for the server's lifetime (:meth:`RemoteServer.lifespan`), routes each
operation to its handler (:mod:`._handlers`), and turns what a handler raises into the
answer (:mod:`._errors`), counting every answer in the metrics. Calls go one way::

    _app ─> _handlers, _fusion, _e2b ─> _tenancy, _streaming ─> _errors

SandboxFusion's ``POST /run_code`` (:mod:`._fusion`) and E2B's API (:mod:`._e2b`: its
control plane among the routes, each sandbox's envd in front of them, on the same port,
routed by the ``E2b-Sandbox-Id`` header) are served beside the API, on the same Session,
tenants and quotas. E2B's API needs the ``e2b`` extra; without it, its requests answer
501 saying so.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

import anyio
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from asyncsandbox import Session, create_backend
from asyncsandbox.abc import Backend
from asyncsandbox.log import get_logger

from ._config import ServerConfig, Tenant
from ._errors import HttpError, error_response, no_route
from ._fusion import UNSUPPORTED_ROUTES, FusionHandlers
from ._handlers import Handlers
from ._metrics import Metrics
from ._openapi import OPERATIONS
from ._served import ServedBackend
from ._tenancy import Tenancy

if TYPE_CHECKING:
    from ._e2b import ControlPlane

__all__ = ("RemoteServer", "ServerApp", "create_app")

log = get_logger("asyncsandbox.remote")


class RemoteServer:
    """The server's state for one application: its Session (while it runs), tenancy and
    metrics."""

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
        self.metrics = Metrics()
        self.tenancy = Tenancy(config, tenants, self.metrics)
        self._backend_given = backend
        self.served: ServedBackend | None = None
        """The served backend, once the server started."""
        self.running: Session | None = None
        """The Session, while the server runs."""
        self.closing = False
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        """The server's task group, for work that outlives its request (E2B's background
        commands and directory watchers); 503 when the server does not run."""
        if self._task_group is None:
            raise HttpError(503, "shutting_down", "the server is not running", retryable=True)
        return self._task_group

    @property
    def session(self) -> Session:
        """The Session; 503 when the server does not run."""
        if self.running is None:
            raise HttpError(503, "shutting_down", "the server is not running", retryable=True)
        return self.running

    def _make_backend(self) -> Backend:
        if self._backend_given is not None:
            return self._backend_given
        return create_backend(self.config.backend, dict(self.config.backend_options))

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Open the Session and the lease reaper; on exit remove (or keep) the sandboxes."""
        served = self.served = ServedBackend(self._make_backend())
        session = Session(
            served,
            limits=self.config.limits,
            timeouts=self.config.timeouts,
            sweep=self.config.sweep,
        )
        async with session:
            self.running = session
            caps = served.capabilities
            log.info(
                "remote.server.started",
                backend=served.inner.name,
                isolation=caps.isolation,
                tenants=sorted(self.tenancy.tenants),
            )
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.tenancy.reap_forever)
                    self._task_group = tg
                    try:
                        yield
                    finally:
                        self.closing = True
                        self._task_group = None
                        tg.cancel_scope.cancel()
            finally:
                self.closing = True
                live = len(self.tenancy.records)
                if self.config.on_shutdown == "keep":
                    served.keep = True
                log.info(
                    "remote.server.stopping",
                    sandboxes=live,
                    policy=self.config.on_shutdown,
                )
        self.tenancy.clear()

    def routes(
        self, handlers: Handlers, fusion: FusionHandlers, e2b: ControlPlane | None
    ) -> list[Route]:
        """One route per operation of the API, answered by the handler of its name; and
        SandboxFusion's and E2B's control plane routes (:mod:`._fusion`, :mod:`._e2b`:
        not part of this API's document)."""
        routes = [Route("/openapi.json", handlers.openapi_json, methods=["GET"])]
        for op in OPERATIONS:
            handler = getattr(handlers, "metrics_text" if op.name == "metrics" else op.name)
            routes.append(Route(op.path, self._endpoint(op.name, handler), methods=[op.method]))
        routes.append(
            Route("/run_code", self._endpoint("fusion_run_code", fusion.run_code), methods=["POST"])
        )
        routes.append(
            Route(
                "/run_jupyter",
                self._endpoint("fusion_run_jupyter", fusion.run_jupyter),
                methods=["POST"],
            )
        )
        unsupported = self._endpoint("fusion_unsupported", fusion.unsupported)
        routes.extend(Route(path, unsupported, methods=["POST"]) for path in UNSUPPORTED_ROUTES)
        if e2b is not None:
            routes.extend(e2b.routes(self._endpoint))
        return routes

    def _endpoint(
        self, name: str, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                response = await handler(request)
            except Exception as exc:  # noqa: BLE001 - every failure gets its answer
                response = error_response(
                    exc, operation=name, sandbox_id=request.path_params.get("sandbox_id")
                )
            self.metrics.observe(
                name, request.method, response.status_code, time.perf_counter() - started
            )
            return response

        return endpoint


class ServerApp(Protocol):
    """The server's ASGI application; ``state.server`` is its :class:`RemoteServer`."""

    state: State

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


def create_app(
    config: ServerConfig,
    tenants: Iterable[Tenant],
    *,
    backend: Backend | None = None,
    version: str = "",
) -> ServerApp:
    """The ASGI application of the server (serve it with uvicorn, on asyncio).

    :param backend: a backend instance to serve instead of ``config.backend`` by name.
    """
    server = RemoteServer(config, tenants, backend, version=version)
    try:
        from ._e2b import ControlPlane, E2bRouter
    except ImportError as exc:  # the e2b extra is not installed
        missing = str(exc)
        control = None
    else:
        control = ControlPlane(server)
    app = Starlette(
        routes=server.routes(Handlers(server), FusionHandlers(server), control),
        lifespan=server.lifespan,
        exception_handlers={404: no_route, 405: no_route},
    )
    app.state.server = server
    if control is not None:
        return E2bRouter(app, server, control)
    return _WithoutE2b(app, missing)


class _WithoutE2b:
    """In front of the application when the ``e2b`` extra is missing: E2B's sandbox
    requests (``E2b-Sandbox-Id``) answer 501 saying what to install."""

    def __init__(self, app: Starlette, missing: str) -> None:
        self.app = app
        self.state = app.state
        self._missing = missing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and any(k == b"e2b-sandbox-id" for k, _ in scope["headers"]):
            response = HttpError(
                501,
                "not_supported",
                f"E2B's API needs asyncsandbox-remote[e2b] on the server ({self._missing[:200]})",
            ).response()
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
