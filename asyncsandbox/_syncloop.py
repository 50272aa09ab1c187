"""The blocking facade's event loop (:mod:`asyncsandbox.sync`): one thread running an anyio
blocking portal, holding the open :class:`asyncsandbox.Session` and the futures of the
calls launched in it, and the refusal of blocking calls from a thread that runs an event
loop."""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, suppress
from typing import Any, TypeVar

import anyio.lowlevel
from anyio.from_thread import BlockingPortal, start_blocking_portal

from . import _sandbox, _session
from ._errors import SandboxClosed, SandboxError
from ._eventloop import refusal
from ._log import get_logger

__all__ = ("RunningEventLoopError", "SyncRuntime", "check_blocking_allowed")

T = TypeVar("T")

_NEW, _OPEN, _CLOSED = "new", "open", "closed"
_log = get_logger()


class RunningEventLoopError(SandboxError, RuntimeError):
    """A blocking call of :mod:`asyncsandbox.sync` was made from a thread that runs an event
    loop (asyncio or trio). It would block that loop, or deadlock; use
    :class:`asyncsandbox.Session` directly in async code (or call the sync API from a worker
    thread, e.g. ``anyio.to_thread.run_sync``)."""


def check_blocking_allowed(what: str) -> None:
    """Raise :class:`RunningEventLoopError` if this thread runs an event loop: ``what`` (a
    blocking call, as the message names it) would block it."""
    message = refusal(what)
    if message is not None:
        raise RunningEventLoopError(message)


