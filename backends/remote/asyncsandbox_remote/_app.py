"""The server: an ASGI application (Starlette) over one :class:`asyncsandbox.Session`.

**One Session, per-tenant bookkeeping.** The Session's limits protect the *backend* (a
Docker daemon wedges under bursts of lifecycle calls whoever sends them), so they must be
global; a Session per tenant would multiply them by the number of tenants. What belongs
to tenants (keys, records, leases, quotas) is in :mod:`._tenancy`.

This module makes the application: it creates the server's state (:mod:`._serverstate`,
whose lifespan opens the Session over the served backend and the lease reaper for the
server's lifetime), routes each operation to its handler (by route family:
:mod:`._handlers`, :mod:`._exec_handlers`, :mod:`._file_handlers`), and turns what a
handler raises into the answer (:mod:`._errors`), counting every answer in the metrics.
Calls go one way::

    _app ─> _handlers, _exec_handlers, _file_handlers, _fusion, _e2b
         ─> _serverstate, _tenancy, _streaming ─> _errors

SandboxFusion's ``POST /run_code`` and ``POST /run_jupyter`` (:mod:`._fusion`, in the
API's document) and E2B's API (:mod:`._e2b`: its
control plane among the routes, each sandbox's envd in front of them, on the same port,
routed by the ``E2b-Sandbox-Id`` header) are served beside the API, on the same Session,
tenants and quotas. E2B's API needs the ``e2b`` extra; without it, its requests answer
501 saying so.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, cast

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from asyncsandbox.abc import Backend

from ._config import ServerConfig, Tenant
from ._errors import HttpError, error_response, no_route
from ._exec_handlers import ExecHandlers
from ._file_handlers import FileHandlers
from ._fusion import UNSUPPORTED_ROUTES, FusionHandlers
from ._handlers import Handlers
from ._metrics import Metrics
from ._openapi import OPERATIONS
from ._serverstate import ServerState

if TYPE_CHECKING:
    from ._e2b import ControlPlane

__all__ = ("ServerApp", "create_app")


def _routes(
    state: ServerState,
    families: Sequence[object],
    fusion: FusionHandlers,
    e2b: ControlPlane | None,
) -> list[Route]:
    """One route per operation of the API (SandboxFusion's ``/run_code`` and
    ``/run_jupyter`` included), answered by the handler of its name in one of the handler
    ``families``; and SandboxFusion's unsupported routes and E2B's control plane routes
    (:mod:`._fusion`, :mod:`._e2b`: not part of this API's document)."""

    def endpoint(
        name: str, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        return _endpoint(state.metrics, name, handler)

    def handler(name: str) -> Callable[[Request], Awaitable[Response]]:
        found = [getattr(f, name) for f in families if hasattr(f, name)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} handlers of the operation {name!r}")
        return cast("Callable[[Request], Awaitable[Response]]", found[0])

    routes = [Route("/openapi.json", handler("openapi_json"), methods=["GET"])]
    for op in OPERATIONS:
        name = "metrics_text" if op.name == "metrics" else op.name
        routes.append(Route(op.path, endpoint(op.name, handler(name)), methods=[op.method]))
    unsupported = endpoint("fusion_unsupported", fusion.unsupported)
    routes.extend(Route(path, unsupported, methods=["POST"]) for path in UNSUPPORTED_ROUTES)
    if e2b is not None:
        routes.extend(e2b.routes(endpoint))
    return routes


def _endpoint(
    metrics: Metrics, name: str, handler: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` answering what it raises (:func:`._errors.error_response`), every
    answer counted in ``metrics`` under ``name``."""

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except Exception as exc:  # noqa: BLE001 - every failure gets its answer
            response = error_response(
                exc, operation=name, sandbox_id=request.path_params.get("sandbox_id")
            )
        metrics.observe(name, request.method, response.status_code, time.perf_counter() - started)
        return response

    return endpoint


class ServerApp(Protocol):
    """The server's ASGI application; ``state.server`` is its
    :class:`~._serverstate.ServerState`."""

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
    server = ServerState(config, tenants, backend, version=version)
    fusion = FusionHandlers(server)
    try:
        from ._e2b import ControlPlane, E2bRouter
    except ImportError as exc:  # the e2b extra is not installed
        missing = str(exc)
        control = None
    else:
        control = ControlPlane(server)
    app = Starlette(
        routes=_routes(
            server,
            (Handlers(server), ExecHandlers(server), FileHandlers(server), fusion),
            fusion,
            control,
        ),
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
