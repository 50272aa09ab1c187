"""MCP over stdio: one client, so one session and one sandbox, for as long as the client
keeps our stdin open (or until SIGTERM/SIGINT, or cancellation)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
from mcp.server.stdio import stdio_server

from asyncsandbox import Session

from ._config import McpConfig
from ._server import create_server
from ._version import version
from ._workspaces import Workspaces

__all__ = ("serve_stdio",)

STDIO_SESSION = "stdio"
"""The key of stdio's one session."""


class _Lines:
    """Lines of a pipe, read without a thread: the SDK's own stdin reader blocks a worker
    thread in ``readline()``, which no cancellation interrupts, so a server stopped by a
    signal while its client kept the pipe open would never finish."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self._eof = False

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while b"\n" not in self._buffer and not self._eof:
            await anyio.wait_readable(self._fd)
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            self._buffer += chunk
            self._eof = not chunk
        if not self._buffer:
            raise StopAsyncIteration
        line, newline, self._buffer = self._buffer.partition(b"\n")
        return (line + newline).decode("utf-8", errors="replace")


@asynccontextmanager
async def _stdin() -> AsyncIterator[_Lines]:
    """Our stdin as lines; meanwhile fd 0 reads the null device, so nothing else (a child
    process, say) consumes the protocol's bytes, as the SDK's own reader arranges."""
    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    blocking = os.get_blocking(wire)
    os.set_blocking(wire, False)
    try:
        yield _Lines(wire)
    finally:
        os.set_blocking(wire, blocking)  # the descriptor is shared with whoever started us
        os.dup2(wire, 0)
        os.close(wire)


async def serve_stdio(session: Session, config: McpConfig) -> None:
    """Serve MCP on stdin and stdout until the client closes stdin; its sandbox is then
    removed. Output that is not the protocol's (logs) must go to stderr.

    Cancellation: the server stops; the session's sandbox is removed (shielded).
    """
    async with Workspaces(session, config, expire_idle=False) as workspaces:
        server = create_server(workspaces, lambda ctx: STDIO_SESSION, version=version())
        async with _stdin() as lines, stdio_server(stdin=cast(Any, lines)) as (read, write):
            await server.run(read, write, server.create_initialization_options())
