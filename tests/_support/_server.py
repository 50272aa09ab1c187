"""A real server: ``asyncsandbox serve`` in a subprocess, with two tenants' keys, and a TCP
proxy in front of it that breaks the client's connections on demand."""

from __future__ import annotations

import functools
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx

from asyncsandbox.abc import Backend

from ._process import new_process_root, sandbox_dirs

ALICE = "alice-" + secrets.token_hex(16)
BOB = "bob-" + secrets.token_hex(16)


class Server:
    """``asyncsandbox -vv serve ...`` in a subprocess, on a free loopback port."""

    def __init__(
        self, directory: Path, *args: str, backend: str = "process", root: Path | None = None
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.keys = directory / "keys.txt"
        self.keys.write_text(f"# test tenants\nalice:{ALICE}\nbob:{BOB}\n")
        self.log = directory / f"server-{uuid.uuid4().hex[:6]}.log"
        self.root = root
        command = [
            sys.executable,
            "-m",
            "asyncsandbox",
            "-vv",
            "serve",
            "--backend",
            backend,
            "--listen",
            "127.0.0.1:0",
            "--print-url",
            "--keys",
            str(self.keys),
            *(["--backend-option", f"root={root}"] if root is not None else []),
            *args,
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:  # select() fails past fd 1023
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(60)
        line = self.process.stdout.readline().decode() if ready else ""
        if not line.startswith(("http://", "https://")):
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"the server did not start:\n{self.logs()[-3000:]}")
        # --print-url: the URL alone on stdout (the log line goes to stderr).
        self.url = line.strip()
        self.first_line = line

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        try:
            if self.process.poll() is None:
                self.process.send_signal(sig)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                    raise
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
        return self.process.returncode

    def sandbox_dirs(self) -> list[str]:
        assert self.root is not None
        return sandbox_dirs(self.root)

    def client(self, key: str | None = ALICE) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def backend(self, key: str = ALICE, **options: Any) -> Callable[[], Backend]:
        from asyncsandbox_remote import RemoteBackend

        return functools.partial(RemoteBackend, self.url, key, **options)


@contextmanager
def serving(directory: Path, *args: str) -> Iterator[Server]:
    """A server on the process backend, with a sandbox root of its own: stopped, and its
    root removed, when the block ends."""
    root = new_process_root()
    server = Server(directory, *args, root=root)
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


class TcpProxy:
    """A TCP proxy on loopback in front of a server's port, that breaks the client's
    connections on demand: real faults on the client's path, the server untouched.

    * :meth:`drop`: the next ``n`` connections are closed as soon as they are accepted.
      In front of a TLS server their handshake fails, so their request is never sent
      (httpx raises ``ConnectError``).
    * :meth:`sever`: the next ``n`` connections carry the client's bytes to the server,
      and are closed, both ways, when the server's first bytes come back: their request
      reached the server (it began to answer it) and its answer is lost. (In front of a
      TLS server the server speaks first: sever connections to a plain HTTP one.)
    * :meth:`cut`: close every connection open now (idle pooled ones, and requests in
      flight, which reached the server and lose their answers).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        """Connections accepted so far."""
        self.dropped = 0
        """Connections closed by :meth:`drop`."""
        self.severed = 0
        """Connections closed by :meth:`sever`."""
        self._drop = 0
        self._sever = 0
        self._live: dict[anyio.CancelScope, anyio.Event] = {}

    def url(self, scheme: str = "https") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def drop(self, n: int) -> None:
        """Drop the next ``n`` connections (0: none); what was dropped so far stays counted."""
        self._drop = n

    def sever(self, n: int) -> None:
        """Sever the next ``n`` connections once their server answers (0: none); what
        was severed so far stays counted."""
        self._sever = n

    async def cut(self) -> None:
        """Close every connection open now, and return once they are closed."""
        closed = list(self._live.values())
        for scope in list(self._live):
            scope.cancel()
        for event in closed:
            await event.wait()

    async def _pipe(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, tg: anyio.abc.TaskGroup
    ) -> None:
        try:
            async for data in source:
                await sink.send(data)
            await sink.send_eof()  # a half-close, passed on
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            tg.cancel_scope.cancel()  # one side broke: so does the other

    async def _swallow(self, upstream: anyio.abc.SocketStream, tg: anyio.abc.TaskGroup) -> None:
        """Wait for the server's first bytes, then close the connection both ways."""
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            await upstream.receive()
        self.severed += 1
        tg.cancel_scope.cancel()

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        scope, closed = anyio.CancelScope(), anyio.Event()
        self._live[scope] = closed
        try:
            async with client:
                if self._drop > 0:
                    self._drop -= 1
                    self.dropped += 1
                    return
                severing = self._sever > 0
                if severing:
                    self._sever -= 1
                with scope:
                    upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
                    async with upstream, anyio.create_task_group() as tg:
                        tg.start_soon(self._pipe, client, upstream, tg)
                        if severing:
                            tg.start_soon(self._swallow, upstream, tg)
                        else:
                            tg.start_soon(self._pipe, upstream, client, tg)
        finally:
            del self._live[scope]
            closed.set()

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)


@asynccontextmanager
async def tcp_proxy(upstream_port: int) -> AsyncIterator[TcpProxy]:
    """A :class:`TcpProxy` serving for the duration of the block."""
    proxy = TcpProxy(upstream_port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
