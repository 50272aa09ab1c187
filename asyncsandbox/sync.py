"""A blocking facade over the async API, for code that cannot be async (TRL reward
functions, scripts, thread pools)::

    from asyncsandbox.sync import SyncSession

    session = SyncSession()  # at module level is fine: it starts on first use

    def reward_fn(completions: list[str], **kwargs: object) -> list[float]:
        # Launch everything first, then collect: the commands run in parallel, each in a
        # fresh sandbox that is removed when its command ends.
        handles = [session.run(["python3", "-c", code], timeout=30) for code in completions]
        return [1.0 if h.result().returncode == 0 else 0.0 for h in handles]

(``session.sandbox().exec(...)`` works too, but that sandbox lives until ``stop()`` or the
session's close: in a reward function called at every training step, prefer ``run``.)

How it works: a :class:`SyncSession` runs one event loop in a background thread (an anyio
blocking portal, on asyncio or trio) and drives a real :class:`asyncsandbox.Session` in it.
Every method is the async API's own method, run in that loop: limits, timeouts, errors and
cleanup are exactly those of the async API, with no second implementation.

Methods of a sandbox return a :class:`Handle` at once (a future: ``result()``, ``done()``,
``cancel()``), so sync code can launch hundreds of commands and collect them later with
:func:`wait` or :func:`as_completed`. Handles raise the async API's exceptions
(:class:`~asyncsandbox.ExecTimeout`, :class:`~asyncsandbox.SandboxFileError`, ...).

Everything here is thread-safe: many threads may share one SyncSession.

Nothing here may be called from a thread that runs an event loop (inside ``async def``
code): that raises :class:`RunningEventLoopError` at once, instead of blocking the loop or
deadlocking. In async code, use :class:`asyncsandbox.Session` directly; so in Jupyter,
whose cells run inside an event loop, use the async API with top-level ``await``.
Handles may be passed to a worker thread (``anyio.to_thread.run_sync(handle.result)``).
"""

from __future__ import annotations

import builtins
import functools
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from os import PathLike
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, final

import anyio

from . import _sandbox, _session, _validate as check
from ._config import Limits, RetryPolicy, SandboxDefaults, Timeouts, WarmPool
from ._interpreter._models import CodeContext, Execution, ExecutionError, OutputMessage, Result
from ._metrics import MetricsReporter
from ._models import ExecResult, SandboxInfo, SandboxStatus, Snapshot, SnapshotInfo
from ._session import SessionStatistics
from ._streams import OutputHandler
from ._synchandle import Handle, as_completed, wait
from ._syncloop import RunningEventLoopError, SyncRuntime, check_blocking_allowed
from ._util import claim_public
from .abc import Backend
from .judge import Comparison, JudgeResult, Program, TestCase

# The async classes under private names only: `asyncsandbox.sync.Session` would be the
# async Session, whose methods return coroutines that sync code never runs (see __getattr__).
_AsyncSession = _session.Session
_AsyncSandbox = _sandbox.Sandbox
T_Attr = TypeVar("T_Attr")

__all__ = (
    "SyncSession",
    "SyncSandbox",
    "Handle",
    "wait",
    "as_completed",
    "RunningEventLoopError",
)

T = TypeVar("T")

_ASYNC_NAMES = {
    "Session": "SyncSession",
    "Sandbox": "SyncSandbox",
}


def __getattr__(name: str) -> Any:
    # A user porting `from cwsandbox import Session` to `from asyncsandbox.sync import
    # Session` must get an error, not the async class (whose calls silently do nothing).
    # An ImportError, not an AttributeError: `from ... import` would replace the latter
    # with a bare "cannot import name", losing the pointer to the right class.
    if name in _ASYNC_NAMES:
        raise ImportError(
            f"asyncsandbox.sync has no {name}: the blocking class is "
            f"asyncsandbox.sync.{_ASYNC_NAMES[name]} (asyncsandbox.{name} is the async one; "
            f"code written for the cwsandbox SDK runs with asyncsandbox.compat.cwsandbox)",
            name=__name__,
        )
    raise AttributeError(f"module 'asyncsandbox.sync' has no attribute {name!r}")


