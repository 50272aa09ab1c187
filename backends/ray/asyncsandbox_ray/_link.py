"""The driver's side of the calls to a node's agent: awaiting Ray's futures on asyncio or
trio, and the link that carries a backend's calls to one node, many to a Ray call."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import sniffio

from asyncsandbox import BackendUnavailable

from ._node import POLL_WAIT

__all__ = ("CALL_GRACE", "Link", "future_result", "in_daemon_thread", "result")

CALL_GRACE = 15.0
"""How long past its own wait a call to a node may take before the node counts as dead."""
COALESCE = 4
"""Event-loop turns a link waits before it sends: the callers its last answers woke make
their next calls meanwhile, and those go in one exchange."""


async def result(ref: Any, deadline: float | None) -> Any:
    """Await a Ray object ref on asyncio or trio (through its concurrent future)."""
    return await future_result(ref.future(), deadline)


async def future_result(future: concurrent.futures.Future[Any], deadline: float | None) -> Any:
    """Await a concurrent future on asyncio or trio."""
    with anyio.fail_after(deadline):
        if sniffio.current_async_library() == "asyncio":
            return await asyncio.wrap_future(future)
        import trio

        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future.add_done_callback(lambda _: token.run_sync_soon(done.set))
        await done.wait()
        return future.result()


def in_daemon_thread(function: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """``function()`` run in a daemon thread of its own: its future."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(function())
        except BaseException as exc:  # noqa: BLE001 - the future carries it to the caller
            future.set_exception(exc)

    threading.Thread(target=run, name="asyncsandbox-ray-connect", daemon=True).start()
    return future


class _Reply:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Link:
    """This backend's calls to one node's agent, carried many to a Ray call
    (:meth:`NodeAgent.exchange <asyncsandbox_ray._node.NodeAgent.exchange>`): calls made
    while an exchange is on its way go together in the next one, and each exchange brings
    back every answer ready on the node. At most ``IN_FLIGHT`` exchanges are on their way
    at once; while calls are unanswered, one is always waiting on the node for their
    answers (a long poll shared by every sandbox of the node). An exchange that fails
    (the actor died, or the node did not answer within ``POLL_WAIT + CALL_GRACE``) fails
    every call sent to the node and not answered yet, with Ray's error, which the caller
    translates as it did for a call of its own. Until the first answer there is no
    deadline: the actor may still be starting (a worker process, seconds on a busy node),
    and each call has its own."""

    IN_FLIGHT = 2

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.id = uuid.uuid4().hex
        self.scope = anyio.CancelScope()
        self._queue: dict[int, tuple[str, tuple[Any, ...]]] = {}
        self._sent: dict[int, _Reply] = {}
        self._replies: dict[int, _Reply] = {}
        self._numbers = 0
        self._in_flight = 0
        self._wake = anyio.Event()
        self._closed: BaseException | None = None
        self._answered = False

    async def call(self, method: str, args: tuple[Any, ...], wait: float | None) -> Any:
        """``method(*args)`` on the node; Ray's errors are raised as Ray raised them."""
        if self._closed is not None:
            raise self._closed
        self._numbers += 1
        number = self._numbers
        reply = self._replies[number] = _Reply()
        self._queue[number] = (method, args)
        self._wake.set()
        try:
            with anyio.fail_after(wait):
                await reply.done.wait()
        finally:
            # Not sent yet: it never will be (a cancelled call does nothing on the node).
            self._queue.pop(number, None)
            self._replies.pop(number, None)
            self._sent.pop(number, None)
        if reply.error is not None:
            raise reply.error
        return reply.value

    async def pump(self) -> None:
        """Send exchanges while there are calls to send or answers to wait for (a task of
        the backend's task group, one per node)."""
        try:
            with self.scope:
                await self._pump()
        finally:
            self._close(BackendUnavailable("the Ray backend is closed"))

    async def _pump(self) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                # The callers woken by the last answers make their next calls now: they
                # go together.
                for _ in range(COALESCE):
                    await anyio.lowlevel.checkpoint()
                while (self._queue and self._in_flight < self.IN_FLIGHT) or (
                    self._sent and not self._in_flight
                ):
                    ops, self._queue = self._queue, {}
                    self._in_flight += 1
                    tg.start_soon(self._exchange, ops)

    def _close(self, error: BaseException) -> None:
        self._closed = error
        for reply in [*self._sent.values(), *self._replies.values()]:
            if not reply.done.is_set():
                reply.error = error
                reply.done.set()

    async def _exchange(self, ops: dict[int, tuple[str, tuple[Any, ...]]]) -> None:
        wire = []
        for number, (method, args) in ops.items():
            reply = self._replies.get(number)
            if reply is not None:  # else cancelled meanwhile
                self._sent[number] = reply
                wire.append((number, method, args))
        try:
            ref = self.actor.exchange.remote(self.id, wire)
            answers = await result(ref, POLL_WAIT + CALL_GRACE if self._answered else None)
            self._answered = True
        except Exception as exc:  # noqa: BLE001 - each call sent gets it, and translates it
            sent, self._sent = self._sent, {}
            for reply in sent.values():
                reply.error = exc
                reply.done.set()
        else:
            for number, returned, value in answers:
                reply = self._sent.pop(number, None)
                if reply is None:
                    continue  # its caller gave up
                if returned:
                    reply.value = value
                else:
                    reply.error = BackendUnavailable(f"the Ray node failed: {value}")
                reply.done.set()
        finally:
            self._in_flight -= 1
            self._wake.set()
