"""The life of one :class:`~asyncsandbox.Sandbox`, which its public methods lead: its state
(it only moves forward), its backend handle once started, how its calls ended (the sandbox
died, or an infrastructure failure was seen: then it is never recycled), and the cancel
scopes of the calls a stop ends."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import anyio

from ._config import SandboxDefaults
from ._errors import InfrastructureError, SandboxClosed, SandboxDied
from .abc import SandboxHandle

if TYPE_CHECKING:
    from ._pool import Pool
    from ._runtime import Runtime

__all__ = ("Lifecycle", "SandboxOwner", "SandboxState")

T = TypeVar("T")


class SandboxState(enum.StrEnum):
    """Where a :class:`Sandbox` is in its life; it only moves forward through these."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    CLOSED = "closed"


_NEW, _STARTING, _RUNNING, _STOPPING, _CLOSED = SandboxState


@dataclass(frozen=True)
class SandboxOwner:
    """What a Sandbox gets from its Session: the runtime it calls, the set of the session's
    started sandboxes (a sandbox's life enters it when started and leaves it when stopped,
    so that the session can stop what is left), and the warm pool it may take a started
    sandbox from."""

    runtime: Runtime
    sandboxes: set[Lifecycle]
    pool: Pool | None


class Lifecycle:
    """A sandbox's start, stop and state; every call of its Sandbox gets the sandbox's
    handle from :meth:`live_handle` (which starts it on first use) and runs
    :meth:`watched`.

    :param attached: a running sandbox of another session (``Session.attach``): it stays
        its creator's, so our session's close leaves it, but :meth:`stop` removes it.
    """

    def __init__(
        self, owner: SandboxOwner, config: SandboxDefaults, attached: SandboxHandle | None
    ) -> None:
        self._runtime = runtime = owner.runtime
        self._pool = owner.pool
        self._sandboxes = owner.sandboxes
        self._config = config
        self.attached = attached is not None
        self.state = SandboxState.NEW if attached is None else SandboxState.RUNNING
        self.handle: SandboxHandle | None = attached
        """The backend's handle while started."""
        self.id: str | None = None if attached is None else attached.id
        """The backend's id, once started (kept after it is stopped)."""
        self._start_lock = anyio.Lock()
        self._dead: SandboxDied | None = None
        self._failed = False  # an infrastructure failure was seen: never recycled
        self._scopes: set[anyio.CancelScope] = set()
        self.log = runtime.log
        """The runtime's logger, bound to the sandbox's id once started."""
        self.started_at: float | None = None
        self.startup_seconds: float | None = None

    async def start(self) -> None:
        """See :meth:`asyncsandbox.Sandbox.start`.

        Cancellation: a cancelled start leaves nothing behind and can be retried.
        """
        if self.state == _RUNNING:
            return
        async with self._start_lock:
            if self.state == _RUNNING:
                return
            if self.state in (_STOPPING, _CLOSED):
                raise SandboxClosed("the sandbox was stopped")
            self.state = _STARTING
            runtime, pool = self._runtime, self._pool
            started = anyio.current_time()
            try:
                # stop() cancels this scope: a start waiting for capacity gives up at once.
                with self.stoppable():
                    runtime.check_open()
                    # A hand-over from the warm pool, else a new sandbox.
                    if pool is not None:
                        handle = await pool.obtain(self._config)
                    else:
                        handle = await runtime.create(runtime.spec(self._config))
                    self.handle = handle
            except BaseException:
                if self.state == _STARTING:
                    self.state = _NEW
                raise
            if self.handle is None:
                raise SandboxClosed("the sandbox was stopped while it started")
            self.startup_seconds = anyio.current_time() - started
            self.started_at = time.time()
            runtime.adopt(self.handle, self.startup_seconds)
            self._sandboxes.add(self)
            if self.state == _STARTING:  # else stop() is waiting for this lock to remove it
                self.state = _RUNNING
            self.id = self.handle.id
            self.log = self.log.bind(sandbox_id=self.id)

    async def stop(self) -> None:
        """See :meth:`asyncsandbox.Sandbox.stop`.

        Cancellation: runs shielded, bounded by ``Timeouts.remove``.
        """
        if self.state == _CLOSED:
            return
        self.state = _STOPPING
        for scope in list(self._scopes):
            scope.cancel()
        # Shielded: the sandbox must go even when our caller is being cancelled.
        with anyio.CancelScope(shield=True):
            async with self._start_lock:  # a concurrent start() finishes (or fails) first
                handle, self.handle = self.handle, None
                self.state = _CLOSED
                if handle is not None:
                    try:
                        # Its code contexts end with the episode, recycled or not.
                        await self._runtime.drop_interpreter(handle)
                        if self.attached:
                            await self._runtime.remove(handle, attached=True)
                        elif not self._recycled(handle):
                            await self._runtime.remove(handle)
                    finally:
                        self._sandboxes.discard(self)
                        if self._pool is not None:
                            self._pool.ended(handle)

    async def reset(self) -> None:
        """See :meth:`asyncsandbox.Sandbox.reset`.

        Cancellation: runs shielded, bounded by ``Timeouts.remove``.
        """
        handle = await self.live_handle()
        self._runtime.check_capability("reset")
        # Shielded: a reset left half done would hand the next call a sandbox neither
        # fresh nor as it was.
        with anyio.CancelScope(shield=True):
            try:
                # Its code contexts are processes of the sandbox: they end with the reset.
                await self._runtime.drop_interpreter(handle)
                with self.watched():
                    await self._runtime.reset_once(handle)
            except BaseException:
                self._failed = True  # in no known state: never recycled
                raise

    def _recycled(self, handle: SandboxHandle) -> bool:
        pool = self._pool
        if pool is None or self._dead is not None or self._failed or self.started_at is None:
            return False
        age = time.time() - self.started_at + (self.startup_seconds or 0.0)
        return pool.recycle(handle, self._config, age)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self.state in (_STOPPING, _CLOSED)

    async def live_handle(self) -> SandboxHandle:
        """The handle of the running sandbox, started first if it is not; raise
        :class:`~asyncsandbox.SandboxDied` once it died, :class:`~asyncsandbox.SandboxClosed`
        once stopped.

        Cancellation: as for :meth:`start`.
        """
        if self._dead is not None:
            raise self._dead
        if self.state != _RUNNING:
            await self.start()
        handle = self.handle
        if handle is None:
            raise SandboxClosed("the sandbox was stopped")
        return handle

    def stoppable(self, deadline: float = math.inf) -> _Stoppable:
        """A cancel scope (with ``deadline``) that :meth:`stop` cancels, for as long as the
        block runs."""
        return _Stoppable(self._scopes, deadline)

    async def guard(self, call: Awaitable[T]) -> T:
        """A call of this sandbox through the runtime, :meth:`watched`.

        Cancellation: that of ``call``.
        """
        with self.watched():
            return await call

    def watched(self) -> _Watched:
        """Remember this sandbox's death, and any infrastructure failure (a sandbox that
        had one is never recycled), raised by what runs inside."""
        return _Watched(self)

    def _raised(self, exc: BaseException) -> None:
        if isinstance(exc, SandboxDied):
            if self._dead is None:
                self._dead = exc
                self.log.warning("sandbox.died", reason=exc.reason)
        elif isinstance(exc, InfrastructureError):
            self._failed = True


class _Watched:
    """:meth:`Lifecycle.watched`'s context manager (a class: every call passes here, and a
    generator's context manager costs several times as much)."""

    __slots__ = ("_life",)

    def __init__(self, life: Lifecycle) -> None:
        self._life = life

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None:
            self._life._raised(exc)


class _Stoppable:
    """A cancel scope entered in a set of scopes while it is entered (a plain context
    manager: its ``__exit__`` says it may swallow its own cancellation, as the scope's)."""

    def __init__(self, scopes: set[anyio.CancelScope], deadline: float) -> None:
        self._scopes = scopes
        self._scope = anyio.CancelScope(deadline=deadline)

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        self._scopes.add(scope)
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        self._scopes.discard(self._scope)
        return self._scope.__exit__(exc_type, exc_val, exc_tb)
