"""The server's view of its backend: a thin wrapper that keeps sandboxes on shutdown.

The server runs a real :class:`asyncsandbox.Session` over this wrapper, and uses its
sandboxes only through the public :class:`asyncsandbox.Sandbox` (archives included), so
every runtime policy (limits, deadlines, retries, error mapping, cleanup) applies
unchanged; the wrapper only delegates (every method of the contract: a test checks), except that :meth:`_ServedHandle.remove` does
nothing once the server decided to keep its sandboxes (``--on-shutdown keep``).
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self

from asyncsandbox import SandboxInfo, SnapshotInfo, Timeouts
from asyncsandbox.abc import (
    Backend,
    BackendCapabilities,
    ExitStatus,
    InteractiveProcess,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
)


class ServedBackend(Backend):
    """Delegates to ``inner``; see the module docstring."""

    name = "served"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.keep = False
        """Set on shutdown with the ``keep`` policy: removals become no-ops."""

    def use_timeouts(self, timeouts: Timeouts) -> None:
        super().use_timeouts(timeouts)
        self.inner.use_timeouts(timeouts)

    @property
    def capabilities(self) -> BackendCapabilities:
        return self.inner.capabilities

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.inner.__aexit__(exc_type, exc_val, exc_tb)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        return _ServedHandle(self, await self.inner.create(spec))

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        return _ServedHandle(self, await self.inner.attach(sandbox_id))

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        return await self.inner.list(labels=labels)

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return await self.inner.list_snapshots()

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.inner.delete_snapshot(snapshot_id)


class _ServedHandle(SandboxHandle):
    def __init__(self, backend: ServedBackend, inner: SandboxHandle) -> None:
        self._backend = backend
        self._inner = inner

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self._inner.extra_attributes

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,  # advisory (see the contract)
    ) -> ExitStatus:
        return await self._inner.exec(
            argv, cwd=cwd, env=env, stdin=stdin, on_output=on_output, timeout=timeout
        )

    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        return self._inner.interact(argv, cwd=cwd, env=env, stdin=stdin)

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        return await self._inner.read_file(path, max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        await self._inner.write_file(path, data, mode=mode)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        await self._inner.put_archive(path, archive)

    def get_archive(self, path: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self._inner.get_archive(path)

    async def inspect(self) -> SandboxInfo:
        return await self._inner.inspect()

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        return await self._inner.snapshot(labels=labels)

    async def reset(self) -> None:
        await self._inner.reset()

    async def remove(self) -> None:
        if not self._backend.keep:
            await self._inner.remove()
