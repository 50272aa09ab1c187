"""One process sandbox: its commands (through the path chosen when it was made), its
files (as ``sh`` scripts, :class:`ShellFiles`), its state (snapshot, reset) and its
removal (through the store it was made from)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from anyio import TypedAttributeSet, typed_attribute

from .._errors import (
    InfrastructureError,
    InvalidArgument,
    SandboxDied,
    SandboxNotFound,
    SandboxOOMKilled,
)
from .._models import SandboxInfo
from .._shellfiles import InteractiveProcess, ShellFiles
from .._util import single_error
from ..abc import ExitStatus, OutputCallback, SandboxHandle
from . import _layout, _state
from ._executor import ExecutorGone
from ._executor_path import ExecutorPath
from ._path import Box, Path as CommandPath, Run
from ._spawn import feed, pump
from ._store import Store

UNISOLATED_PIPE_GRACE = 1.0


class ProcessAttributes(TypedAttributeSet):
    """Typed attributes of process sandboxes (``sandbox.extra(ProcessAttributes.root)``)."""

    root: Path = typed_attribute()
    """The sandbox's directory on the host."""
    isolation: str = typed_attribute()
    """The isolation mechanism in use: ``bwrap``, ``native`` or ``none``."""
    fast_path: bool = typed_attribute()
    """Whether commands run through the sandbox's resident executor (see ``fast_path``)."""


class ProcessSandbox(ShellFiles, SandboxHandle):
    """:param path: how its commands start (chosen by the backend).
    :param store: the sandboxes on disk it is one of.
    :param forget: called with its id once it is removed."""

    def __init__(
        self, box: Box, path: CommandPath, store: Store, *, forget: Callable[[str], None]
    ) -> None:
        self._box = box
        self._path = path
        self._store = store
        self._forget = forget

    @property
    def id(self) -> str:
        return self._box.id

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            ProcessAttributes.root: lambda: self._box.layout.root,
            ProcessAttributes.isolation: lambda: self._box.mechanism.name,
            ProcessAttributes.fast_path: lambda: isinstance(self._path, ExecutorPath),
        }

    # -- commands ------------------------------------------------------------------------

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
        box = self._box
        expires = box.meta.expires_at
        oom_before = box.cgroup.oom_kills() if box.cgroup else 0
        try:
            with anyio.move_on_after(
                float("inf") if expires is None else expires - time.time()
            ) as lifetime:
                async with self._path.started(argv, cwd, env, stdin is not None) as run:
                    with single_error():
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(pump, run.stdout, "stdout", on_output)
                            tg.start_soon(pump, run.stderr, "stderr", on_output)
                            if stdin is not None:
                                assert run.stdin is not None
                                tg.start_soon(feed, run.stdin, stdin)
                            returncode = await run.wait()
                            if not box.mechanism.isolated:
                                # No PID namespace: stop waiting for pipes that escaped
                                # children may hold open. Otherwise every pipe is at its end.
                                tg.cancel_scope.deadline = (
                                    anyio.current_time() + UNISOLATED_PIPE_GRACE
                                )
        except InfrastructureError as exc:
            if not isinstance(exc, SandboxDied):
                box.check_alive_after(exc)  # its executor went with the sandbox
                if box.cgroup is not None and box.cgroup.oom_kills() > oom_before:
                    if box.mechanism.oom_ends_sandbox:
                        raise SandboxOOMKilled(
                            self.id, "out of memory: its memory_mb holds its whole gVisor sandbox"
                        ) from exc
                    if isinstance(exc, ExecutorGone):  # what may have ended it, said
                        raise ExecutorGone(
                            f"{exc}; the sandbox reached its memory limit meanwhile (the "
                            "kernel killed a process of it)"
                        ) from exc
            raise
        if lifetime.cancelled_caught:
            raise SandboxDied(self.id, "max lifetime exceeded")
        # Removed from outside while it ran (its cgroup killed, its launcher with it): the
        # command did not end by itself, and its exit status says nothing of it.
        box.check_alive()
        oom = box.cgroup is not None and box.cgroup.oom_kills() > oom_before
        if returncode < 0:  # the launcher itself was killed by a signal
            returncode = 128 - returncode
        return ExitStatus(
            returncode=returncode,
            signal=9 if oom else None,
            oom_killed=oom,
            cpu_time=run.cpu_time,
        )

    async def stop_executor(self) -> None:
        """Stop the executor, if any: every command it runs dies."""
        await self._path.stop()

    # -- interactive processes (file operations, the code interpreter) ----------------------

    @asynccontextmanager
    async def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AsyncIterator[InteractiveProcess]:
        async with self._path.started(argv, cwd, env, stdin) as run:
            started = _Script(run, self._box)
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(started.read_stderr)
                    yield started
                    tg.cancel_scope.cancel()

    def shell_path(self, path: str) -> str:
        if not self._box.mechanism.isolated:
            return self._box.layout.host_path(path)
        return path

    async def inspect(self) -> SandboxInfo:
        info = await anyio.to_thread.run_sync(self._store.info, self.id)
        if info is None:
            raise SandboxNotFound(self.id)
        return info

    # -- state -----------------------------------------------------------------------------

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        box = self._box
        box.check_alive()
        if (box.cgroup is None or not box.cgroup.can_freeze) and self._path.busy():
            raise InvalidArgument(
                f"sandbox {self.id}: a snapshot while commands run needs the cgroup freezer "
                "(root, cgroup v2); wait for the commands to end"
            )
        meta = _state.SnapshotMeta(
            id=_state.new_id(),
            image=box.meta.image,
            workdir=box.meta.workdir,
            source=self.id,
            created_at=time.time(),
            labels=dict(labels or {}),
        )
        snapshots = self._store.snapshots
        try:
            await anyio.to_thread.run_sync(
                functools.partial(snapshots.take, box.layout, meta, box.cgroup, box.meta.layers)
            )
        except BaseException:
            with anyio.CancelScope(shield=True):  # cancelled after the copy: nothing stays
                await anyio.to_thread.run_sync(self._store.delete_snapshot, meta.id)
            raise
        return meta.id

    async def reset(self) -> None:
        box = self._box
        box.check_alive()
        if not box.mechanism.isolated:
            raise InvalidArgument("the process backend resets only isolated sandboxes")
        # Every command goes, with what it left; the executor stays if it can (see
        # ExecutorPath.clear), unless the sandbox mounts layers: a reset remounts them, and
        # the executor's view goes with them. Whatever else is in the cgroup goes too.
        layers = box.meta.layers
        kept = await self._path.clear(keep=not layers)
        layout, snapshot, snapshots = box.layout, box.meta.snapshot, self._store.snapshots

        def restore() -> None:
            if box.cgroup is not None and not box.cgroup.kill_all(sparing=kept):
                raise OSError(f"sandbox {self.id}: processes survived the cgroup's kill")
            if layers:  # its own layer dropped: O(what the episode changed)
                _state.reset_layers(layout, layers)
                return
            if kept:
                _state.empty(layout)  # the executor's view binds the areas: they stay
            else:
                _state.wipe(layout)
                _layout.populate(layout)
            if snapshot is not None:
                _state.restore(snapshots.directory(snapshot), layout)

        await anyio.to_thread.run_sync(restore)

    async def remove(self) -> None:
        box = self._box
        box.removed = True
        await self._path.stop()
        for process in list(box.processes):
            process.kill()
        await anyio.to_thread.run_sync(self._store.remove, self.id, box.cgroup)
        self._forget(self.id)