@final
class SyncSandbox:
    """A sandbox of a :class:`SyncSession`: the methods of :class:`asyncsandbox.Sandbox`,
    each returning a :class:`Handle` at once instead of a coroutine.

    Get one from :meth:`SyncSession.sandbox`. It starts on first use (or :meth:`start`) and
    is removed by :meth:`stop`, at the latest when its session closes. As a context
    manager, it is started on enter and removed on exit (both blocking)::

        with session.sandbox() as sb:
            sb.write_file("main.py", code).result()
            print(sb.exec(["python3", "main.py"], timeout=10).result().stdout_text)
    """

    def __init__(self, owner: SyncSession, sandbox: _sandbox.Sandbox) -> None:
        self._owner = owner
        self._sandbox = sandbox
        # Dropped without stop(): stopped when collected, so that a reward function calling
        # `session.sandbox().exec(...)` every step does not fill the session's `max_live`
        # with sandboxes nobody will use again. At interpreter exit the session's own close
        # removes them, so this need not run then. An attached sandbox is its creator's.
        if not sandbox.attached:
            finalizer = weakref.finalize(self, owner._runtime.stop_orphan, sandbox)
            finalizer.atexit = False

    @property
    def id(self) -> str | None:
        """The backend's id, once started."""
        return self._sandbox.id

    @property
    def state(self) -> str:
        """``new``, ``starting``, ``running``, ``stopping`` or ``closed``."""
        return self._sandbox.state

    @property
    def attached(self) -> bool:
        """Made by another session and attached to (see :meth:`SyncSession.attach`)."""
        return self._sandbox.attached

    @property
    def config(self) -> SandboxDefaults:
        """The effective settings of this sandbox (the session defaults plus overrides)."""
        return self._sandbox.config

    @property
    def tags(self) -> tuple[str, ...]:
        """The sandbox's tags."""
        return self._sandbox.tags

    @property
    def exec_count(self) -> int:
        """Commands started in this sandbox so far."""
        return self._sandbox.exec_count

    @property
    def exec_stats(self) -> dict[str, int]:
        """Commands of this sandbox (see :attr:`asyncsandbox.Sandbox.exec_stats`):
        ``exec_count``, ``exec_completed_ok``, ``exec_completed_nonzero``, ``exec_failures``."""
        # Plain counters read across threads: a snapshot, possibly one update behind.
        return self._sandbox.exec_stats

    @property
    def started_at(self) -> float | None:
        """``time.time()`` when the sandbox became ready."""
        return self._sandbox.started_at

    @property
    def startup_seconds(self) -> float | None:
        """How long creating and starting it took."""
        return self._sandbox.startup_seconds

    def extra(self, attribute: T_Attr, default: Any = anyio.TypedAttributeLookupError) -> T_Attr:
        """A backend-specific typed attribute of the started sandbox (see
        :meth:`asyncsandbox.Sandbox.extra`). Never blocks."""
        return self._sandbox.extra(attribute, default)

    def _launch(self, what: str, func: Callable[[], Awaitable[T]]) -> Handle[T]:
        return self._owner._launch(what, func, keep=self)

    def start(self) -> Handle[SyncSandbox]:
        """Create and start the sandbox (see :meth:`asyncsandbox.Sandbox.start`)."""

        async def start() -> SyncSandbox:
            await self._sandbox.start()
            return self

        return self._launch("start", start)

    def stop(self) -> Handle[None]:
        """Remove the sandbox (see :meth:`asyncsandbox.Sandbox.stop`). Returns at once; the
        removal runs in the background (wait for it with ``.result()`` if needed).

        Cancellation: the removal is shielded: cancelling the handle does not stop it.
        """
        return self._launch("stop", self._sandbox.stop)

    def exec(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
    ) -> Handle[ExecResult]:
        """Run ``argv`` (no shell) and return a handle for its
        :class:`~asyncsandbox.ExecResult`; arguments as for
        :meth:`asyncsandbox.Sandbox.exec`. ``.result()`` raises
        :class:`~asyncsandbox.ExecTimeout` when the command ran past ``timeout``.

        Cancellation: cancelling the handle kills the command (its whole process tree).
        """
        call = functools.partial(
            self._sandbox.exec,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            check=check,
            max_output_bytes=max_output_bytes,
        )
        return self._launch("exec", call)

    def run_code(
        self,
        code: str,
        *,
        context: CodeContext | str | None = None,
        language: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        on_stdout: OutputHandler[OutputMessage] | None = None,
        on_stderr: OutputHandler[OutputMessage] | None = None,
        on_result: OutputHandler[Result] | None = None,
        on_error: OutputHandler[ExecutionError] | None = None,
    ) -> Handle[Execution]:
        """Run Python code in a stateful context and return a handle for its
        :class:`~asyncsandbox.Execution`; arguments as for
        :meth:`asyncsandbox.Sandbox.run_code` (the callbacks run in the session's event
        loop thread: keep them quick). ``.result()`` raises
        :class:`~asyncsandbox.ExecTimeout` when the code ran past ``timeout``.

        Cancellation: cancelling the handle interrupts the code (killing it, and restarting
        its context, if it ignores the interrupt).
        """
        call = functools.partial(
            self._sandbox.run_code,
            code,
            context=context,
            language=language,
            timeout=timeout,
            env=env,
            max_output_bytes=max_output_bytes,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_result=on_result,
            on_error=on_error,
        )
        return self._launch("run_code", call)

    def create_code_context(
        self, *, cwd: str | None = None, language: str | None = None
    ) -> Handle[CodeContext]:
        """A new code context (see :meth:`asyncsandbox.Sandbox.create_code_context`)."""
        call = functools.partial(self._sandbox.create_code_context, cwd=cwd, language=language)
        return self._launch("create_code_context", call)

    def list_code_contexts(self) -> Handle[builtins.list[CodeContext]]:
        """The sandbox's code contexts (see :meth:`asyncsandbox.Sandbox.list_code_contexts`)."""
        return self._launch("list_code_contexts", self._sandbox.list_code_contexts)

    def restart_code_context(self, context: CodeContext | str) -> Handle[None]:
        """A fresh interpreter for a context (see
        :meth:`asyncsandbox.Sandbox.restart_code_context`)."""
        call = functools.partial(self._sandbox.restart_code_context, context)
        return self._launch("restart_code_context", call)

    def remove_code_context(self, context: CodeContext | str) -> Handle[None]:
        """Kill and forget a context (see :meth:`asyncsandbox.Sandbox.remove_code_context`)."""
        call = functools.partial(self._sandbox.remove_code_context, context)
        return self._launch("remove_code_context", call)

    def read_file(
        self, path: str, *, max_bytes: int = _sandbox.DEFAULT_READ_LIMIT
    ) -> Handle[bytes]:
        """The content of a file (see :meth:`asyncsandbox.Sandbox.read_file`)."""
        return self._launch(
            "read_file", functools.partial(self._sandbox.read_file, path, max_bytes=max_bytes)
        )

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> Handle[None]:
        """Create or replace a file (see :meth:`asyncsandbox.Sandbox.write_file`)."""
        return self._launch(
            "write_file", functools.partial(self._sandbox.write_file, path, data, mode=mode)
        )

    def upload(self, local: str | PathLike[str], remote: str) -> Handle[None]:
        """Copy a local file or directory in (see :meth:`asyncsandbox.Sandbox.upload`)."""
        return self._launch("upload", functools.partial(self._sandbox.upload, local, remote))

    def download(
        self, remote: str, local: str | PathLike[str], *, max_bytes: int | None = None
    ) -> Handle[None]:
        """Copy a file or directory out (see :meth:`asyncsandbox.Sandbox.download`)."""
        return self._launch(
            "download",
            functools.partial(self._sandbox.download, remote, local, max_bytes=max_bytes),
        )

    def info(self) -> Handle[SandboxInfo]:
        """The backend's description of this sandbox (see :meth:`asyncsandbox.Sandbox.info`)."""
        return self._launch("info", self._sandbox.info)

    def reset(self) -> Handle[None]:
        """Return the sandbox to the state it was created in, keeping its id (see
        :meth:`asyncsandbox.Sandbox.reset`).

        Cancellation: the reset is shielded: cancelling the handle does not stop it.
        """
        return self._launch("reset", self._sandbox.reset)

    def snapshot(self, *, keep: bool = False) -> Handle[Snapshot]:
        """Freeze the sandbox's filesystem state (see :meth:`asyncsandbox.Sandbox.snapshot`);
        start sandboxes from it with ``session.sandbox(from_snapshot=...)``."""
        return self._launch("snapshot", functools.partial(self._sandbox.snapshot, keep=keep))

    def fork(self, n: int) -> Handle[list[SyncSandbox]]:
        """``n`` started sandboxes whose filesystem state equals this one's (see
        :meth:`asyncsandbox.Sandbox.fork`)."""

        async def fork() -> list[SyncSandbox]:
            return [SyncSandbox(self._owner, child) for child in await self._sandbox.fork(n)]

        return self._launch("fork", fork)

    def __enter__(self) -> Self:
        self.start().result()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.stop().result()

    def __repr__(self) -> str:
        return f"<SyncSandbox {self.id or '(not started)'} {self.state}>"


