"""How a process sandbox's commands are started: what both paths share.

There are two paths (Docker's shape: one small module each, chosen once, when the
sandbox is made): ``_executor_path.py`` (the fast path: the sandbox's resident executor
forks each command) and ``_launcher_path.py`` (a launcher per command builds the sandbox
around it). The backend picks the executor path where the native launcher runs (and
``fast_path`` is on) and always with gVisor, the launcher path elsewhere.
"""

from __future__ import annotations

import os
import time
from abc import ABCMeta, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio

from .._config import Timeouts
from .._errors import LaunchError, SandboxDied
from .._log import get_logger
from ._cgroups import SandboxCgroup
from ._isolation import LaunchOutput, Mechanism, transient
from ._layout import Layout
from ._spawn import Child, Pipe
from ._store import SandboxMeta


class Box:
    """What both paths know of one sandbox: where it is, its cgroup, the mechanism that
    isolates it, the processes we started in it, and whether it still lives."""

    def __init__(
        self,
        layout: Layout,
        meta: SandboxMeta,
        cgroup: SandboxCgroup | None,
        *,
        mechanism: Mechanism,
        timeouts: Timeouts,
    ) -> None:
        self.layout = layout
        self.meta = meta
        self.cgroup = cgroup
        self.mechanism = mechanism
        self.timeouts = timeouts
        self.processes: set[Child] = set()
        """Our children in the sandbox: launchers, and the executor's."""
        self.removed = False

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def cgroup_files(self) -> Sequence[str]:
        return self.cgroup.procs_files if self.cgroup is not None else ()

    def check_alive(self) -> None:
        if self.removed or not self.layout.root.exists():
            raise SandboxDied(self.id, "removed")
        expires = self.meta.expires_at
        if expires is not None and expires < time.time():
            raise SandboxDied(self.id, "max lifetime exceeded")

    def check_alive_after(self, failure: BaseException) -> None:
        """Raise :class:`SandboxDied` (caused by ``failure``) if the sandbox is gone: what
        took a command, its launcher or its executor (another owner removed the sandbox,
        killing its cgroup) may have taken the sandbox. Return if it is still there."""
        try:
            self.check_alive()
        except SandboxDied as died:
            raise died from failure

    def launch_error(self, returncode: int, output: str) -> LaunchError:
        """The error of a launcher that could not start a command, from what it said."""
        mechanism = self.mechanism.name
        message = output.strip() or f"it exited with status {returncode} and said nothing"
        error = LaunchError(
            f"sandbox {self.id}: the {mechanism} launcher could not start the command: {message}",
            retryable=transient(message),
        )
        get_logger().warning(
            "process.launch.failed",
            sandbox_id=self.id,
            mechanism=mechanism,
            error=message[-2000:],
            retryable=error.retryable,
        )
        return error

    async def kill_all(self, *, sparing: Child | None = None) -> None:
        """Kill every process we started in the sandbox but ``sparing``, and wait (within
        ``timeouts.cleanup``) until they are gone: a launcher's namespace dies with it, and
        all in it."""
        for process in list(self.processes):
            if process is not sparing:
                process.kill()
        with anyio.fail_after(self.timeouts.cleanup):
            for process in list(self.processes):
                if process is not sparing:
                    await process.wait()


class Run:
    """A started command: our ends of its pipes, and its exit status to wait for."""

    def __init__(self, stdout: Pipe, stderr: Pipe, stdin: Pipe | None) -> None:
        self.stdout = stdout
        self.stderr = LaunchOutput(stderr)
        self.stdin = stdin
        self._pipes = (stdout, stderr, stdin)
        self.command: Any = None  # the executor's request, on the fast path
        self.exited: Callable[[], Awaitable[int]] | None = None

    async def wait(self) -> int:
        """Its exit status, once every process of it is gone."""
        assert self.exited is not None
        return await self.exited()

    @property
    def cpu_time(self) -> float | None:
        """Its CPU seconds, once it ended, where its path can tell (the executor's)."""
        return None if self.command is None else self.command.cpu

    def close(self) -> None:
        for pipe in self._pipes:
            if pipe is not None:
                pipe.close()


class Path(metaclass=ABCMeta):
    """How a sandbox's commands are started (the sandbox's ``exec`` and ``interact``, after
    its checks)."""

    def __init__(self, box: Box) -> None:
        self.box = box

    @abstractmethod
    def started(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AbstractAsyncContextManager[Run]:
        """A command, once started (its setup done, its program being executed). It is
        killed, with all it started, if the block exits before it ended, by an error or by
        cancellation. Raise :class:`LaunchError` if it could not be set up: then it never
        ran."""

    @abstractmethod
    def busy(self) -> bool:
        """Whether any command runs."""

    @abstractmethod
    async def clear(self, *, keep: bool) -> set[int]:
        """Kill every command (for a reset). ``keep``: keep what serves commands if it can
        clear itself (the executor); return the host pids of what was kept."""

    async def stop(self) -> None:  # noqa: B027 - a hook: only the executor path holds anything
        """Stop what the path keeps running (every command it runs dies); the next command
        starts anew."""


def children(pid: int) -> list[int]:
    """The children of process ``pid`` (none if it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except (OSError, ValueError):
        return []


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (its children, theirs, ...), whichever thread forked
    them (runsc, in Go, forks from any of its threads)."""
    found, todo = [], _all_children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += _all_children(child)
    return found


def _all_children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
        except (OSError, ValueError):
            continue
    return found
