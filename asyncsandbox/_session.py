"""Session: the public entry point. It holds the set of sandboxes it started and the
background operations it runs; the policy (limits, deadlines, retries, error mapping,
metrics) lives one layer down, in the runtime, which both the Session and its Sandboxes
call and which never calls them back."""

from __future__ import annotations

import builtins
import enum
import math
import uuid
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, final

import anyio
import msgspec

from . import _owner, _validate as check
from ._commands import ExecArgs
from ._config import Limits, RetryPolicy, SandboxDefaults, Timeouts, WarmPool
from ._errors import InvalidArgument, SandboxClosed, SandboxError, SandboxNotFound
from ._judge._engine import judge_fresh, judge_remotely
from ._judge._model import (
    Comparison,
    JudgeRequest,
    JudgeResult,
    JudgingBackend,
    Program,
    TestCase,
)
from ._lifecycle import Lifecycle, SandboxOwner
from ._limits import Limiter, LimiterStatistics
from ._log import get_logger
from ._metrics import Metrics, MetricsReporter, resolve_reporters
from ._models import ExecResult, SandboxInfo, SandboxStatus, Snapshot, SnapshotInfo
from ._operations import Operation, start as start_operation
from ._pool import Pool
from ._runtime import Runtime
from ._sandbox import Sandbox
from .abc import Backend

__all__ = ("Session", "SessionStatistics")

T = TypeVar("T")


