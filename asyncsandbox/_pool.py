"""Sandboxes ready for their next episode: the warm pool (sandboxes of a session's default
spec started ahead of need, see :class:`~asyncsandbox.WarmPool`) and recycled sandboxes
(released by an episode, reset to the state they were created in, and handed to the next
sandbox of the same settings instead of a new one: those of a recycling warm pool, and
every sandbox whose settings ask for it, ``SandboxDefaults.recyclable``)."""

from __future__ import annotations

import contextlib
import math
from collections import deque

import anyio
import msgspec

from ._config import SandboxDefaults, WarmPool
from ._errors import SandboxError
from ._runtime import Runtime, RuntimeState
from .abc import SandboxHandle, SandboxSpec

FILL_FAILURE_PAUSE = 1.0  # seconds between fills of a backend that keeps failing
MAX_IDLE = 64
"""Recycled sandboxes kept waiting for their next episode, at most (each holds a ``live``
slot, and what the backend keeps of it: the process backend's executor)."""
IDLE = 60.0
"""Seconds a recycled sandbox waits for its next episode before it is removed."""
MAX_AGE = 600.0
"""Seconds after its creation past which a recyclable sandbox is removed rather than reset
(and never more than half its ``max_lifetime``: it must not end under an episode)."""


class Pool:
    """Sandboxes ready for an episode, by their settings, through the runtime.

    Each holds its ``live`` slot; :meth:`take` hands one to exactly one Sandbox (never
    shared). The warm pool's (``config.size`` of ``defaults``) are refilled and replaced
    past ``max_age``; :meth:`recycle` takes a released one back, resets it in the
    background, and keeps it ready (or removes it if the reset failed).
    """

    def __init__(
        self, runtime: Runtime, config: WarmPool | None, defaults: SandboxDefaults
    ) -> None:
        self._runtime = runtime
        self._config = config
        self._defaults = defaults
        self._home = _key(defaults)  # the warm pool's settings
        # By settings: (sandbox, created at, ready since), the last ready at the end.
        self._ready: dict[bytes, deque[tuple[SandboxHandle, float, float]]] = {}
        self._filling = 0
        self._awaiting_fill = 0  # starts waiting for one of the fills under way
        # The recycling warm pool's sandboxes out in an episode, and those its starts are
        # creating: they come back, so they count toward its size (see _keep).
        self._out: set[str] = set()
        self._creating = 0
        self._resetting = 0
        self._resetting_by_key: dict[bytes, int] = {}
        self._born: dict[str, float] = {}  # sandbox id -> when it was created
        self._wanted: dict[bytes, int] = {}  # starts by settings waiting for a slot or one ready
        self._changed = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self.hits = 0

    @property
    def ready(self) -> int:
        return sum(len(queue) for queue in self._ready.values())

    async def obtain(self, config: SandboxDefaults) -> SandboxHandle:
        """A sandbox for ``config``, holding its ``live`` slot: a ready one (the last that
        became ready, or one being reset now: a reset costs less than a creation), else a
        new one. A reusable one (``recyclable``, or the recycling warm pool's) whose slot is
        not free at once also takes the first sandbox of its settings to become ready
        meanwhile, whichever comes first: a burst of episodes larger than ``max_live``
        reuses the sandboxes of the episodes that end, rather than waiting for their
        removal to create new ones. A start of the recycling warm pool that finds none
        ready waits for one of its fills under way, if one is not already another start's:
        the pool's sandboxes are all it needs (its fills and a start's own creation would
        otherwise queue for the same ``lifecycle`` slots, and make twice as many).

        Cancellation: nothing is taken and nothing is left.
        """
        runtime = self._runtime
        spec = runtime.spec(config)  # bad settings are refused before any wait
        key = _key(config)
        while not self._ready.get(key) and self._resetting_by_key.get(key):
            await self._changed.wait()
        warm = self._warm(config)
        handle = self._pop(key)
        if handle is None and warm:
            handle = await self._from_fills(key)
        if handle is None:
            self._make_room()
            live = runtime.live.statistics()
            self._creating += int(warm)
            try:
                if not self._reusable(config) or live.limit is None or live.active < live.limit:
                    handle = await runtime.create(spec)
                else:
                    handle = await self._first_ready_or_created(key, spec)
            finally:
                self._creating -= int(warm)
                self._changed.set()
        if warm:
            self._out.add(handle.id)
        return handle

    async def _from_fills(self, key: bytes) -> SandboxHandle | None:
        """The first of the warm pool's fills under way to be ready, if there is one no
        earlier start waits for (None: there is none)."""
        if self._awaiting_fill >= self._filling:
            return None
        self._awaiting_fill += 1
        try:
            while (handle := self._pop(key)) is None and self._filling:
                await self._changed.wait()
            return handle
        finally:
            self._awaiting_fill -= 1

    def ended(self, handle: SandboxHandle) -> None:
        """The episode of ``handle`` is over: it was recycled (it is being reset) or
        removed."""
        if handle.id in self._out:
            self._out.discard(handle.id)
            self._changed.set()

    async def _first_ready_or_created(self, key: bytes, spec: SandboxSpec) -> SandboxHandle:
        won: list[SandboxHandle] = []

        async def create(scope: anyio.CancelScope) -> None:
            handle = await self._runtime.create(spec)
            if won:  # a ready one came first: this one waits for the next episode
                self._add_new(key, handle)
                self._changed.set()
            else:
                won.append(handle)
                scope.cancel()

        async def reuse(scope: anyio.CancelScope) -> None:
            while (handle := self._pop(key)) is None:
                await self._changed.wait()
            won.append(handle)
            scope.cancel()

        self._wanted[key] = self._wanted.get(key, 0) + 1
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(create, tg.cancel_scope)
                tg.start_soon(reuse, tg.cancel_scope)
        except BaseException:
            for handle in won:  # taken, and its taker is cancelled: nobody will use it
                await self._discard(handle)
            raise
        finally:
            self._wanted[key] -= 1
            if not self._wanted[key]:
                del self._wanted[key]
        return won[0]

    def _pop(self, key: bytes) -> SandboxHandle | None:
        queue = self._ready.get(key)
        if not queue:
            return None
        handle, _, _ = queue.pop()
        self._born.pop(handle.id, None)  # a recycled sandbox tells its age itself
        self._changed.set()
        self.hits += 1
        return handle

    def _add_new(self, key: bytes, handle: SandboxHandle) -> None:
        """A sandbox just created, ready for a start of settings ``key``."""
        self._born[handle.id] = now = anyio.current_time()
        self._ready.setdefault(key, deque()).append((handle, now, now))

    def _warm(self, config: SandboxDefaults) -> bool:
        """Whether ``config`` is the recycling warm pool's."""
        return self._config is not None and self._config.recycle and _key(config) == self._home

    def _reusable(self, config: SandboxDefaults) -> bool:
        warm_or_asked = self._warm(config) or config.recyclable
        return warm_or_asked and self._runtime.backend.capabilities.reset

    def recycle(self, handle: SandboxHandle, config: SandboxDefaults, age: float) -> bool:
        """Take back a released sandbox of ``config``, created ``age`` seconds ago, to
        reset and reuse it; False when it is not for reuse (its settings do not ask for
        it, the backend cannot reset, it is too old, enough are waiting already, another
        sandbox waits for its slot, the session is closing): then the caller removes it."""
        task_group = self._task_group
        if self._warm(config):  # the warm pool replaces its own past their max_age (see _keep)
            max_age = math.inf
        else:
            max_age = MAX_AGE
            if config.max_lifetime is not None:
                max_age = min(max_age, config.max_lifetime / 2)
        runtime = self._runtime
        key = _key(config)
        if (
            not self._reusable(config)
            or task_group is None
            or runtime.state != RuntimeState.OPEN
            or age >= max_age
            or self.ready + self._resetting >= MAX_IDLE
            # A start of other settings waits for its slot: free this one for it.
            or (runtime.live.statistics().waiting and not self._wanted.get(key))
        ):
            return False
        runtime.recycled(handle)
        self._born[handle.id] = anyio.current_time() - age
        self._resetting += 1
        self._resetting_by_key[key] = self._resetting_by_key.get(key, 0) + 1
        task_group.start_soon(self._reset, handle, key)
        return True

    def _make_room(self) -> None:
        """A sandbox is about to be created: if every ``live`` slot is held, and ready
        sandboxes of other settings hold some, remove the one waiting longest."""
        live = self._runtime.live.statistics()
        task_group = self._task_group
        if task_group is None or live.limit is None or live.active < live.limit:
            return
        queues = [q for q in self._ready.values() if q]
        if queues:
            oldest = min(queues, key=lambda q: q[0][2])
            task_group.start_soon(self._discard, oldest.popleft()[0])

    async def keep(self) -> None:
        """Fill, refresh and expire until cancelled (the session's task group runs it)."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            try:
                await self._keep(tg)
            finally:
                self._task_group = None

    async def _keep(self, tg: anyio.abc.TaskGroup) -> None:
        config = self._config
        while True:
            self._changed = changed = anyio.Event()
            now = anyio.current_time()
            wake = math.inf
            for key, queue in self._ready.items():
                for entry in list(queue):
                    handle, born, since = entry
                    expires = since + IDLE
                    if key == self._home and config is not None:
                        # The warm pool's wait for their episode; each is replaced past
                        # max_age (recycled ones come back in any order of age).
                        expires = math.inf if config.max_age is None else born + config.max_age
                    if now >= expires:
                        queue.remove(entry)
                        tg.start_soon(self._discard, handle)
                    else:
                        wake = min(wake, expires)
            if config is not None:
                ready = len(self._ready.get(self._home, ()))
                # A recycling pool's size is all its sandboxes: ready, being reset, or out
                # in an episode (they come back).
                out = len(self._out) + self._creating if config.recycle else 0
                for _ in range(config.size - ready - self._filling - self._resetting - out):
                    self._filling += 1
                    tg.start_soon(self._fill)
            with anyio.move_on_after(wake - now):
                await changed.wait()

    async def discard_all(self) -> None:
        """Remove every ready sandbox (shielded: none may outlive its session)."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for queue in self._ready.values():
                    while queue:
                        tg.start_soon(self._discard, queue.popleft()[0])

    async def _fill(self) -> None:
        runtime = self._runtime
        try:
            handle = await runtime.create(runtime.spec(self._defaults))
            self._add_new(self._home, handle)
        except SandboxError as exc:
            if runtime.state == RuntimeState.OPEN:
                runtime.log.warning("session.pool.fill_failed", error=repr(exc))
                await anyio.sleep(FILL_FAILURE_PAUSE)
        finally:
            self._filling -= 1
            self._changed.set()

    async def _reset(self, handle: SandboxHandle, key: bytes) -> None:
        # Shielded (and bounded by the runtime): the sandbox is either ready again or
        # removed, even when the session closes meanwhile.
        runtime = self._runtime
        try:
            with anyio.CancelScope(shield=True):
                if not await runtime.reset(handle):
                    self._born.pop(handle.id, None)  # removed by the runtime
                elif runtime.state == RuntimeState.OPEN:
                    born = self._born[handle.id]
                    entry = (handle, born, anyio.current_time())
                    self._ready.setdefault(key, deque()).append(entry)
                else:
                    await self._discard(handle)
        finally:
            self._resetting -= 1
            self._resetting_by_key[key] -= 1
            if not self._resetting_by_key[key]:
                del self._resetting_by_key[key]
            self._changed.set()

    async def _discard(self, handle: SandboxHandle) -> None:
        # Shielded: a pooled sandbox must not outlive its session either. A failure is
        # logged by the runtime; the sweep and the sandbox's lifetime are the backstops.
        self._born.pop(handle.id, None)
        with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
            await self._runtime.remove(handle, started=False)


def _key(config: SandboxDefaults) -> bytes:
    """Sandboxes of equal settings are interchangeable (settings hold dicts: not hashable)."""
    return msgspec.json.encode(config)
