"""The per-command path: every command has a launcher of its own (bubblewrap, the native
launcher, or none), which builds the sandbox's namespaces and view around it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio

from .._errors import InfrastructureError, InvalidArgument
from .._log import get_logger
from ._path import Path, Run, children
from ._spawn import Child, spawn

LAUNCHER_EXIT_GRACE = 3.0


class LauncherPath(Path):
    @asynccontextmanager
    async def started(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[Run]:
        box = self.box
        box.check_alive()
        try:
            launch = box.mechanism.launch(
                box.layout, argv, cwd=cwd, env=env, cgroups=box.cgroup_files
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        try:
            process = spawn(
                launch.argv,
                env=launch.env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                pass_fds=launch.fds,
                stdin=stdin,
            )
        finally:
            launch.close()
        box.processes.add(process)
        isolated = box.mechanism.isolated

        async def exited() -> int:
            returncode = await process.wait()
            if not isolated:  # no PID namespace: kill what is left of its process group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            if process.status_lost:
                raise InfrastructureError(
                    f"sandbox {box.id}: the command's exit status is lost: something else "
                    "in this process reaped its launcher (SIGCHLD is ignored here, or a "
                    "library waits for every child with waitpid(-1)); leave SIGCHLD at its "
                    "default"
                )
            return returncode

        run = Run(process.stdout, process.stderr, process.stdin)
        run.exited = exited
        try:
            if not await run.stderr.started():
                returncode = await process.wait()
                box.check_alive()  # the sandbox removed or expired under the launch
                raise box.launch_error(returncode, run.stderr.launcher_output)
            if run.stderr.launcher_output:
                get_logger().debug(
                    "process.launcher.output", output=run.stderr.launcher_output[-2000:]
                )
            yield run
        finally:
            # Shielded and bounded: every process of the command must be dead before we
            # return, even when our caller is being cancelled.
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(box.timeouts.cleanup),
            ):
                await _terminate(process)
            box.processes.discard(process)

    def busy(self) -> bool:
        return bool(self.box.processes)

    async def clear(self, *, keep: bool) -> set[int]:
        await self.box.kill_all()
        return set()


async def _terminate(process: Child) -> None:
    """Kill a launched command and everything in its PID namespace; return once all died.

    Our child is the launcher (bwrap or unshare); its child is the namespace's PID 1.
    Killing PID 1 makes the kernel kill every process of the namespace, and the launcher
    exits only after it has reaped PID 1, which happens only once the namespace is empty.
    (Killing just the launcher would work too, through --die-with-parent / --kill-child,
    but asynchronously: processes could outlive our return by a moment.)
    """
    if process.returncode is None:
        inner = children(process.pid)
        for pid in inner:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if inner:
            with anyio.move_on_after(LAUNCHER_EXIT_GRACE):
                await process.wait()
        if process.returncode is None:
            process.kill()
    await process.aclose()
