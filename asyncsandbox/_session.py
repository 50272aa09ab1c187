"""Session: owns a backend, the concurrency limits, background operations and every
sandbox it created. All runtime policy lives here, once for every backend: limits,
deadlines, retries, error mapping, logging, and cleanup that survives cancellation."""

from __future__ import annotations

import builtins
import math
import random
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar, final

import anyio
import msgspec

from . import _owner, _validate as check
from ._config import Limits, RetryPolicy, SandboxDefaults, Timeouts, WarmPool
from ._errors import (
    BackendTimeout,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxNotFound,
)
from ._limits import Limiter, LimiterStatistics
from ._log import get_logger
from ._metrics import COMMAND_NOT_FOUND, Metrics, MetricsReporter, resolve_reporters
from ._models import ExecResult, SandboxInfo, SandboxStatus
from ._operations import Operation
from ._registry import create_backend
from ._sandbox import Sandbox
from ._util import current_async_library
from .abc import Backend, SandboxHandle, SandboxSpec

__all__ = ("Session", "SessionStatistics")

T = TypeVar("T")

_NEW, _OPEN, _CLOSING, _CLOSED = "new", "open", "closing", "closed"
RESOURCE_LIMITS = ("cpus", "memory_mb", "pids", "disk_mb")


class SessionStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a Session: its limits and what went through them."""

    live: LimiterStatistics
    """Sandboxes alive (``Limits.max_live``)."""
    lifecycle: LimiterStatistics
    """Create and remove calls in flight (``Limits.max_lifecycle``)."""
    execs: LimiterStatistics
    """Commands and file transfers in flight (``Limits.max_execs``)."""
    sandboxes_started: int
    sandboxes_removed: int
    start_failures: int
    remove_failures: int
    execs_finished: int
    """Commands that ran to completion, whatever their exit status."""
    execs_timed_out: int
    execs_failed: int
    """Commands that ended with an error other than their timeout (infrastructure, closed)."""
    pool_ready: int = 0
    """Sandboxes waiting in the warm pool."""
    pool_hits: int = 0
    """Starts served from the warm pool."""


@final
class Session:
    """Runs sandboxes on one backend with bounded concurrency. Use as an async context
    manager; closing it removes every sandbox it started and cancels its operations::

        async with asyncsandbox.Session() as session:
            async with session.sandbox() as sb:
                result = await sb.exec(["python3", "-c", "print(6 * 7)"], timeout=10)

    :param backend: a backend name (``"process"``, ``"docker"``, ``"remote"``, ``"fake"`` or
        a plugin's) or a :class:`~asyncsandbox.abc.Backend` instance. The session enters
        and closes it.
    :param backend_options: keyword arguments for the backend, when given by name.
    :param defaults: how new sandboxes look; ``session.sandbox(**overrides)`` varies them.
    :param limits: concurrency bounds (:class:`Limits`).
    :param timeouts: deadlines of infrastructure calls (:class:`Timeouts`).
    :param retries: retries of retryable infrastructure errors in lifecycle calls.
    :param sweep: on open, remove sandboxes left by crashed owners or past their lifetime
        (what ``asyncsandbox gc`` does).
    :param report_to: where :meth:`log_metrics` sends metrics: a list of reporter names
        (``"wandb"``: the active W&B run; ``"log"``: a ``session.metrics`` structlog event)
        or callables ``reporter(metrics, step)``. ``None`` (default): W&B when a run is
        active at logging time. ``[]``: nowhere.
    :param metrics_prefix: prefix of every metric name.
    :param warm_pool: keep sandboxes of the default spec started ahead of need
        (:class:`WarmPool`), so that ``start()`` is a hand-over.

    Open and close it in the same task (``async with`` does that).
    """

    def __init__(
        self,
        backend: str | Backend = "process",
        *,
        backend_options: Mapping[str, Any] | None = None,
        defaults: SandboxDefaults | None = None,
        limits: Limits | None = None,
        timeouts: Timeouts | None = None,
        retries: RetryPolicy | None = None,
        sweep: bool = True,
        report_to: Sequence[str | MetricsReporter] | None = None,
        metrics_prefix: str = "asyncsandbox/",
        warm_pool: WarmPool | None = None,
    ) -> None:
        for name, value, kind in (
            ("defaults", defaults, SandboxDefaults),
            ("limits", limits, Limits),
            ("timeouts", timeouts, Timeouts),
            ("retries", retries, RetryPolicy),
            ("warm_pool", warm_pool, WarmPool),
        ):
            if value is not None and not isinstance(value, kind):
                raise InvalidArgument(f"{name} must be a {kind.__name__}, got {value!r}")
        if isinstance(backend, Backend):
            if backend_options:
                raise InvalidArgument("backend_options apply only to a backend given by name")
            self._backend: Backend | None = backend
            self._backend_name = backend.name
        elif isinstance(backend, str):
            self._backend = None
            self._backend_name = backend
        else:
            raise InvalidArgument(f"backend must be a name or a Backend instance, got {backend!r}")
        self._backend_options = dict(backend_options or {})
        self.id = uuid.uuid4().hex[:12]
        """Identifies this session; its sandboxes carry it as a label."""
        self.defaults = defaults or SandboxDefaults()
        self.limits = limits or Limits()
        self.timeouts = timeouts or Timeouts()
        self.retries = retries or RetryPolicy()
        self._sweep = sweep
        self.warm_pool = warm_pool
        lifetime = self.defaults.max_lifetime
        if (
            warm_pool is not None
            and lifetime is not None
            and (warm_pool.max_age or math.inf) >= lifetime
        ):
            raise InvalidArgument(
                "warm_pool.max_age must be shorter than the sandboxes' max_lifetime"
            )
        self._pool: deque[tuple[SandboxHandle, float]] = deque()  # (ready sandbox, created at)
        self._pool_filling = 0
        self._pool_changed: anyio.Event | None = None
        self._metrics = Metrics(metrics_prefix)
        self._reporters = resolve_reporters(report_to)
        self._state = _NEW
        self._stack: AsyncExitStack | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._sandboxes: set[Sandbox] = set()
        self._creating: set[anyio.CancelScope] = set()
        policy: dict[str, Any] = {
            "capacity_timeout": self.limits.capacity_timeout,
            "on_wait": self._metrics.waited,
            "warn_after": self.limits.capacity_warning,
            "on_slow_wait": self._slow_capacity_wait,
        }
        self._live = Limiter("live", self.limits.max_live, **policy)
        self._lifecycle = Limiter("lifecycle", self.limits.max_lifecycle, **policy)
        self._execs = Limiter("execs", self.limits.max_execs, **policy)
        self._counts = dict.fromkeys(
            (
                "started",
                "removed",
                "start_failures",
                "remove_failures",
                "finished",
                "timed_out",
                "failed",
                "pool_hits",
            ),
            0,
        )
        self._not_found_warned: set[str] = set()
        self._log = get_logger(session_id=self.id, backend=self._backend_name)
        self._unenforced_warned: set[frozenset[str]] = set()

    # -- open / close -------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend instance (created when the session opens, if given by name)."""
        if self._backend is None:
            raise SandboxClosed("the session is not open yet")
        return self._backend

    async def __aenter__(self) -> Self:
        if self._state != _NEW:
            raise SandboxClosed("a Session can be opened only once")
        self._state = _OPEN
        stack = AsyncExitStack()
        try:
            if self._backend is None:
                self._backend = create_backend(self._backend_name, self._backend_options)
            library = current_async_library()
            supported = self._backend.capabilities.async_libraries
            if library not in supported:
                raise InvalidArgument(
                    f"the {self._backend_name!r} backend does not run on {library} (it supports: "
                    f"{', '.join(sorted(supported))}); run it under one of those, or use a "
                    f"backend that supports {library} such as 'process' or 'remote'"
                )
            await stack.enter_async_context(self._backend)
            # Entered here, exited in aclose() (same task, see the class docstring).
            task_group = anyio.create_task_group()
            await task_group.__aenter__()
            self._task_group = task_group
        except BaseException:
            self._state = _CLOSED
            await stack.aclose()
            raise
        self._stack = stack
        self._log.debug("session.opened")
        if self.warm_pool is not None:
            self._pool_changed = anyio.Event()
            self._task_group.start_soon(self._keep_pool, name="asyncsandbox:warm pool")
        if self._sweep:
            try:
                await self.gc()
            except BaseException:
                await self.aclose()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel running operations, remove every sandbox of this session, close the
        backend. Idempotent; always releases (errors are logged, then the first raised).

        Cancellation: runs shielded. Each removal is bounded by ``Timeouts.remove``.
        """
        if self._state in (_CLOSING, _CLOSED):
            return
        self._state = _CLOSING
        errors: list[BaseException] = []
        # Starts still waiting (for capacity, or on the backend) give up: none may create a
        # sandbox once the removals below have begun.
        for scope in list(self._creating):
            scope.cancel()
        if self._task_group is not None:
            # Not shielded, but nothing to wait for beyond the cancelled operations' own
            # (shielded, bounded) cleanup. It must exit outside any scope opened after it.
            self._task_group.cancel_scope.cancel()
            task_group, self._task_group = self._task_group, None
            await task_group.__aexit__(None, None, None)
        # Shielded: leaking sandboxes because the caller was cancelled is exactly the bug
        # this runtime exists to prevent. Every step below is bounded by its own deadline.
        with anyio.CancelScope(shield=True):

            async def stop(sandbox: Sandbox) -> None:
                try:
                    await sandbox.stop()
                except Exception as exc:  # noqa: BLE001 - every sandbox gets its turn first
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                for sandbox in list(self._sandboxes):
                    tg.start_soon(stop, sandbox)
                while self._pool:
                    tg.start_soon(self._discard_pooled, self._pool.popleft()[0])
        if not self._metrics.empty:
            self.log_metrics(reset=True)  # the final figures of the run
        if self._stack is not None:
            # Outside the shield: a backend may hold a task group entered before it, which
            # must exit outside scopes opened later. Backend.aclose shields what it must.
            try:
                await self._stack.aclose()
            except Exception as exc:  # noqa: BLE001 - raised below, after the bookkeeping
                errors.append(exc)
        self._state = _CLOSED
        self._log.debug("session.closed", statistics=self._counts)
        if errors:
            raise errors[0]

    def _check_open(self) -> None:
        if self._state != _OPEN:
            raise SandboxClosed(
                "the session is closed"
                if self._state != _NEW
                else "the session is not open; use `async with Session(...) as session`"
            )

    # -- sandboxes and operations -------------------------------------------------------

    def sandbox(self, **overrides: Any) -> Sandbox:
        """A new, not yet started sandbox: the session's defaults with ``overrides``
        (any :class:`SandboxDefaults` field; ``tags`` and ``env`` add to the defaults)."""
        if self._state in (_CLOSING, _CLOSED):
            raise SandboxClosed("the session is closed")
        return Sandbox(self, self.defaults.merged(overrides))

    async def run(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> ExecResult:
        """Run one command in a fresh sandbox that is removed afterwards (a reward check).

        ``overrides`` configure the sandbox as in :meth:`sandbox`; the other arguments are
        those of :meth:`Sandbox.exec`.

        Cancellation: the command is killed and the sandbox removed.
        """
        async with self.sandbox(**overrides) as sandbox:
            return await sandbox.exec(argv, stdin=stdin, timeout=timeout, check=check, env=env)

    def submit(self, awaitable: Awaitable[T], *, name: str | None = None) -> Operation[T]:
        """Run ``awaitable`` in the session's background and return its handle at once.

        Errors stay in the handle (``await op`` raises them). Consume many handles with
        :func:`asyncsandbox.wait` or :func:`asyncsandbox.as_completed`. Operations still
        running when the session closes are cancelled.
        """
        if not isinstance(awaitable, Awaitable):
            raise InvalidArgument(f"submit() needs an awaitable, got {awaitable!r}")
        op = Operation(awaitable, name or str(getattr(awaitable, "__qualname__", "operation")))
        if self._state != _OPEN or self._task_group is None:
            op._discard()
            self._check_open()
        else:
            self._task_group.start_soon(op._run, name=f"asyncsandbox:{op.name}")
        return op

    async def list(
        self,
        *,
        tags: Iterable[str] = (),
        status: SandboxStatus | str | Iterable[SandboxStatus | str] | None = None,
        this_session: bool = False,
    ) -> builtins.list[SandboxInfo]:
        """Sandboxes of the backend carrying all ``tags`` — of any session or process,
        unless ``this_session`` — optionally only those in ``status``.

        A sandbox whose owner process is gone, or whose lifetime is over, is listed as
        :attr:`SandboxStatus.DEAD` whatever its backend says: nobody will use it again, and
        the garbage collector (``asyncsandbox gc``, the next Session) removes it."""
        labels = _owner.tag_labels(check.tags(tuple(tags) if not isinstance(tags, str) else tags))
        if this_session:
            labels[_owner.SESSION] = self.id
        wanted = _statuses(status)
        self._check_open()
        backend = self.backend
        infos = await self._operation(
            "list", lambda: backend.list(labels=labels), timeout=self.timeouts.operation
        )
        out = [
            msgspec.structs.replace(
                i,
                tags=_owner.tags_of(i.labels),
                backend=self._backend_name,
                status=SandboxStatus.DEAD
                if _owner.garbage_reason(i.labels) is not None
                else i.status,
            )
            for i in infos
        ]
        return [i for i in out if wanted is None or i.status in wanted]

    async def delete(
        self,
        *,
        tags: Iterable[str] = (),
        ids: Iterable[str] = (),
        status: SandboxStatus | str | Iterable[SandboxStatus | str] | None = None,
    ) -> builtins.list[str]:
        """Remove sandboxes of any session: those with the given ``ids``, and every one
        carrying all ``tags`` (optionally only in ``status``). Return the ids now gone.
        At least one tag or id is required (deleting everything takes a tag)."""
        tag_tuple = check.tags(tuple(tags) if not isinstance(tags, str) else tags)
        if isinstance(ids, str):
            raise InvalidArgument("ids must be a sequence of sandbox ids, not a single string")
        targets = [check.identifier("sandbox id", sandbox_id) for sandbox_id in ids]
        if not tag_tuple and not targets:
            raise InvalidArgument("delete() needs tags or ids (refusing to delete everything)")
        if tag_tuple:
            targets += [i.id for i in await self.list(tags=tag_tuple, status=status)]
        return await self._remove_ids(list(dict.fromkeys(targets)))

    async def gc(self, *, dry_run: bool = False) -> builtins.list[tuple[SandboxInfo, str]]:
        """Remove sandboxes whose owner process is gone or whose lifetime is over (of any
        session on this backend); return them with the reason. ``dry_run`` only reports."""
        self._check_open()
        infos = await self.list()
        garbage = [(i, r) for i in infos if (r := _owner.garbage_reason(i.labels)) is not None]
        if garbage and not dry_run:
            removed = set(await self._remove_ids([i.id for i, _ in garbage]))
            garbage = [(i, r) for i, r in garbage if i.id in removed]
            for info, reason in garbage:
                self._log.info("session.gc.removed", sandbox_id=info.id, reason=reason)
        return garbage

    def metrics(self) -> dict[str, float]:
        """The metrics since the last reset, without reporting them. Names (after the
        prefix): ``sandboxes_created``, ``sandboxes_live``, ``executions``,
        ``exec_completed_ok``, ``exec_completed_nonzero``, ``exec_failures`` (timeouts and
        errors), ``exec_timeouts``, ``exec_infrastructure_errors``, ``exec_completion_rate``,
        ``exec_failure_rate``, ``startup_count``, ``avg/min/max_startup_seconds``,
        ``exec_command_not_found`` (exit status 126 or 127: the program could not be run),
        ``avg/min/max_execs_per_sandbox`` (commands finished per sandbox in this window, over
        the sandboxes that ran any, live or removed), ``exec_latency_p50/p90/p99_seconds``,
        ``capacity_wait_seconds`` and ``capacity_wait_max_seconds``."""
        return self._metrics.snapshot(live=self._live.statistics().active)

    def log_metrics(self, step: int | None = None, *, reset: bool = True) -> dict[str, float]:
        """Send :meth:`metrics` to the reporters (``report_to``) at training ``step``, and
        return them. With ``reset``, counting starts afresh — but only once a reporter took
        them, so nothing is lost while no W&B run is active."""
        metrics = self.metrics()
        delivered = False
        for reporter in self._reporters:
            try:
                reporter(metrics, step)
            except LookupError:
                continue  # auto mode without an active run: keep accumulating
            except Exception as exc:  # noqa: BLE001 - a broken reporter must not stop training
                self._log.warning(
                    "session.metrics.report_failed", reporter=repr(reporter), error=repr(exc)
                )
                continue
            delivered = True
        if reset and delivered:
            self._metrics.reset()
        return metrics

    def statistics(self) -> SessionStatistics:
        c = self._counts
        return SessionStatistics(
            live=self._live.statistics(),
            lifecycle=self._lifecycle.statistics(),
            execs=self._execs.statistics(),
            sandboxes_started=c["started"],
            sandboxes_removed=c["removed"],
            start_failures=c["start_failures"],
            remove_failures=c["remove_failures"],
            execs_finished=c["finished"],
            execs_timed_out=c["timed_out"],
            execs_failed=c["failed"],
            pool_ready=len(self._pool),
            pool_hits=c["pool_hits"],
        )

    def __repr__(self) -> str:
        def part(limiter: Limiter) -> str:
            limit = "" if limiter.limit is None else f"/{limiter.limit}"
            s = limiter.statistics()
            return f"{limiter.name}: {s.active}{limit} active, {s.waiting} waiting"

        parts = " | ".join(part(x) for x in (self._live, self._lifecycle, self._execs))
        return f"<Session {self._backend_name} {self._state} [{parts}]>"

    # -- policy used by Sandbox ---------------------------------------------------------

    def _spec(self, config: SandboxDefaults) -> SandboxSpec:
        caps = self.backend.capabilities
        if config.network not in caps.network_modes:
            raise InvalidArgument(
                f"the {self._backend_name!r} backend does not support network={config.network!r} "
                f"(supported: {', '.join(sorted(caps.network_modes))})"
            )
        wanted = {n for n in RESOURCE_LIMITS if getattr(config.resources, n) is not None}
        unenforced = frozenset(wanted - caps.enforced_limits)
        if unenforced and unenforced not in self._unenforced_warned:
            self._unenforced_warned.add(unenforced)
            self._log.warning(
                "sandbox.limits.unenforced",
                limits=sorted(unenforced),
                hint=f"the {self._backend_name} backend cannot enforce them here "
                "(the process backend needs root for cgroups and disk quotas)",
            )
        return SandboxSpec(
            image=config.image,
            env=config.env,
            workdir=config.workdir,
            resources=config.resources,
            network=config.network,
            labels=_owner.runtime_labels(
                session_id=self.id, tags=config.tags, max_lifetime=config.max_lifetime
            ),
            max_lifetime=config.max_lifetime,
        )

    async def _create(self, sandbox: Sandbox) -> SandboxHandle:
        self._check_open()
        if self._pool and sandbox.config == self.defaults:
            # A hand-over: the pooled sandbox already holds its live slot.
            handle, _ = self._pool.popleft()
            assert self._pool_changed is not None
            self._pool_changed.set()
            self._counts["pool_hits"] += 1
            started = anyio.current_time()
        else:
            handle, started = await self._create_handle(self._spec(sandbox.config))
        if self._state != _OPEN:
            # Created just as the session began closing, maybe after it listed what to
            # remove: remove it here (shielded: it must not outlive the session).
            with anyio.CancelScope(shield=True):
                await self._remove(sandbox, handle)
            raise SandboxClosed("the session closed while the sandbox was starting")
        sandbox.startup_seconds = anyio.current_time() - started
        self._metrics.started(sandbox.startup_seconds)
        self._sandboxes.add(sandbox)
        self._counts["started"] += 1
        self._log.debug(
            "sandbox.started", sandbox_id=handle.id, seconds=round(sandbox.startup_seconds, 4)
        )
        return handle

    async def _create_handle(self, spec: SandboxSpec) -> tuple[SandboxHandle, float]:
        """Create a sandbox under the limits; return it (holding a live slot) and when its
        creation began."""
        backend = self.backend
        handle: SandboxHandle | None = None
        with anyio.CancelScope() as scope:
            self._creating.add(scope)
            try:
                await self._live.acquire()
                try:
                    async with self._lifecycle.slot():
                        self._check_open()  # the session may have closed while we waited
                        started = anyio.current_time()
                        handle = await self._operation(
                            "create", lambda: backend.create(spec), timeout=self.timeouts.create
                        )
                except BaseException:
                    self._live.release()
                    self._counts["start_failures"] += 1
                    raise
            finally:
                self._creating.discard(scope)
        if handle is None:
            raise SandboxClosed("the session closed while the sandbox was starting")
        return handle, started

    async def _keep_pool(self) -> None:
        """Keep ``warm_pool.size`` sandboxes ready, replacing those past ``max_age``."""
        pool = self.warm_pool
        assert pool is not None
        while True:
            self._pool_changed = changed = anyio.Event()
            now = anyio.current_time()
            while (
                self._pool and pool.max_age is not None and now - self._pool[0][1] >= pool.max_age
            ):
                assert self._task_group is not None
                self._task_group.start_soon(self._discard_pooled, self._pool.popleft()[0])
            for _ in range(pool.size - len(self._pool) - self._pool_filling):
                self._pool_filling += 1
                assert self._task_group is not None
                self._task_group.start_soon(self._fill_pool)
            wake = math.inf
            if self._pool and pool.max_age is not None:
                wake = self._pool[0][1] + pool.max_age - now
            with anyio.move_on_after(wake):
                await changed.wait()

    async def _fill_pool(self) -> None:
        try:
            handle, _ = await self._create_handle(self._spec(self.defaults))
            self._pool.append((handle, anyio.current_time()))
        except SandboxError as exc:
            if self._state == _OPEN:
                self._log.warning("session.pool.fill_failed", error=repr(exc))
                await anyio.sleep(1.0)  # do not spin on a backend that keeps failing
        finally:
            self._pool_filling -= 1
            if self._pool_changed is not None:
                self._pool_changed.set()

    async def _discard_pooled(self, handle: SandboxHandle) -> None:
        # Shielded: a pooled sandbox must not outlive its session either.
        with anyio.CancelScope(shield=True):
            try:
                async with self._lifecycle.slot(bounded=False):
                    await self._operation("remove", handle.remove, timeout=self.timeouts.remove)
            except SandboxError as exc:
                self._log.warning("sandbox.remove.failed", sandbox_id=handle.id, error=repr(exc))
            finally:
                self._live.release()

    async def _remove(self, sandbox: Sandbox, handle: SandboxHandle) -> None:
        """Remove a started sandbox (called shielded by ``Sandbox.stop``)."""
        try:
            async with self._lifecycle.slot(bounded=False):
                await self._operation(
                    "remove", handle.remove, timeout=self.timeouts.remove, sandbox=None
                )
        except Exception as exc:
            self._counts["remove_failures"] += 1
            self._log.warning("sandbox.remove.failed", sandbox_id=handle.id, error=repr(exc))
            raise
        else:
            self._counts["removed"] += 1
            self._log.debug("sandbox.removed", sandbox_id=handle.id)
        finally:
            self._sandboxes.discard(sandbox)
            self._live.release()

    async def _remove_ids(self, ids: builtins.list[str]) -> builtins.list[str]:
        """Remove sandboxes by id (of any session); return those now gone."""
        ours = {sb.id: sb for sb in self._sandboxes}
        backend = self.backend
        removed: builtins.list[str] = []

        async def remove(sandbox_id: str) -> None:
            try:
                if sandbox_id in ours:
                    await ours[sandbox_id].stop()
                else:
                    async with self._lifecycle.slot():
                        try:
                            handle = await self._operation(
                                "attach",
                                lambda: backend.attach(sandbox_id),
                                timeout=self.timeouts.operation,
                            )
                        except SandboxNotFound:
                            removed.append(sandbox_id)
                            return
                        await self._operation("remove", handle.remove, timeout=self.timeouts.remove)
            except SandboxError as exc:
                self._log.warning("sandbox.remove.failed", sandbox_id=sandbox_id, error=repr(exc))
            else:
                removed.append(sandbox_id)

        async with anyio.create_task_group() as tg:
            for sandbox_id in ids:
                tg.start_soon(remove, sandbox_id)
        return removed

    def _exec_slot(self) -> AbstractAsyncContextManager[None]:
        return self._execs.slot()

    def _exec_finished(
        self, sandbox: Sandbox, result: ExecResult | None, error: BaseException | None
    ) -> None:
        if result is not None and result.timed_out:
            self._counts["timed_out"] += 1
        elif error is not None:
            self._counts["failed"] += 1
        else:
            self._counts["finished"] += 1
        self._metrics.exec_finished(
            sandbox=sandbox.id,
            returncode=None if result is None else result.returncode,
            duration=None if result is None else result.duration,
            timed_out=result is not None and result.timed_out,
            infrastructure=isinstance(error, InfrastructureError),
        )
        sandbox._record(result, error)
        if result is not None and not result.timed_out:
            if result.returncode in COMMAND_NOT_FOUND:
                self._warn_not_found(result)
            sandbox._log.debug(
                "sandbox.exec.finished",
                argv0=result.argv[0],
                returncode=result.returncode,
                seconds=round(result.duration, 4),
                timed_out=result.timed_out,
            )

    def _slow_capacity_wait(self, limiter: Limiter, waited: float) -> None:
        """A task has waited ``waited`` seconds for a slot of ``limiter``: say why."""
        stats = limiter.statistics()
        cause = _CAPACITY_CAUSES.get(limiter.name, "")
        if limiter.name == "live":
            idle = sum(1 for sb in self._sandboxes if not sb._running)
            cause = cause.format(idle=idle, live=len(self._sandboxes))
        timeout = self.limits.capacity_timeout
        self._log.warning(
            "session.capacity.waiting",
            limit=limiter.name,
            active=stats.active,
            max=stats.limit,
            waiting=stats.waiting,
            waited_seconds=round(waited, 1),
            capacity_timeout=timeout,
            message=(
                f"waited {waited:.0f}s for a {limiter.name!r} slot: {stats.active}/{stats.limit} "
                f"in use, {stats.waiting} waiting"
                f"{'' if timeout is None else f' (giving up after {timeout:g}s)'}; {cause}"
            ),
        )

    def _warn_not_found(self, result: ExecResult) -> None:
        """Warn, once per program, of a command the sandbox could not run: a reward
        computed from such exit statuses is 0 for every completion, silently."""
        program = result.argv[0]
        if program in self._not_found_warned:
            return
        self._not_found_warned.add(program)
        self._log.warning(
            "sandbox.exec.command_not_found",
            program=program,
            returncode=result.returncode,
            stderr=result.stderr_text.strip()[-300:],
            hint=(
                "exit status 127 means a program was not found in the sandbox (126: it "
                "could not be executed); every command failing this way scores the same. "
                "Check that the program exists in the sandbox's image (e.g. python3 vs "
                "python); further commands of this program are not reported again"
            ),
        )

    async def _operation(
        self,
        name: str,
        call: Callable[[], Awaitable[T]],
        *,
        timeout: float | None,
        sandbox: Sandbox | None = None,
    ) -> T:
        """An idempotent infrastructure call, with its deadline and retries."""
        attempt = 0
        while True:
            attempt += 1
            try:
                with anyio.move_on_after(timeout if timeout is not None else float("inf")):
                    return await self._backend_call(call(), sandbox=sandbox)
                assert timeout is not None
                raise BackendTimeout(name, timeout)
            except InfrastructureError as exc:
                await self._before_retry(name, attempt, exc)

    async def _launch(self, name: str, call: Callable[[], Awaitable[T]], sandbox: Sandbox) -> T:
        """A command or file operation in a sandbox: retried only when the backend could
        not launch it (:class:`LaunchError`: it never ran, so running it again is safe)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._backend_call(call(), sandbox=sandbox)
            except LaunchError as exc:
                await self._before_retry(name, attempt, exc)

    async def _before_retry(self, name: str, attempt: int, exc: InfrastructureError) -> None:
        """Re-raise ``exc`` unless the retry policy allows another attempt; then back off."""
        if not exc.retryable or attempt >= self.retries.attempts:
            raise exc
        delay = random.uniform(
            0, min(self.retries.max_backoff, self.retries.backoff * 2 ** (attempt - 1))
        )
        self._log.warning(
            "backend.retry", operation=name, attempt=attempt, delay=round(delay, 3), error=str(exc)
        )
        await anyio.sleep(delay)

    async def _backend_call(self, awaitable: Awaitable[T], *, sandbox: Sandbox | None) -> T:
        """Await a backend call, translating what escapes the contract."""
        try:
            return await awaitable
        except StopAsyncIteration:
            raise  # the end of a chunk stream, not an error
        except SandboxDied as exc:
            if sandbox is not None:
                sandbox._mark_dead(exc)
            raise
        except SandboxError:
            raise
        except Exception as exc:
            self._log.error("backend.unexpected_error", error=repr(exc))
            raise InfrastructureError(f"the {self._backend_name} backend failed: {exc!r}") from exc

    @asynccontextmanager
    async def _backend_context(
        self, context: Any, *, sandbox: Sandbox | None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        chunks = await self._backend_call(context.__aenter__(), sandbox=sandbox)
        try:
            yield _MappedChunks(self, chunks, sandbox)
        except BaseException as exc:
            if not await context.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await context.__aexit__(None, None, None)


class _MappedChunks:
    """A backend's chunk iterator whose errors are translated like any backend call."""

    def __init__(
        self, session: Session, chunks: AsyncIterator[bytes], sandbox: Sandbox | None
    ) -> None:
        self._session = session
        self._chunks = chunks
        self._sandbox = sandbox

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        return await self._session._backend_call(anext(self._chunks), sandbox=self._sandbox)


_CAPACITY_CAUSES = {
    "live": (
        "likely cause: sandboxes that are never stopped (e.g. `session.sandbox().exec(...)` "
        "in a reward function called every step) keep their slot until the session closes "
        "({idle} of the {live} live sandboxes run no command right now). Stop each sandbox when its episode "
        "ends (`async with session.sandbox()`, `stop()`), use `session.run()` for one-off "
        "commands, or raise Limits.max_live"
    ),
    "execs": (
        "likely cause: more commands and file transfers at once than Limits.max_execs "
        "allows; they run as slots free up"
    ),
    "lifecycle": (
        "likely cause: the backend is slow to create or remove sandboxes "
        "(Limits.max_lifecycle calls at once)"
    ),
}


def _statuses(value: object) -> set[SandboxStatus] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str | SandboxStatus) else value
    if not isinstance(items, Iterable):
        raise InvalidArgument(
            f"status must be a SandboxStatus or a sequence of them, got {value!r}"
        )
    try:
        return {SandboxStatus(v) for v in items}
    except ValueError:
        known = ", ".join(s.value for s in SandboxStatus)
        raise InvalidArgument(f"unknown status in {value!r}; known: {known}") from None