class SessionState(enum.StrEnum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


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
    """Sandboxes ready for a start: the warm pool's, and recycled ones reset."""
    pool_hits: int = 0
    """Starts given a ready sandbox (the warm pool's or a recycled one) instead of a new."""


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
        elif not isinstance(backend, str):
            raise InvalidArgument(f"backend must be a name or a Backend instance, got {backend!r}")
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
        self._metrics = Metrics(metrics_prefix)
        self._reporters = resolve_reporters(report_to)
        self._state = SessionState.NEW
        backend_name = backend.name if isinstance(backend, Backend) else backend
        self._log = get_logger(session_id=self.id, backend=backend_name)
        self._runtime = Runtime(
            backend,
            backend_options or {},
            session_id=self.id,
            limits=self.limits,
            timeouts=self.timeouts,
            retries=self.retries,
            metrics=self._metrics,
            log=self._log,
        )
        self._pool = Pool(self._runtime, warm_pool, self.defaults)
        self._sandboxes: set[Lifecycle] = set()  # of the sandboxes started, not stopped
        self._owner = SandboxOwner(self._runtime, self._sandboxes, self._pool)
        self._task_group: anyio.abc.TaskGroup | None = None

    # -- open / close -------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend instance (created when the session opens, if given by name)."""
        return self._runtime.backend

    async def __aenter__(self) -> Self:
        if self._state != SessionState.NEW:
            raise SandboxClosed("a Session can be opened only once")
        self._state = SessionState.OPEN
        try:
            await self._runtime.open()
            # Entered here, exited in aclose() (same task, see the class docstring).
            task_group = anyio.create_task_group()
            await task_group.__aenter__()
            self._task_group = task_group
        except BaseException:
            self._state = SessionState.CLOSED
            await self._runtime.close()
            raise
        self._log.debug("session.opened")
        if self.warm_pool is not None and self.warm_pool.recycle:
            try:
                self._runtime.check_capability("reset")
            except BaseException:
                await self.aclose()
                raise
        self._task_group.start_soon(self._pool.keep, name="asyncsandbox:pool")
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
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            return
        self._state = SessionState.CLOSING
        errors: list[BaseException] = []
        # Starts still waiting (for capacity, or on the backend) give up: none may create a
        # sandbox once the removals below have begun.
        self._runtime.begin_close()
        try:
            if self._task_group is not None:
                # Not shielded (it must exit outside any scope opened after it): if our
                # caller is cancelled meanwhile, this raises, and the finally still
                # removes everything, then the cancellation goes on.
                self._task_group.cancel_scope.cancel()
                task_group, self._task_group = self._task_group, None
                await task_group.__aexit__(None, None, None)
        finally:
            await self._release(errors)
        if errors:
            raise errors[0]

    async def _release(self, errors: list[BaseException]) -> None:
        """Remove every sandbox and snapshot of the session, and close the backend."""
        # Shielded: leaking sandboxes because the caller was cancelled is exactly the bug
        # this runtime exists to prevent. Every step below is bounded by its own deadline.
        with anyio.CancelScope(shield=True):

            async def stop(sandbox: Lifecycle) -> None:
                try:
                    await sandbox.stop()
                except Exception as exc:  # noqa: BLE001 - every sandbox gets its turn first
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                for sandbox in list(self._sandboxes):
                    tg.start_soon(stop, sandbox)
                tg.start_soon(self._pool.discard_all)
            # Then the snapshots that go with the session (not those kept).
            async with anyio.create_task_group() as tg:
                for snapshot_id in list(self._runtime.snapshots):
                    tg.start_soon(self._delete_snapshot, snapshot_id, errors)
        if not self._metrics.empty:
            self.log_metrics(reset=True)  # the final figures of the run
        try:
            # Not shielded: the backend may hold a task group entered before our scopes
            # (see Runtime.close); Backend.aclose shields what it must.
            await self._runtime.close()
        except Exception as exc:  # noqa: BLE001 - raised by aclose, after the bookkeeping
            errors.append(exc)
        finally:
            self._state = SessionState.CLOSED
        self._log.debug("session.closed", statistics=self._runtime.counts)

    async def _delete_snapshot(self, snapshot_id: str, errors: list[BaseException]) -> None:
        try:
            await self._runtime.delete_snapshot(snapshot_id)
        except Exception as exc:  # noqa: BLE001 - every snapshot gets its turn first
            errors.append(exc)

    def _check_open(self) -> None:
        if self._state != SessionState.OPEN:
            raise SandboxClosed(
                "the session is closed"
                if self._state != SessionState.NEW
                else "the session is not open; use `async with Session(...) as session`"
            )

    # -- sandboxes and operations -------------------------------------------------------

    def sandbox(self, **overrides: Any) -> Sandbox:
        """A new, not yet started sandbox: the session's defaults with ``overrides``
        (any :class:`SandboxDefaults` field; ``tags`` and ``env`` add to the defaults)."""
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            raise SandboxClosed("the session is closed")
        return Sandbox(self._owner, self.defaults.merged(overrides))

    async def attach(self, sandbox_id: str, **overrides: Any) -> Sandbox:
        """The running sandbox ``sandbox_id`` of any session on this backend (one whose id
        was kept, say by another process): its commands and files are reached as a
        sandbox of this session's are. It stays its creator's: closing this session
        leaves it running, and only its :meth:`~Sandbox.stop` here removes it.
        ``overrides`` (any :class:`SandboxDefaults` field) describe it as it was made: the
        working directory commands start in, above all; the session's defaults otherwise.

        Raises :class:`SandboxNotFound` when there is no such sandbox (any more).

        Cancellation: nothing to undo (attaching creates nothing).
        """
        self._check_open()
        check.identifier("sandbox id", sandbox_id)
        handle = await self._runtime.attach(sandbox_id)
        return Sandbox(self._owner, self.defaults.merged(overrides), handle)

    async def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Delete a snapshot (a kept one, or one before its session closes); sandboxes
        started from it go on. Idempotent.

        Cancellation: runs shielded, bounded by ``Timeouts.remove``.
        """
        self._check_open()
        snapshot_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        check.optional_text("snapshot", snapshot_id)
        await self._runtime.delete_snapshot(snapshot_id)

    async def run(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
        **overrides: Any,
    ) -> ExecResult:
        """Run one command in a fresh sandbox that is gone afterwards (a reward check).

        ``overrides`` configure the sandbox as in :meth:`sandbox`; the other arguments are
        those of :meth:`Sandbox.exec`. The sandbox is ``recyclable`` unless the overrides
        say otherwise: where the backend can reset one, the next call gets it back reset,
        a fresh sandbox to it, without the cost of a new one.

        Cancellation: the command is killed and the sandbox removed.
        """
        sandbox = self.sandbox(**{"recyclable": True, **overrides})
        # The command's arguments are checked before the sandbox is made: bad input costs
        # no sandbox (a Docker container, a pod) made and removed only to refuse it.
        ExecArgs(sandbox.config, argv, cwd, env, stdin, timeout, check, max_output_bytes)
        async with sandbox:
            return await sandbox.exec(
                argv,
                cwd=cwd,
                env=env,
                stdin=stdin,
                timeout=timeout,
                check=check,
                max_output_bytes=max_output_bytes,
            )

    async def judge(
        self,
        program: Program,
        cases: Sequence[TestCase | Mapping[str, Any]],
        *,
        comparison: Comparison = "whitespace",
        time_limit: float = 10.0,
        memory_mb: int | None = None,
        stop_on_failure: bool = False,
        parallel: int = 4,
        compile_timeout: float = 60.0,
        output_limit: int = 1 << 20,
        full_output: bool = False,
        directory: str | None = None,
        **overrides: Any,
    ) -> JudgeResult:
        """Judge ``program`` on test ``cases`` in a fresh sandbox (``overrides`` configure
        it as in :meth:`sandbox`): compile once, run every case, return typed verdicts and
        a score (see :mod:`asyncsandbox.judge`). The other arguments are the fields of
        :class:`~asyncsandbox.judge.JudgeRequest`, documented there; ``cases`` may be
        dicts of :class:`~asyncsandbox.judge.TestCase` fields. The sandbox is
        ``recyclable`` (see :meth:`run`) unless the overrides say otherwise.

        Cancellation: running cases are killed and the sandbox removed.
        """
        request = JudgeRequest.of(
            program,
            cases,
            comparison=comparison,
            time_limit=time_limit,
            memory_mb=memory_mb,
            stop_on_failure=stop_on_failure,
            parallel=parallel,
            compile_timeout=compile_timeout,
            output_limit=output_limit,
            full_output=full_output,
            directory=directory,
        )
        self._check_open()
        backend = self.backend
        if isinstance(backend, JudgingBackend):
            # Judged where the backend's sandboxes are, in one call (no deadline: judging
            # takes as long as its cases; errors translated like any backend call).
            spec = self._runtime.spec(self.defaults.merged(dict(overrides)))
            request = msgspec.structs.replace(request, sandbox=spec)
            judged = self._runtime.once("judge", lambda: backend.judge(request))
            return await judge_remotely(request, judged)
        return await judge_fresh(request, lambda: self.sandbox(**{"recyclable": True, **overrides}))

    def submit(self, awaitable: Awaitable[T], *, name: str | None = None) -> Operation[T]:
        """Run ``awaitable`` in the session's background and return its handle at once.

        Errors stay in the handle (``await op`` raises them). Consume many handles with
        :func:`asyncsandbox.wait` or :func:`asyncsandbox.as_completed`. Operations still
        running when the session closes are cancelled.
        """
        if not isinstance(awaitable, Awaitable):
            raise InvalidArgument(f"submit() needs an awaitable, got {awaitable!r}")
        open_ = self._state == SessionState.OPEN and self._task_group is not None
        op = start_operation(
            awaitable,
            name or str(getattr(awaitable, "__qualname__", "operation")),
            self._task_group if open_ else None,
        )
        if not open_:
            self._check_open()
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
        infos = await self._runtime.call(
            "list", lambda: backend.list(labels=labels), timeout=self.timeouts.operation
        )
        out = [
            msgspec.structs.replace(
                i,
                tags=_owner.tags_of(i.labels),
                backend=self._runtime.name,
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

    async def gc(
        self, *, dry_run: bool = False
    ) -> builtins.list[tuple[SandboxInfo | SnapshotInfo, str]]:
        """Remove sandboxes whose owner process is gone or whose lifetime is over, and
        snapshots that were to go with a session whose owner process is gone (of any
        session on this backend; a kept snapshot is never collected); return them with
        the reason. ``dry_run`` only reports.

        Cancellation: what was removed stays removed; the rest is left for the next gc.
        """
        self._check_open()
        infos = await self.list()
        garbage = [(i, r) for i in infos if (r := _owner.garbage_reason(i.labels)) is not None]
        if garbage and not dry_run:
            removed = set(await self._remove_ids([i.id for i, _ in garbage]))
            garbage = [(i, r) for i, r in garbage if i.id in removed]
            for info, reason in garbage:
                self._log.info("session.gc.removed", sandbox_id=info.id, reason=reason)
        collected: builtins.list[tuple[SandboxInfo | SnapshotInfo, str]] = list(garbage)
        if not self.backend.capabilities.snapshots:
            return collected
        runtime = self._runtime
        snapshots = await runtime.call(
            "list_snapshots", self.backend.list_snapshots, timeout=runtime.timeouts.operation
        )
        for snapshot in snapshots:
            why = _owner.garbage_reason(snapshot.labels)
            if why is None:
                continue
            if not dry_run:
                await runtime.delete_snapshot(snapshot.id)
                self._log.info("session.gc.snapshot_removed", snapshot_id=snapshot.id, reason=why)
            collected.append((snapshot, why))
        return collected

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
        return self._metrics.snapshot(live=self._runtime.live.statistics().active)

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
        runtime = self._runtime
        c = runtime.counts
        return SessionStatistics(
            live=runtime.live.statistics(),
            lifecycle=runtime.lifecycle.statistics(),
            execs=runtime.execs.statistics(),
            sandboxes_started=c["started"],
            sandboxes_removed=c["removed"],
            start_failures=c["start_failures"],
            remove_failures=c["remove_failures"],
            execs_finished=c["finished"],
            execs_timed_out=c["timed_out"],
            execs_failed=c["failed"],
            pool_ready=self._pool.ready,
            pool_hits=self._pool.hits,
        )

    def __repr__(self) -> str:
        def part(limiter: Limiter) -> str:
            limit = "" if limiter.limit is None else f"/{limiter.limit}"
            s = limiter.statistics()
            return f"{limiter.name}: {s.active}{limit} active, {s.waiting} waiting"

        runtime = self._runtime
        parts = " | ".join(part(x) for x in (runtime.live, runtime.lifecycle, runtime.execs))
        return f"<Session {runtime.name} {self._state} [{parts}]>"

    async def _remove_ids(self, ids: builtins.list[str]) -> builtins.list[str]:
        """Remove sandboxes by id (of any session); return those now gone."""
        ours = {sb.id: sb for sb in self._sandboxes}
        removed: builtins.list[str] = []

        async def remove(sandbox_id: str) -> None:
            try:
                if sandbox_id in ours:
                    await ours[sandbox_id].stop()
                else:
                    await self._runtime.remove_by_id(sandbox_id)
            except SandboxNotFound:
                removed.append(sandbox_id)
            except SandboxError as exc:
                self._log.warning("sandbox.remove.failed", sandbox_id=sandbox_id, error=repr(exc))
            else:
                removed.append(sandbox_id)

        async with anyio.create_task_group() as tg:
            for sandbox_id in ids:
                tg.start_soon(remove, sandbox_id)
        return removed


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
