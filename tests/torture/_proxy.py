"""A Unix-socket proxy in front of the Docker daemon that injects faults on the way.

A backend pointed at it (``DockerBackend(url=proxy.url)``) sees a slow, wedged or
restarting daemon while the real daemon — shared with others — is never touched: the
proxy only delays, withholds or drops bytes on *its own* connections.

Modes (switch them at any time with :meth:`DockerProxy.set`):

* ``pass``: bytes flow both ways.
* ``slow``: every chunk the daemon sends is held back ``delay`` seconds.
* ``blackhole``: requests still reach the daemon but its answers are withheld (held
  connections, new ones included), like Docker 20.10 wedged on moby/moby#46661.
* ``down``: every connection is dropped and new ones are closed at once, as while the
  daemon restarts.

:meth:`DockerProxy.withhold` is the selective blackhole: once a request containing a
given text (say ``/containers/create``) went through a connection, that connection's
answers are withheld until :meth:`DockerProxy.release` — the daemon acted, the client
never hears of it. :meth:`DockerProxy.swallow` drops requests containing a text: they never
reach the daemon and are never answered (a daemon that accepts calls but no longer serves
them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc
from anyio.abc import SocketStream

Mode = Literal["pass", "slow", "blackhole", "down"]
# The daemon the tests use: DOCKER_HOST's socket when it names one, as for the backend.
_HOST = os.environ.get("DOCKER_HOST", "")
DOCKER_SOCKET = (
    _HOST.removeprefix("unix://") if _HOST.startswith("unix://") else "/var/run/docker.sock"
)


class _Connection:
    def __init__(self) -> None:
        self.held = False


class DockerProxy:
    def __init__(self, path: Path, upstream: str = DOCKER_SOCKET) -> None:
        self.path = path
        self.upstream = upstream
        self.mode: Mode = "pass"
        self.delay = 0.0
        self.connections = 0
        """Connections accepted so far."""
        self.withheld = 0
        """Connections whose answers were withheld by :meth:`withhold`."""
        self.swallowed = 0
        """Requests dropped by :meth:`swallow`."""
        self._patterns: tuple[bytes, ...] = ()
        self._swallowed: tuple[bytes, ...] = ()
        self._changed = anyio.Event()
        self._live: set[anyio.CancelScope] = set()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def set(self, mode: Mode, *, delay: float = 0.0) -> None:
        self.mode = mode
        self.delay = delay
        self._notify()
        if mode == "down":
            for scope in list(self._live):
                scope.cancel()

    def withhold(self, *patterns: str) -> None:
        """Withhold the answers of connections that carried a request with one of ``patterns``."""
        self._patterns = tuple(p.encode() for p in patterns)

    def swallow(self, *patterns: str) -> None:
        """Drop requests containing one of ``patterns`` (their connections then hang)."""
        self._swallowed = tuple(p.encode() for p in patterns)

    def release(self) -> None:
        """Stop withholding and swallowing (answers held so far are delivered; requests
        swallowed so far stay lost)."""
        self._patterns = self._swallowed = ()
        self._notify()

    async def _gate(self, connection: _Connection) -> None:
        """Wait while answers are withheld; then apply the delay of ``slow``."""
        while self.mode == "blackhole" or (connection.held and self._patterns):
            await self._changed.wait()
        if self.mode == "slow":
            await anyio.sleep(self.delay)

    async def _requests(self, client: SocketStream, upstream: SocketStream, c: _Connection) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            while True:
                data = await client.receive(65536)
                if any(p in data for p in self._swallowed):
                    self.swallowed += 1
                    await anyio.sleep_forever()  # until the client gives up on it
                if not c.held and any(p in data for p in self._patterns):
                    c.held = True
                    self.withheld += 1
                await upstream.send(data)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await upstream.send_eof()

    async def _answers(self, upstream: SocketStream, client: SocketStream, c: _Connection) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            while True:
                data = await upstream.receive(65536)
                await self._gate(c)
                await client.send(data)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await client.send_eof()

    async def _handle(self, client: SocketStream) -> None:
        self.connections += 1
        async with client:
            if self.mode == "down":
                return
            with anyio.CancelScope() as scope:
                self._live.add(scope)
                try:
                    async with await anyio.connect_unix(self.upstream) as upstream:
                        connection = _Connection()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._requests, client, upstream, connection)
                            tg.start_soon(self._answers, upstream, client, connection)
                finally:
                    self._live.discard(scope)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_unix_listener(self.path)
        os.chmod(self.path, 0o600)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)


@asynccontextmanager
async def docker_proxy(directory: Path) -> AsyncIterator[DockerProxy]:
    """A proxy serving on a fresh socket in ``directory`` for the duration of the block."""
    proxy = DockerProxy(directory / f"docker-{uuid.uuid4().hex[:8]}.sock")
    # anyio's raw UNIX sockets race on asyncio: a receive cancelled while its socket turns
    # readable calls set_result() on the cancelled future (InvalidStateError in a loop
    # callback). The proxy cancels such receives on purpose (down mode); that noise is the
    # proxy's, not the code under test's, so it is dropped here and only here.
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), asyncio.InvalidStateError):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        try:
            yield proxy
        finally:
            proxy.set("down")
            tg.cancel_scope.cancel()
    with contextlib.suppress(FileNotFoundError):
        proxy.path.unlink()
