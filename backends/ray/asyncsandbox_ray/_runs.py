"""What a node's agent keeps between calls: each command's run (its output buffered for
its driver's polls) and each driver's link (the answers its exchanges have not taken yet)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asyncsandbox import CodeEvent, Execution
from asyncsandbox.abc import ExitStatus

from ._wire import WireError

__all__ = ("BATCH_BYTES", "BUFFER_BYTES", "EXCHANGED", "Answer", "DriverLink", "Op", "Run")

BATCH_BYTES = 64 * 1024
"""Output that makes a lingering poll answer at once."""
BUFFER_BYTES = 4 * 1024 * 1024
"""Output a command may have waiting for its driver before it is paused (backpressure)."""


class Run:
    """One command (or ``run_code`` call) on this node: its task, its buffered output (or
    events), how it ended."""

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.size = 0
        self.status: ExitStatus | None = None
        self.execution: Execution | None = None
        self.error: WireError | None = None
        self.changed = asyncio.Event()
        self.answer = asyncio.Event()  # ended, or BATCH_BYTES waiting: a lingering poll answers
        self.drained = asyncio.Event()
        self.drained.set()
        self.task: asyncio.Task[None] | None = None
        self.polled = time.monotonic()

    @property
    def ended(self) -> bool:
        return self.status is not None or self.execution is not None or self.error is not None

    async def output(self, stream: str, data: bytes) -> None:
        await self._add((stream, data), len(data))

    async def event(self, event: CodeEvent) -> None:
        size = len(getattr(event, "line", "")) + len(getattr(event, "png", None) or b"")
        await self._add(event, size + 64)

    async def _add(self, item: Any, size: int) -> None:
        while self.size >= BUFFER_BYTES:  # backpressure: the command waits for the driver
            self.drained.clear()
            await self.drained.wait()
        self.chunks.append(item)
        self.size += size
        self.changed.set()
        if self.size >= BATCH_BYTES:
            self.answer.set()

    def take(self) -> list[Any]:
        chunks, self.chunks, self.size = self.chunks, [], 0
        self.changed.clear()
        if not self.ended:
            self.answer.clear()
        self.drained.set()
        return chunks


EXCHANGED = frozenset(
    {
        "create",
        "inspect",
        "remove",
        "read_file",
        "write_file",
        "put_archive",
        "get_archive",
        "exec_start",
        "exec_poll",
        "code_start",
        "code_poll",
        "code_contexts",
    }
)
"""The methods a driver may call through :meth:`NodeAgent.exchange`."""

Op = tuple[int, str, tuple[Any, ...]]
"""One call carried by an exchange: the driver's number for it, the method, its arguments."""
Answer = tuple[int, bool, Any]
"""A call's answer: its number, whether the method returned (else it raised: the value
says what), the value."""


class DriverLink:
    """The exchanges of one driver (backend) with this node: the answers not yet taken,
    and who waits for them."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.running = 0
        self.turn = 0  # the newest exchange waits; an older one answers at once
        self.changed = asyncio.Event()
        self.seen = time.monotonic()

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