def _as_async(func: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """``func`` as a coroutine function (run in the event loop by a portal)."""

    async def call() -> T:
        return func()

    call.__name__ = getattr(func, "__name__", "call")
    return call


class SyncRuntime:
    """The event loop thread and the open Session.

    It must never reference the SyncSession: the SyncSession's finalizer holds it, and would
    otherwise keep the SyncSession alive forever.
    """

    def __init__(self, session: _session.Session, async_library: str) -> None:
        self.session = session
        self.async_library = async_library
        # Never held while waiting for the event loop thread, except in _open() before any
        # task exists: done-callbacks take it in that thread, so this cannot deadlock.
        self.lock = threading.Lock()
        self.state = _NEW
        self.pid = os.getpid()
        self.portal: BlockingPortal | None = None
        self.portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self.session_cm: AbstractContextManager[_session.Session] | None = None
        self.token: anyio.lowlevel.EventLoopToken | None = None
        # Pending futures, each with the object it keeps alive until it is done (the
        # SyncSandbox it runs in: collecting that would stop the sandbox under it).
        self.futures: dict[Future[Any], object] = {}
        self.orphans_stopped = 0

    def get_portal(self, what: str) -> BlockingPortal:
        check_blocking_allowed(what)
        portal = self.portal
        if self.state == _OPEN and portal is not None and self.pid == os.getpid():
            return portal
        with self.lock:
            if self.state == _CLOSED:
                raise SandboxClosed("the session is closed")
            if self.pid != os.getpid():
                raise SandboxClosed(
                    "this SyncSession was opened in another process (before a fork); "
                    "create a SyncSession in each process"
                )
            if self.state == _NEW:
                self._open()
            assert self.portal is not None
            return self.portal

    def _open(self) -> None:
        portal_cm = start_blocking_portal(self.async_library)
        portal = portal_cm.__enter__()
        # The Session is entered and exited by one task of the portal (its task group must
        # be), which waits in between: wrap_async_context_manager does exactly that.
        session_cm = portal.wrap_async_context_manager(self.session)
        try:
            session_cm.__enter__()
        except BaseException as exc:
            self.state = _CLOSED  # a Session opens only once
            # With the exception, the portal cancels its tasks instead of waiting for them:
            # after a KeyboardInterrupt, the Session's task may still be opening it.
            portal_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.token = portal.call(anyio.lowlevel.current_token)
        self.portal, self.portal_cm, self.session_cm = portal, portal_cm, session_cm
        self.pid = os.getpid()
        self.state = _OPEN

    def call(self, what: str, func: Callable[[], Awaitable[T]]) -> T:
        portal = self.get_portal(what)
        try:
            return portal.call(func)
        except RuntimeError as exc:
            if self.state == _CLOSED:  # closed by another thread since get_portal()
                raise SandboxClosed("the session is closed") from exc
            raise

    def call_in_loop(self, func: Callable[[], T]) -> T:
        """Run the plain function ``func`` where the Session's state lives: in the event
        loop thread while it runs, else here (not opened yet, or closed: no loop to race)."""
        if self.state == _OPEN and self.pid == os.getpid():
            return self.call(f"{getattr(func, '__name__', 'call')}()", _as_async(func))
        return func()

    def launch(self, what: str, func: Callable[[], Awaitable[T]], keep: object) -> Future[T]:
        portal = self.get_portal(f"{what}()")
        launched: list[Future[T]] = []

        async def task() -> T:
            try:
                return await func()
            finally:
                # ``keep`` is let go before the result is set, not after (the future's
                # callbacks run once its waiter is woken): a caller that drops its
                # SyncSandbox after ``.result()`` may have it collected at once.
                if launched:
                    self._forget(launched[0])

        try:
            future = portal.start_task_soon(task, name=f"asyncsandbox.sync:{what}")
        except RuntimeError as exc:
            if self.state == _CLOSED:
                raise SandboxClosed("the session is closed") from exc
            raise
        with self.lock:
            closed = self.state == _CLOSED
            if not closed:
                self.futures[future] = keep
        if closed:
            future.cancel()  # close() took its list of tasks to cancel before this one
        else:
            launched.append(future)
            future.add_done_callback(self._forget)  # if it ended before it was listed
        return future

    def _forget(self, future: Future[Any]) -> None:
        with self.lock:
            self.futures.pop(future, None)

    def stop_orphan(self, sandbox: _sandbox.Sandbox) -> None:
        """Stop ``sandbox``, whose SyncSandbox was collected without being stopped.

        Called by a garbage-collection finalizer: in any thread, the event loop's included,
        at any point of the program. So it neither blocks nor takes a lock; it hands the
        stop to the event loop with its thread-safe, non-blocking ``run_sync_soon``.
        """
        token = self.token
        if token is None or self.state != _OPEN or self.pid != os.getpid():
            return  # never opened, or closing: the close removes every sandbox anyway
        if sandbox.state in ("new", "closed"):
            return  # nothing to remove
        with suppress(RuntimeError):  # the event loop is gone: the session's close removed it
            token.backend_class.run_sync_soon(self._submit_stop, (sandbox,), token.native_token)

    def _submit_stop(self, sandbox: _sandbox.Sandbox) -> None:
        # In the event loop thread: run the stop in the Session's task group.
        try:
            self.session.submit(sandbox.stop(), name="stop a dropped sandbox")
        except SandboxClosed:
            return  # closing: the close removes it
        self.orphans_stopped += 1
        _log.debug("sync.sandbox.dropped", sandbox_id=sandbox.id, session_id=self.session.id)

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self.state == _CLOSED

    def close(self) -> None:
        with self.lock:
            state, self.state = self.state, _CLOSED
            futures, self.futures = self.futures, {}
        if state != _OPEN or self.pid != os.getpid():
            return  # never opened, already closed, or a forked child (the loop is not ours)
        assert self.portal_cm is not None
        assert self.session_cm is not None
        # Cancel first, like Session.aclose() does with its operations: a launched start
        # still waiting for capacity would otherwise create a sandbox after the close.
        for future in list(futures):
            future.cancel()
        try:
            self.session_cm.__exit__(None, None, None)
        finally:
            # Waits for the cancelled tasks' own (shielded, bounded) cleanup, then for the
            # event loop thread to end.
            self.portal_cm.__exit__(None, None, None)
