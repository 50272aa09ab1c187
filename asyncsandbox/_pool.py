"""The warm pool: sandboxes of a session's default spec, started ahead of need, so that
starting one is a hand-over; with ``recycle``, stopped ones come back to it after a reset
(see :class:`~asyncsandbox.WarmPool`)."""

from __future__ import annotations

import contextlib
import math
from collections import deque

import anyio

from ._config import SandboxDefaults, WarmPool
from ._errors import SandboxError
from ._runtime import Runtime, RuntimeState
from .abc import SandboxHandle

FILL_FAILURE_PAUSE = 1.0  # seconds between fills of a backend that keeps failing


class Pool:
    """Keeps ``config.size`` sandboxes of ``defaults`` ready, through the runtime.

    Each pooled sandbox holds its ``live`` slot; :meth:`take` hands it to exactly one
    Sandbox (it is never shared); those older than ``max_age`` are replaced. With
    ``config.recycle``, :meth:`recycle` takes a released one back: it is reset in the
    background and ready again, or removed if the reset failed.
    """

    def __init__(self, runtime: Runtime, config: WarmPool, defaults: SandboxDefaults) -> None:
        self._runtime = runtime
        self._config = config
        self._defaults = defaults
        self._ready: deque[tuple[SandboxHandle, float]] = deque()  # (sandbox, created at)
        self._filling = 0
        self._resetting = 0
        self._born: dict[str, float] = {}  # sandbox id -> when it was created
        self._changed = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self.hits = 0

    @property
    def ready(self) -> int:
        return len(self._ready)

    def take(self, config: SandboxDefaults) -> SandboxHandle | None:
        """A ready sandbox for ``config``, if it is the pool's spec and one is ready."""
        if not self._ready or config != self._defaults:
            return None
        handle, _ = self._ready.popleft()
        self._born.pop(handle.id, None)  # a recycled sandbox tells its age itself
        self._changed.set()
        self.hits += 1
        return handle

    def recycle(self, handle: SandboxHandle, config: SandboxDefaults, age: float) -> bool:
        """Take back a released sandbox of ``config``, created ``age`` seconds ago, to
        reset and reuse it; False when it is not for the pool (another spec, no recycling,
        the session closing): then the caller removes it."""
        task_group = self._task_group
        if (
            not self._config.recycle
            or config != self._defaults
            or task_group is None
            or self._runtime.state != RuntimeState.OPEN
        ):
            return False
        self._runtime.recycled(handle)
        self._born[handle.id] = anyio.current_time() - age
        self._resetting += 1
        task_group.start_soon(self._reset, handle)
        return True

    async def keep(self) -> None:
        """Fill and refresh the pool until cancelled (the session's task group runs it)."""
        max_age = self._config.max_age
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            try:
                await self._keep(tg, max_age)
            finally:
                self._task_group = None

    async def _keep(self, tg: anyio.abc.TaskGroup, max_age: float | None) -> None:
        while True:
            self._changed = changed = anyio.Event()
            now = anyio.current_time()
            if max_age is not None:  # recycled sandboxes come back in any order of age
                for entry in [e for e in self._ready if now - e[1] >= max_age]:
                    self._ready.remove(entry)
                    tg.start_soon(self._discard, entry[0])
            wanted = self._config.size - len(self._ready) - self._filling - self._resetting
            for _ in range(wanted):
                self._filling += 1
                tg.start_soon(self._fill)
            wake = math.inf
            if self._ready and max_age is not None:
                wake = min(born for _, born in self._ready) + max_age - now
            with anyio.move_on_after(wake):
                await changed.wait()

    async def discard_all(self) -> None:
        """Remove every ready sandbox (shielded: none may outlive its session)."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                while self._ready:
                    tg.start_soon(self._discard, self._ready.popleft()[0])

    async def _fill(self) -> None:
        runtime = self._runtime
        try:
            handle = await runtime.create(runtime.spec(self._defaults))
            self._born[handle.id] = now = anyio.current_time()
            self._ready.append((handle, now))
        except SandboxError as exc:
            if runtime.state == RuntimeState.OPEN:
                runtime.log.warning("session.pool.fill_failed", error=repr(exc))
                await anyio.sleep(FILL_FAILURE_PAUSE)
        finally:
            self._filling -= 1
            self._changed.set()

    async def _reset(self, handle: SandboxHandle) -> None:
        # Shielded (and bounded by the runtime): the sandbox is either ready again or
        # removed, even when the session closes meanwhile.
        runtime = self._runtime
        try:
            with anyio.CancelScope(shield=True):
                if not await runtime.reset(handle):
                    self._born.pop(handle.id, None)  # removed by the runtime
                elif runtime.state == RuntimeState.OPEN:
                    self._ready.append((handle, self._born[handle.id]))
                else:
                    await self._discard(handle)
        finally:
            self._resetting -= 1
            self._changed.set()

    async def _discard(self, handle: SandboxHandle) -> None:
        # Shielded: a pooled sandbox must not outlive its session either. A failure is
        # logged by the runtime; the sweep and the sandbox's lifetime are the backstops.
        self._born.pop(handle.id, None)
        with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
            await self._runtime.remove(handle, started=False)
