"""The warm pool: sandboxes of a session's default spec, started ahead of need, so that
starting one is a hand-over (see :class:`~asyncsandbox.WarmPool`)."""

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
    Sandbox (it is never shared); those older than ``max_age`` are replaced.
    """

    def __init__(self, runtime: Runtime, config: WarmPool, defaults: SandboxDefaults) -> None:
        self._runtime = runtime
        self._config = config
        self._defaults = defaults
        self._ready: deque[tuple[SandboxHandle, float]] = deque()  # (sandbox, created at)
        self._filling = 0
        self._changed = anyio.Event()
        self.hits = 0

    @property
    def ready(self) -> int:
        return len(self._ready)

    def take(self, config: SandboxDefaults) -> SandboxHandle | None:
        """A ready sandbox for ``config``, if it is the pool's spec and one is ready."""
        if not self._ready or config != self._defaults:
            return None
        handle, _ = self._ready.popleft()
        self._changed.set()
        self.hits += 1
        return handle

    async def keep(self) -> None:
        """Fill and refresh the pool until cancelled (the session's task group runs it)."""
        max_age = self._config.max_age
        async with anyio.create_task_group() as tg:
            while True:
                self._changed = changed = anyio.Event()
                now = anyio.current_time()
                while self._ready and max_age is not None and now - self._ready[0][1] >= max_age:
                    tg.start_soon(self._discard, self._ready.popleft()[0])
                for _ in range(self._config.size - len(self._ready) - self._filling):
                    self._filling += 1
                    tg.start_soon(self._fill)
                wake = math.inf
                if self._ready and max_age is not None:
                    wake = self._ready[0][1] + max_age - now
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
            self._ready.append((handle, anyio.current_time()))
        except SandboxError as exc:
            if runtime.state == RuntimeState.OPEN:
                runtime.log.warning("session.pool.fill_failed", error=repr(exc))
                await anyio.sleep(FILL_FAILURE_PAUSE)
        finally:
            self._filling -= 1
            self._changed.set()

    async def _discard(self, handle: SandboxHandle) -> None:
        # Shielded: a pooled sandbox must not outlive its session either. A failure is
        # logged by the runtime; the sweep and the sandbox's lifetime are the backstops.
        with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
            await self._runtime.remove(handle, started=False)
