"""The fast path: the sandbox's resident executor (``_executor.py``) forks each command
into the namespaces it holds. It is started at the sandbox's first command, stopped after
``executor_idle`` seconds without one, and replaced if it dies (the next command starts
a new one)."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from .._errors import InfrastructureError, LaunchError
from .._log import get_logger
from ._executor import Executor, ExecutorGone
from ._isolation import LaunchOutput, Resident
from ._path import Box, Path, Run, descendants
from ._spawn import Pipe, spawn


class ExecutorPath(Path):
    """:param resident: the mechanism that starts executors (the native launcher, or
        gVisor's, whose sandbox the executor is the first process of).
    :param task_group: where the executors' readers run (the backend's).
    :param idle: seconds an executor waits for its next command before it stops (None:
        until the sandbox is removed)."""

    def __init__(
        self,
        box: Box,
        *,
        resident: Resident,
        task_group: anyio.abc.TaskGroup,
        idle: float | None,
    ) -> None:
        super().__init__(box)
        self._resident = resident
        self._task_group = task_group
        self._idle = idle
        self.executor: Executor | None = None
        """The running executor, if any."""
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def started(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[Run]:
        executor = await self._current()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = (
            os.pipe2(os.O_CLOEXEC)
            if stdin
            else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
        )
        run = Run(Pipe(out_r), Pipe(err_r), Pipe(in_w) if in_w >= 0 else None)
        box = self.box
        try:
            try:
                run.command = await executor.run(
                    argv, cwd=cwd, env=box.layout.env(env), stdin=in_r, stdout=out_w, stderr=err_w
                )
                run.exited = functools.partial(executor.wait, run.command)
            except ExecutorGone as exc:
                # The command was never handed over: a new executor may run it.
                await self._drop(executor)
                raise LaunchError(f"sandbox {box.id}: {exc}", retryable=True) from exc
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
            try:
                if not await run.stderr.started():
                    try:
                        returncode = await executor.wait(run.command)
                    except ExecutorGone as exc:  # gone before the command started
                        await self._drop(executor)
                        raise LaunchError(f"sandbox {box.id}: {exc}", retryable=True) from exc
                    box.check_alive()
                    raise box.launch_error(returncode, run.stderr.launcher_output)
                yield run
            finally:
                # Whenever the block exits before the command ended (an error, a
                # cancellation, or a caller done with it: an interactive process), its
                # whole tree must be gone before we return. Shielded and bounded; an
                # executor that does not confirm it is given up (with every command of the
                # sandbox: that is the only way to be sure). A no-op for an ended command.
                with anyio.CancelScope(shield=True):
                    with anyio.move_on_after(box.timeouts.cleanup) as scope:
                        await executor.kill(run.command)
                    if scope.cancelled_caught:
                        await self._drop(executor, abandon=True)
        finally:
            run.close()

    def busy(self) -> bool:
        executor = self.executor
        return any(
            executor is None or process is not executor.process or executor.busy
            for process in self.box.processes
        )

    async def clear(self, *, keep: bool) -> set[int]:
        # The executor kills every command and gives the next ones fresh IPC and network
        # namespaces and /dev/shm, so it stays (the next episode's first command costs no
        # executor start); if it cannot (or must not stay), it goes too, with the
        # namespaces it holds.
        executor = self.executor if keep else None
        if executor is not None and executor.alive:
            try:
                with anyio.fail_after(self.box.timeouts.cleanup):
                    await executor.reset()
            except TimeoutError:  # it stopped answering: killed, not asked again
                await self._drop(executor, abandon=True)
                executor = None
            except InfrastructureError as exc:
                # Still a full reset (a new executor starts afresh), but a slower one, and
                # a sign that the executor's reset is broken here: said, not swallowed.
                get_logger().warning(
                    "process.executor.reset_failed", sandbox=self.box.id, reason=str(exc)
                )
                executor = None
        if executor is None or not executor.alive:
            executor = None
            await self.stop()
        await self.box.kill_all(sparing=None if executor is None else executor.process)
        if executor is None:
            return set()
        # The executor's launcher, and the executor under it (PID 1 of the sandbox); or
        # runsc, and the gVisor sandbox under it (its kernel and its file server).
        return {executor.process.pid, *descendants(executor.process.pid)}

    async def stop(self) -> None:
        if self.executor is not None:
            await self._drop(self.executor)

    async def _current(self) -> Executor:
        """The sandbox's executor, started now if needed."""
        self.box.check_alive()
        async with self._lock:
            executor = self.executor
            if executor is not None and executor.alive:
                return executor
            if executor is not None:
                await self._drop(executor)
            self.executor = executor = await self._start()
            return executor

    async def _start(self) -> Executor:
        box = self.box
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            launch = self._resident.executor(
                box.layout, control=theirs.fileno(), cgroups=box.cgroup_files, nproc=box.meta.nproc
            )
            try:
                process = spawn(
                    launch.argv,
                    env=launch.env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    pass_fds=[*launch.fds, theirs.fileno()],
                    stdin=False,
                    stdin_fd=launch.stdin,
                )
            finally:
                launch.close()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        box.processes.add(process)
        ours.setblocking(False)
        executor = Executor(process, ours, grace=box.timeouts.cleanup)
        try:
            output = LaunchOutput(process.stderr)
            if not await output.started():
                returncode = await process.wait()
                box.check_alive()
                raise box.launch_error(returncode, output.launcher_output)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await executor.aclose()
                box.processes.discard(process)
            raise
        self._task_group.start_soon(self._keep, executor, name=f"executor {box.id}")
        return executor

    async def _keep(self, executor: Executor) -> None:
        """Serve the executor's answers until it goes; stop it once idle for ``idle``
        seconds (the next command starts a new one)."""
        idle = self._idle
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor.serve)
            while idle is not None and executor.alive:
                await anyio.sleep(max(0.0, executor.last_used + idle - anyio.current_time()))
                if executor.busy or anyio.current_time() - executor.last_used < idle:
                    continue
                async with self._lock:  # a command may just be asking for it
                    if not executor.busy:
                        await self._drop(executor)

    async def _drop(self, executor: Executor, *, abandon: bool = False) -> None:
        """Stop the executor (``abandon``: kill it, with its whole process tree, without
        asking: it stopped answering)."""
        if self.executor is executor:
            self.executor = None
        await (executor.abandon() if abandon else executor.aclose())
        if executor.process.returncode is not None:  # else the sandbox's removal kills it
            self.box.processes.discard(executor.process)