@final
class SyncSession:
    """A blocking :class:`asyncsandbox.Session`, usable from any number of threads.

    Every argument but ``async_library`` is that of :class:`asyncsandbox.Session` (and
    checked here):

    :param async_library: the event loop run in the background thread: ``"asyncio"``
        (default) or ``"trio"``.

    Creating it is cheap and starts nothing: the event loop thread and the Session start
    on first use, so a module-level ``session = SyncSession()`` is fine. Use it as a
    context manager, or call :meth:`close`. One left open is closed when it is garbage
    collected, and at interpreter exit, so its sandboxes are removed. So is a
    :class:`SyncSandbox` dropped without :meth:`~SyncSandbox.stop`: once collected (and
    its pending handles are done), it is stopped in the background.
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
        async_library: Literal["asyncio", "trio"] = "asyncio",
    ) -> None:
        check.choice("async_library", async_library, ("asyncio", "trio"))
        self._session = _session.Session(
            backend,
            backend_options=backend_options,
            defaults=defaults,
            limits=limits,
            timeouts=timeouts,
            retries=retries,
            sweep=sweep,
            report_to=report_to,
            metrics_prefix=metrics_prefix,
            warm_pool=warm_pool,
        )
        self._runtime = SyncRuntime(self._session, async_library)
        # A weakref-based atexit hook: runs at interpreter exit, or when this object is
        # collected, whichever comes first, and at most once (close() runs it early).
        self._finalizer = weakref.finalize(self, self._runtime.close)

    @property
    def id(self) -> str:
        """Identifies the underlying Session; its sandboxes carry it as a label."""
        return self._session.id

    @property
    def defaults(self) -> SandboxDefaults:
        """How new sandboxes look (``sandbox(**overrides)`` varies them)."""
        return self._session.defaults

    @property
    def limits(self) -> Limits:
        """The concurrency bounds."""
        return self._session.limits

    @property
    def timeouts(self) -> Timeouts:
        """The deadlines of infrastructure calls."""
        return self._session.timeouts

    @property
    def retries(self) -> RetryPolicy:
        """Retries of retryable infrastructure errors in lifecycle calls."""
        return self._session.retries

    @property
    def warm_pool(self) -> WarmPool | None:
        """The warm pool's settings, if any."""
        return self._session.warm_pool

    @property
    def closed(self) -> bool:
        """True once closed (explicitly, by garbage collection, or at exit)."""
        return self._runtime.closed

    def _launch(
        self, what: str, func: Callable[[], Awaitable[T]], *, keep: object = None
    ) -> Handle[T]:
        owner = self if keep is None else keep
        return Handle(self._runtime.launch(what, func, owner), what, owner)

    def open(self) -> Self:
        """Start the event loop thread and open the Session now (done on first use
        otherwise). Blocks. Raises :class:`~asyncsandbox.SandboxClosed` once closed."""
        self._runtime.get_portal("SyncSession.open()")
        return self

    def sandbox(self, **overrides: Any) -> SyncSandbox:
        """A new, not yet started sandbox (see :meth:`asyncsandbox.Session.sandbox`).

        Returns promptly (it opens the session on first use); the sandbox starts on its
        first use, in the background.
        """

        async def create() -> _sandbox.Sandbox:  # in the event loop thread, like every call
            return self._session.sandbox(**overrides)

        return SyncSandbox(self, self._runtime.call("SyncSession.sandbox()", create))

    def attach(self, sandbox_id: str, **overrides: Any) -> SyncSandbox:
        """The running sandbox ``sandbox_id`` of any session (see
        :meth:`asyncsandbox.Session.attach`). Blocks."""
        call = functools.partial(self._session.attach, sandbox_id, **overrides)
        return SyncSandbox(self, self._runtime.call("SyncSession.attach()", call))

    def judge(
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
    ) -> Handle[JudgeResult]:
        """Judge ``program`` on test ``cases`` in a fresh sandbox; return a handle at once
        (see :meth:`asyncsandbox.Session.judge`).

        Cancellation: cancelling the handle kills the running cases and removes the sandbox.
        """
        call = functools.partial(
            self._session.judge,
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
            **overrides,
        )
        return self._launch("judge", call)

    def run(
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
    ) -> Handle[ExecResult]:
        """Run one command in a fresh sandbox that is removed afterwards; return a handle
        at once (see :meth:`asyncsandbox.Session.run`).

        Cancellation: cancelling the handle kills the command and removes the sandbox.
        """
        call = functools.partial(
            self._session.run,
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            check=check,
            max_output_bytes=max_output_bytes,
            **overrides,
        )
        return self._launch("run", call)

    def list(
        self,
        *,
        tags: Iterable[str] = (),
        status: SandboxStatus | str | Iterable[SandboxStatus | str] | None = None,
        this_session: bool = False,
    ) -> builtins.list[SandboxInfo]:
        """Sandboxes of the backend (see :meth:`asyncsandbox.Session.list`). Blocks."""
        call = functools.partial(
            self._session.list, tags=tags, status=status, this_session=this_session
        )
        return self._runtime.call("SyncSession.list()", call)

    def delete(
        self,
        *,
        tags: Iterable[str] = (),
        ids: Iterable[str] = (),
        status: SandboxStatus | str | Iterable[SandboxStatus | str] | None = None,
    ) -> builtins.list[str]:
        """Remove sandboxes by tag or id (see :meth:`asyncsandbox.Session.delete`). Blocks."""
        call = functools.partial(self._session.delete, tags=tags, ids=ids, status=status)
        return self._runtime.call("SyncSession.delete()", call)

    def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Delete a snapshot (see :meth:`asyncsandbox.Session.delete_snapshot`). Blocks."""
        call = functools.partial(self._session.delete_snapshot, snapshot)
        self._runtime.call("SyncSession.delete_snapshot()", call)

    def gc(self, *, dry_run: bool = False) -> builtins.list[tuple[SandboxInfo | SnapshotInfo, str]]:
        """Remove leftovers of crashed owners (see :meth:`asyncsandbox.Session.gc`). Blocks."""
        call = functools.partial(self._session.gc, dry_run=dry_run)
        return self._runtime.call("SyncSession.gc()", call)

    def statistics(self) -> SessionStatistics:
        """A snapshot of the Session's limits and counters (also after close). Never blocks."""
        # Plain counters read across threads: a snapshot, possibly one update behind.
        return self._session.statistics()

    def metrics(self) -> dict[str, float]:
        """The metrics since the last reset, without reporting them (see
        :meth:`asyncsandbox.Session.metrics`). Blocks briefly (read in the event loop)."""
        check_blocking_allowed("SyncSession.metrics()")
        return self._runtime.call_in_loop(self._session.metrics)

    def log_metrics(self, step: int | None = None, *, reset: bool = True) -> dict[str, float]:
        """Send :meth:`metrics` to the reporters (``report_to``) at training ``step`` and
        return them (see :meth:`asyncsandbox.Session.log_metrics`). Blocks while the
        reporters run."""
        check_blocking_allowed("SyncSession.log_metrics()")
        return self._runtime.call_in_loop(
            functools.partial(self._session.log_metrics, step, reset=reset)
        )

    def close(self) -> None:
        """Cancel pending handles, remove every sandbox of the session, stop the event loop
        thread. Idempotent. Blocks until done.

        Cancellation: pending handles are cancelled first (their commands killed); their
        cleanup and every removal are waited for, each bounded by the Session's timeouts.
        """
        check_blocking_allowed("SyncSession.close()")
        self._finalizer()

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncSession {self._runtime.state} {self._session!r}>"


# Show public objects as `asyncsandbox.sync.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
