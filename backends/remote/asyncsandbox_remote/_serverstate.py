"""The state a server's handlers share (:class:`ServerState`): created by the application
(:mod:`._app`), held open by its lifespan, and read by every family of routes (the API's
handlers, SandboxFusion's, E2B's), which never see the application itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from asyncsandbox import SandboxError, Session, create_backend
from asyncsandbox.abc import Backend
from asyncsandbox.log import get_logger

from ._config import ServerConfig, Tenant
from ._errors import HttpError
from ._metrics import Metrics
from ._served import ServedBackend
from ._tenancy import Tenancy

__all__ = ("ServerState",)

log = get_logger("asyncsandbox.remote")


class ServerState:
    """The state of one server application: its configuration, its Session (while it
    runs), its tenancy and metrics, and the task group for work that outlives a request.
    The application (:func:`~._app.create_app`) creates it, runs its :meth:`lifespan` and
    gives it to every family of handlers."""

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

    async def _sweep(self, session: Session) -> None:
        """Remove what a previous server left whose owner is gone (``Session.gc``)."""
        try:
            removed = await session.gc()
        except SandboxError as exc:
            log.warning("remote.server.sweep_failed", error=f"{type(exc).__name__}: {exc}")
            return
        log.info("remote.server.swept", removed=len(removed))

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Open the Session and the lease reaper; on exit remove (or keep) the sandboxes."""
        served = self.served = ServedBackend(self._make_backend())
        # The sweep runs beside the serving (below), not before it: a backend slow to list
        # or remove (a wedged container holds Docker's answers for a minute) must not keep
        # the server from answering.
        session = Session(
            served, limits=self.config.limits, timeouts=self.config.timeouts, sweep=False
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
                    if self.config.sweep:
                        tg.start_soon(self._sweep, session)
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