class _Script:
    """An interactive process (:class:`InteractiveProcess`): a started command whose stderr
    (its first 4 KiB) says why it failed. Run :meth:`read_stderr` alongside."""

    def __init__(self, run: Run, box: Box) -> None:
        self._run = run
        self._box = box
        self._stderr = bytearray()
        self._stderr_read = anyio.Event()

    async def read_stderr(self) -> None:
        try:
            while (chunk := await self._run.stderr.receive()) is not None:
                self._stderr.extend(chunk[: max(0, 4096 - len(self._stderr))])
        finally:
            self._stderr_read.set()

    async def send(self, data: bytes) -> None:
        stdin = self._run.stdin
        if stdin is None or stdin.closed:
            raise anyio.ClosedResourceError
        try:
            await stdin.send(data)
        except BrokenPipeError:
            raise anyio.BrokenResourceError from None

    async def close_stdin(self) -> None:
        if self._run.stdin is not None:
            self._run.stdin.close()

    def __aiter__(self) -> _Script:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._run.stdout.receive()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def wait(self) -> tuple[int, bytes]:
        await self.close_stdin()
        try:
            returncode = await self._run.wait()
        except InfrastructureError as exc:
            self._box.check_alive_after(exc)
            raise
        if returncode != 0:
            self._box.check_alive()  # killed with the sandbox, not a file's error
        # Its stderr is at its end now (none of its processes is left), but the exit status
        # may have come first: its reason must not be judged on half of what it said.
        with anyio.move_on_after(UNISOLATED_PIPE_GRACE):
            await self._stderr_read.wait()
        return returncode, bytes(self._stderr)
