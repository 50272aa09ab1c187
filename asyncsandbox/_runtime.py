"""The runtime: the one layer between the public API and a backend.

It owns the backend and applies every policy once, for every backend: the concurrency
limits, the infrastructure deadlines (:class:`Timeouts`), the retries
(:class:`RetryPolicy`), the translation of what escapes the backend contract, the metrics
and the logs. Calls go one way::

    Session ─┐
             ├─> Runtime ─> Backend / SandboxHandle (asyncsandbox.abc)
    Sandbox ─┘

The runtime never calls a :class:`Session` or a :class:`Sandbox`; what they need to learn
(that a sandbox died, how long a start took) comes back as return values and exceptions.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Self, TypeVar

import anyio

from . import _owner
from ._config import Limits, Resources, RetryPolicy, SandboxDefaults, Timeouts
from ._errors import (
    BackendTimeout,
    ExecTimeout,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    RequestNotSent,
    SandboxClosed,
    SandboxError,
)
from ._interpreter._engine import Interpreter
from ._interpreter._models import CodeEventCallback, CodeRequest, Execution
from ._limits import Limiter
from ._metrics import COMMAND_NOT_FOUND, Metrics
from ._models import ExecResult
from ._registry import create_backend
from ._retry import Retrier
from ._util import current_async_library
from .abc import Backend, BackendCapabilities, CodeInterpreter, SandboxHandle, SandboxSpec

T = TypeVar("T")

RESOURCE_LIMITS = ("cpus", "memory_mb", "pids", "disk_mb")


def unenforced_limits(resources: Resources, caps: BackendCapabilities) -> frozenset[str]:
    """The limits ``resources`` asks for that a backend of ``caps`` does not enforce."""
    wanted = {n for n in RESOURCE_LIMITS if getattr(resources, n) is not None}
    return frozenset(wanted - caps.enforced_limits)


class RuntimeState(enum.StrEnum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Runtime:
    """Runs one backend under the policy of one Session (see the module docstring)."""

    def __init__(
        self,
        backend: str | Backend,
        backend_options: Mapping[str, Any],
        *,
        session_id: str,
        limits: Limits,
        timeouts: Timeouts,
        retries: RetryPolicy,
        metrics: Metrics,
        log: Any,
    ) -> None:
        self._backend = backend if isinstance(backend, Backend) else None
        self._backend_options = dict(backend_options)
        self.name = backend.name if isinstance(backend, Backend) else backend
        self._stack = AsyncExitStack()
        self.session_id = session_id
        self.limits = limits
        self.timeouts = timeouts
        self.retries = retries
        self._retry = Retrier(retries, log)
        self.metrics = metrics
        self.log = log
        self.state = RuntimeState.NEW
        policy: dict[str, Any] = {
            "capacity_timeout": limits.capacity_timeout,
            "on_wait": metrics.waited,
            "warn_after": limits.capacity_warning,
            "on_slow_wait": self._slow_capacity_wait,
        }
        self.live = Limiter("live", limits.max_live, **policy)
        self.lifecycle = Limiter("lifecycle", limits.max_lifecycle, **policy)
        self.execs = Limiter("execs", limits.max_execs, **policy)
        self.counts = dict.fromkeys(
            ("started", "removed", "start_failures", "remove_failures", "finished"), 0
        )
        self.counts.update(timed_out=0, failed=0)
        self._creating: set[anyio.CancelScope] = set()
        self._running: dict[str, int] = {}  # live sandbox id -> commands running in it
        self.snapshots: set[str] = set()  # snapshots that go with the session
        self._unenforced_warned: set[frozenset[str]] = set()
        self._not_found_warned: set[str] = set()
        self._services: anyio.abc.TaskGroup | None = None  # tasks serving live sandboxes
        self._interpreters: dict[str, Interpreter] = {}  # by sandbox id

    # -- state ---------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise SandboxClosed("the session is not open yet")
        return self._backend

    async def open(self) -> None:
        """Create the backend (if named) and enter it, on a library it supports."""
        self.state = RuntimeState.OPEN
        if self._backend is None:
            self._backend = create_backend(self.name, self._backend_options)
        library = current_async_library()
        supported = self._backend.capabilities.async_libraries
        if library not in supported:
            raise InvalidArgument(
                f"the {self.name!r} backend does not run on {library} (it supports: "
                f"{', '.join(sorted(supported))}); run it under one of those, or use a "
                f"backend that supports {library} such as 'process' or 'remote'"
            )
        self._backend.use_timeouts(self.timeouts)
        # A backend whose first request never left (RequestNotSent) was left as it was
        # (that is what the error says): it may be entered again.
        backend = self._backend
        await self._retry.run(
            "open", lambda: self._stack.enter_async_context(backend), RequestNotSent
        )
        # Exited before the backend (LIFO): what serves a sandbox (a code interpreter's
        # runner) goes before the backend that runs it.
        self._services = await self._stack.enter_async_context(anyio.create_task_group())

    async def close(self) -> None:
        """Close the backend (its sandboxes must be removed first). Not shielded: a
        backend may hold a task group entered before it, which must exit outside scopes
        opened later; ``Backend.aclose`` shields what it must."""
        self.state = RuntimeState.CLOSED
        if self._services is not None:
            self._services.cancel_scope.cancel()
        await self._stack.aclose()

    def check_open(self) -> None:
        if self.state != RuntimeState.OPEN:
            raise SandboxClosed(
                "the session is not open; use `async with Session(...) as session`"
                if self.state == RuntimeState.NEW
                else "the session is closed"
            )

    def begin_close(self) -> None:
        """No sandbox may be created from now on: starts still waiting give up."""
        self.state = RuntimeState.CLOSING
        for scope in list(self._creating):
            scope.cancel()

    # -- sandboxes -----------------------------------------------------------------------

    def spec(self, config: SandboxDefaults) -> SandboxSpec:
        """What the backend is asked to create for ``config``."""
        caps = self.backend.capabilities
        if config.network not in caps.network_modes:
            raise InvalidArgument(
                f"the {self.name!r} backend does not support network={config.network!r} "
                f"(supported: {', '.join(sorted(caps.network_modes))})"
            )
        if config.from_snapshot is not None:
            self.check_capability("snapshots")
        unenforced = unenforced_limits(config.resources, caps)
        if unenforced and not caps.best_effort_limits:
            names = ", ".join(sorted(unenforced))
            raise InvalidArgument(
                f"the {self.name!r} backend cannot enforce {names} here, and a limit asked "
                f"for is never silently ignored: {caps.limits_note or 'it does not have them'}"
                f"; or ask for no such limit (Resources({'=None, '.join(sorted(unenforced))}"
                "=None))"
            )
        if unenforced and unenforced not in self._unenforced_warned:
            self._unenforced_warned.add(unenforced)
            self.log.warning(
                "sandbox.limits.unenforced",
                limits=sorted(unenforced),
                hint=f"best-effort limits: the {self.name} backend does not enforce them here"
                + (f" ({caps.limits_note})" if caps.limits_note else ""),
            )
        return SandboxSpec(
            image=config.image,
            env=config.env,
            workdir=config.workdir,
            resources=config.resources,
            network=config.network,
            labels=_owner.runtime_labels(
                session_id=self.session_id, tags=config.tags, max_lifetime=config.max_lifetime
            ),
            max_lifetime=config.max_lifetime,
            snapshot=config.from_snapshot,
        )

    def check_capability(self, name: str) -> None:
        """Raise :class:`InvalidArgument` unless the backend has ``capabilities.<name>``."""
        if not getattr(self.backend.capabilities, name):
            raise InvalidArgument(
                f"the {self.name!r} backend does not support {name} here "
                f"(its isolation: {self.backend.capabilities.isolation})"
            )

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create a sandbox under the limits; it holds a ``live`` slot until :meth:`remove`.

        Cancellation: nothing is left (the backend undoes a half-created sandbox); so too
        when the session begins closing while this waits.
        """
        handle: SandboxHandle | None = None
        with anyio.CancelScope() as scope:
            self._creating.add(scope)
            try:
                await self.live.acquire()
                try:
                    async with self.lifecycle.slot():
                        self.check_open()  # the session may have closed while we waited
                        handle = await self.call(
                            "create",
                            lambda: self.backend.create(spec),
                            timeout=self.timeouts.create,
                        )
                except BaseException:
                    self.live.release()
                    self.counts["start_failures"] += 1
                    raise
            finally:
                self._creating.discard(scope)
        if handle is None:
            raise SandboxClosed("the session closed while the sandbox was starting")
        if self.state != RuntimeState.OPEN:
            # Created just as the session began closing, maybe after it listed what to
            # remove: remove it here (shielded: it must not outlive the session).
            with anyio.CancelScope(shield=True):
                await self.remove(handle)
            raise SandboxClosed("the session closed while the sandbox was starting")
        return handle

    def adopt(self, handle: SandboxHandle, startup_seconds: float) -> None:
        """Count ``handle`` (made by :meth:`create`, maybe long ago for a pool) as started."""
        self._running.setdefault(handle.id, 0)
        self.counts["started"] += 1
        self.metrics.started(startup_seconds)
        self.log.debug("sandbox.started", sandbox_id=handle.id, seconds=round(startup_seconds, 4))

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        """A handle to a running sandbox of any session, by id (``SandboxNotFound`` if it
        is gone). It takes no ``live`` slot: it was counted where it was created."""
        self.check_open()
        async with self.lifecycle.slot():
            return await self.call(
                "attach", lambda: self.backend.attach(sandbox_id), timeout=self.timeouts.operation
            )

    async def remove(
        self, handle: SandboxHandle, *, started: bool = True, attached: bool = False
    ) -> None:
        """Remove a sandbox and release its ``live`` slot, even if the removal fails.
        ``started``: it was handed to a Sandbox (not a pooled one never used).
        ``attached``: it came from :meth:`attach` (it holds no slot here).

        Cancellation: call it shielded; it is bounded by ``Timeouts.remove``.
        """
        try:
            await self.drop_interpreter(handle)
            async with self.lifecycle.slot(bounded=False):
                await self.call("remove", handle.remove, timeout=self.timeouts.remove)
        except Exception as exc:
            if started:
                self.counts["remove_failures"] += 1
            self.log.warning("sandbox.remove.failed", sandbox_id=handle.id, error=repr(exc))
            raise
        else:
            if started:
                self.counts["removed"] += 1
            self.log.debug("sandbox.removed", sandbox_id=handle.id)
        finally:
            self._running.pop(handle.id, None)
            if not attached:
                self.live.release()

    async def remove_by_id(self, sandbox_id: str) -> None:
        """Remove a sandbox of any session, by id (``SandboxNotFound`` if it is gone)."""
        async with self.lifecycle.slot():
            handle = await self.call(
                "attach", lambda: self.backend.attach(sandbox_id), timeout=self.timeouts.operation
            )
            await self.call("remove", handle.remove, timeout=self.timeouts.remove)

    def recycled(self, handle: SandboxHandle) -> None:
        """Count a started sandbox as ended for its episode, though it stays alive (and
        keeps its ``live`` slot) to be reset and handed to the next one."""
        self._running.pop(handle.id, None)
        self.counts["removed"] += 1
        self.log.debug("sandbox.released", sandbox_id=handle.id)

    # -- the code interpreter ------------------------------------------------------------

    def code_interpreter(self, handle: SandboxHandle, config: SandboxDefaults) -> CodeInterpreter:
        """Who runs code in ``handle``'s sandbox: the handle itself where its sandbox runs
        elsewhere (a :class:`CodeInterpreter`), else the sandbox's own interpreter (made on
        first use, over :meth:`SandboxHandle.interact`)."""
        if isinstance(handle, CodeInterpreter):
            return handle
        interpreter = self._interpreters.get(handle.id)
        if interpreter is None:
            if not self.backend.capabilities.interactive or self._services is None:
                raise InvalidArgument(
                    f"the {self.name!r} backend cannot run code (run_code needs a backend "
                    "that starts interactive processes in its sandboxes, such as 'process', "
                    "'docker' or 'remote')"
                )
            interpreter = Interpreter(
                handle,
                services=self._services,
                workdir=config.workdir,
                env=config.env,
                cleanup=self.timeouts.cleanup,
                start_timeout=self.timeouts.operation,
            )
            self._interpreters[handle.id] = interpreter
        return interpreter

    async def run_code(
        self,
        handle: SandboxHandle,
        config: SandboxDefaults,
        request: CodeRequest,
        on_event: CodeEventCallback,
    ) -> Execution:
        """Run code in a sandbox under the ``execs`` budget; count it, log it, and raise
        :class:`ExecTimeout` (carrying the execution) when it ran past its timeout.

        Cancellation: the code is interrupted (killed if it does not stop) first.
        """
        target = self.code_interpreter(handle, config)
        async with self.slot(handle.id):
            try:
                execution = await self.once(
                    "run_code", lambda: target.run_code(request, on_event=on_event)
                )
            except SandboxError as exc:
                self._code_finished(handle.id, None, exc)
                raise
        self._code_finished(handle.id, execution, None)
        if execution.timed_out:
            raise ExecTimeout(
                f"code timed out after {request.timeout}s (context {request.context!r})",
                _as_result(execution),
                execution=execution,
            )
        return execution

    async def code_call(
        self,
        handle: SandboxHandle,
        config: SandboxDefaults,
        call: Callable[[CodeInterpreter], Awaitable[T]],
    ) -> T:
        """A context operation (create, list, restart, remove), its errors translated."""
        target = self.code_interpreter(handle, config)
        return await self.once("code_context", lambda: call(target))

    async def drop_interpreter(self, handle: SandboxHandle) -> None:
        """Stop the sandbox's interpreter, if it has one: its contexts end with the episode
        (before the sandbox is removed, or reset for the next one).

        Cancellation: shielded, bounded by ``Timeouts.cleanup``.
        """
        interpreter = self._interpreters.pop(handle.id, None)
        if interpreter is not None:
            await interpreter.aclose()

    def _code_finished(
        self, sandbox_id: str, execution: Execution | None, error: BaseException | None
    ) -> None:
        timed_out = execution is not None and execution.timed_out
        key = "timed_out" if timed_out else "failed" if error is not None else "finished"
        self.counts[key] += 1
        self.metrics.exec_finished(
            sandbox=sandbox_id,
            returncode=None if execution is None else int(execution.error is not None),
            duration=None if execution is None else execution.duration,
            timed_out=timed_out,
            infrastructure=isinstance(error, InfrastructureError),
        )
        if execution is not None:
            self.log.debug(
                "sandbox.run_code.finished",
                sandbox_id=sandbox_id,
                context=execution.context_id,
                error=None if execution.error is None else execution.error.name,
                seconds=round(execution.duration, 4),
                timed_out=timed_out,
                restarted=execution.restarted,
            )

    # -- state ---------------------------------------------------------------------------

    async def snapshot(self, handle: SandboxHandle, *, keep: bool) -> str:
        """Snapshot a sandbox; unless ``keep``, the snapshot goes with the session.

        Retried only when the request never reached the backend (each attempt it received
        would make another snapshot); bounded by ``Timeouts.create``, retries included.
        Cancellation: the backend leaves nothing.
        """
        self.check_capability("snapshots")
        started = anyio.current_time()
        # One that goes with the session carries its owner's labels: if the owner crashes,
        # the next gc finds it by them.
        labels = (
            None
            if keep
            else _owner.runtime_labels(session_id=self.session_id, tags=(), max_lifetime=None)
        )
        with anyio.move_on_after(_deadline(self.timeouts.create)) as scope:
            snapshot_id = await self.once("snapshot", lambda: handle.snapshot(labels=labels))
        if scope.cancelled_caught:
            raise BackendTimeout("snapshot", self.timeouts.create or 0)
        if not keep:
            self.snapshots.add(snapshot_id)
        seconds = anyio.current_time() - started
        self.metrics.timed("snapshot", seconds)
        self.log.debug("sandbox.snapshot", sandbox_id=handle.id, snapshot_id=snapshot_id)
        return snapshot_id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot (shielded; bounded by ``Timeouts.remove``)."""
        self.snapshots.discard(snapshot_id)
        with anyio.CancelScope(shield=True):
            await self.call(
                "delete_snapshot",
                lambda: self.backend.delete_snapshot(snapshot_id),
                timeout=self.timeouts.remove,
            )

    async def reset(self, handle: SandboxHandle) -> bool:
        """Reset a released sandbox for its next episode; if that fails (or takes longer
        than ``Timeouts.remove``), remove it instead and return False.

        Cancellation: call it shielded.
        """
        try:
            await self.reset_once(handle)
        except Exception:  # noqa: BLE001 - any failure: the sandbox is not reused
            with contextlib.suppress(SandboxError):
                await self.remove(handle, started=False)
            return False
        return True

    async def reset_once(self, handle: SandboxHandle) -> None:
        """Reset a sandbox (bounded by ``Timeouts.remove``, retried only when the request
        never reached the backend), counted in the metrics; raise what the reset raised
        (:class:`BackendTimeout` past its deadline).

        Cancellation: call it shielded.
        """
        started = anyio.current_time()
        try:
            with anyio.fail_after(_deadline(self.timeouts.remove)):
                await self.once("reset", handle.reset)
        except Exception as exc:
            self.metrics.reset_failures += 1
            self.log.warning("sandbox.reset.failed", sandbox_id=handle.id, error=repr(exc))
            if isinstance(exc, TimeoutError):  # fail_after's: ours, typed
                raise BackendTimeout("reset", _deadline(self.timeouts.remove)) from None
            raise
        self.metrics.timed("reset", anyio.current_time() - started)

    # -- calls ---------------------------------------------------------------------------

    async def call(
        self, name: str, make: Callable[[], Awaitable[T]], *, timeout: float | None
    ) -> T:
        """An idempotent infrastructure call, with its deadline (each attempt's) and
        retries of every ``retryable`` error."""

        async def attempt() -> T:
            with anyio.move_on_after(timeout if timeout is not None else float("inf")):
                return await self.translate(make())
            assert timeout is not None
            raise BackendTimeout(name, timeout)

        return await self._retry.run(name, attempt, InfrastructureError)

    async def once(self, name: str, make: Callable[[], Awaitable[T]]) -> T:
        """A call that must not be repeated once the backend received it (a snapshot, a
        judgement, code run): retried only when it never reached the backend
        (:class:`RequestNotSent`)."""
        return await self._retry.run(name, lambda: self.translate(make()), RequestNotSent)

    def slot(self, sandbox_id: str) -> _Slot:
        """An ``execs`` slot for a command or file transfer in the sandbox ``sandbox_id``
        (an async context manager).

        Cancellation: a cancelled wait takes no slot.
        """
        return _Slot(self.execs, self._running, sandbox_id)

    async def launch(self, name: str, make: Callable[[], Awaitable[T]]) -> T:
        """A command or file operation in a sandbox (under its :meth:`slot`): retried only
        when it never ran: the backend could not launch it (:class:`LaunchError`), or the
        request never reached the backend (:class:`RequestNotSent`)."""
        # The first try outside the retry loop: every command and file call comes here.
        try:
            return await self.translate(make())
        except _NEVER_RAN as exc:
            failed = exc
        return await self._retry.run(
            name, lambda: self.translate(make()), _NEVER_RAN, failed=failed
        )

    @asynccontextmanager
    async def stream(
        self, name: str, make: Callable[[], AbstractAsyncContextManager[AsyncIterator[bytes]]]
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A backend's chunk stream (an archive), its errors translated like any call's;
        opening it is retried when the request never reached the backend
        (:class:`RequestNotSent`)."""

        async def enter() -> tuple[AbstractAsyncContextManager[Any], AsyncIterator[bytes]]:
            context = make()
            return context, await self.translate(context.__aenter__())

        context, chunks = await self._retry.run(name, enter, RequestNotSent)
        try:
            yield _Translated(self, chunks)
        except BaseException as exc:
            if not await context.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await context.__aexit__(None, None, None)

    async def translate(self, awaitable: Awaitable[T]) -> T:
        """Await a backend call, turning what escapes the contract into our errors."""
        try:
            return await awaitable
        except (StopAsyncIteration, SandboxError):
            raise  # the end of a chunk stream; errors of the tree
        except Exception as exc:
            self.log.error("backend.unexpected_error", error=repr(exc))
            raise InfrastructureError(f"the {self.name} backend failed: {exc!r}") from exc

    # -- accounting ----------------------------------------------------------------------

    def exec_finished(
        self, sandbox_id: str | None, result: ExecResult | None, error: BaseException | None
    ) -> None:
        """Count a command's end: its result, or the error it ended with."""
        timed_out = result is not None and result.timed_out
        key = "timed_out" if timed_out else "failed" if error is not None else "finished"
        self.counts[key] += 1
        self.metrics.exec_finished(
            sandbox=sandbox_id,
            returncode=None if result is None else result.returncode,
            duration=None if result is None else result.duration,
            timed_out=timed_out,
            infrastructure=isinstance(error, InfrastructureError),
        )
        if result is not None and not timed_out and result.returncode in COMMAND_NOT_FOUND:
            self._warn_not_found(result)

    def _warn_not_found(self, result: ExecResult) -> None:
        """Warn, once per program, of a command the sandbox could not run: a reward
        computed from such exit statuses is 0 for every completion, silently."""
        program = result.argv[0]
        if program in self._not_found_warned:
            return
        self._not_found_warned.add(program)
        self.log.warning(
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

    def _slow_capacity_wait(self, limiter: Limiter, waited: float) -> None:
        """A task has waited ``waited`` seconds for a slot of ``limiter``: say why."""
        stats = limiter.statistics()
        cause = _CAPACITY_CAUSES.get(limiter.name, "")
        if limiter.name == "live":
            idle = sum(1 for running in self._running.values() if not running)
            cause = cause.format(idle=idle, live=len(self._running))
        timeout = self.limits.capacity_timeout
        self.log.warning(
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


_NEVER_RAN = (LaunchError, RequestNotSent)
"""What says that a command or file operation never ran: running it again is safe."""


def _deadline(seconds: float | None) -> float:
    return math.inf if seconds is None else seconds


def _as_result(execution: Execution) -> ExecResult:
    """A timed-out ``run_code`` call seen as a command, for :class:`ExecTimeout`'s
    ``result``: its output, and 130 (stopped at the interrupt) or 137 (killed)."""
    killed = execution.restarted
    return ExecResult(
        argv=("run_code", execution.context_id),
        returncode=137 if killed else 130,
        stdout="".join(execution.logs.stdout).encode(),
        stderr="".join(execution.logs.stderr).encode(),
        duration=execution.duration,
        timed_out=True,
        stdout_truncated=execution.logs.stdout_truncated,
        stderr_truncated=execution.logs.stderr_truncated,
        signal=9 if killed else 2,
    )


class _Translated:
    """A backend's chunk iterator whose errors are translated like any backend call."""

    def __init__(self, runtime: Runtime, chunks: AsyncIterator[bytes]) -> None:
        self._runtime = runtime
        self._chunks = chunks

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        return await self._runtime.translate(anext(self._chunks))


_CAPACITY_CAUSES: Mapping[str, str] = {
    "live": (
        "likely cause: sandboxes that are never stopped (e.g. `session.sandbox().exec(...)` "
        "in a reward function called every step) keep their slot until the session closes "
        "({idle} of the {live} live sandboxes run no command right now). Stop each sandbox "
        "when its episode ends (`async with session.sandbox()`, `stop()`), use "
        "`session.run()` for one-off commands, or raise Limits.max_live"
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


class _Slot:
    """:meth:`Runtime.slot`'s context manager (a class: every command passes here, and a
    generator's context manager costs several times as much)."""

    __slots__ = ("_execs", "_id", "_running")

    def __init__(self, execs: Limiter, running: dict[str, int], sandbox_id: str) -> None:
        self._execs = execs
        self._running = running
        self._id = sandbox_id

    async def __aenter__(self) -> None:
        await self._execs.acquire()
        self._running[self._id] = self._running.get(self._id, 0) + 1

    async def __aexit__(self, *exc_info: object) -> None:
        if self._id in self._running:
            self._running[self._id] -= 1
        self._execs.release()
