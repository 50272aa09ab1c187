"""The processes the backend starts (launchers, executors), and the pipes to them.

They are forked here, by the thread that runs the event loop, never by a worker thread: a
launcher dies with the *thread* that forked it (``PR_SET_PDEATHSIG``, which bubblewrap's
``--die-with-parent`` uses too, fires when the parent thread exits, not the process).
anyio's ``open_process`` on trio forks in a worker thread, which exits after ten idle
seconds: every command that ran longer was killed with status 137. The event loop's thread
outlives every process the backend starts (the backend kills them all before it lets go),
and a fork is what asyncio's subprocesses cost the loop anyway (``vfork``, then ``exec``).

A child is reaped through its pidfd (readable once it exited), without a thread per child;
its pipes are read and written without blocking the loop, on asyncio and trio alike.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from ..abc import OutputCallback
from ._isolation import ChunkSource

READ_CHUNK = 256 * 1024
LOST = 255  # the exit status of a child that something else reaped (asyncio's figure too)
_POLL_INTERVAL = 0.01  # where the kernel has no pidfds (before Linux 5.3)


class Watched:
    """A descriptor that tasks wait on (readable or writable), and that may be closed while
    they wait.

    Closing a descriptor under a waiting task is not safe on anyio's asyncio backend: the
    woken task unregisters the descriptor's *number* once it resumes, and by then the
    number can belong to a new descriptor that another task waits on, which then never
    wakes (a new executor's stderr pipe was waited on forever). So :meth:`close` wakes
    the waiters (``notify_closing``) and the last of them to leave closes it.
    """

    def __init__(self, fd: int, release: Callable[[], None]) -> None:
        self.fd: int | None = fd
        self._release = release
        self._waiters = 0

    @property
    def closed(self) -> bool:
        return self.fd is None

    async def readable(self) -> bool:
        """Wait until it is readable; False if it was closed first."""
        return await self._wait(anyio.wait_readable)

    async def writable(self) -> bool:
        """Wait until it is writable; False if it was closed first."""
        return await self._wait(anyio.wait_writable)

    async def _wait(self, wait: Callable[[int], Awaitable[None]]) -> bool:
        if self.fd is None:
            return False
        self._waiters += 1
        try:
            await wait(self.fd)
        except anyio.ClosedResourceError:
            return False
        finally:
            self._waiters -= 1
            if self.closed and not self._waiters:
                self._release()  # closed while we waited: we were the last
        return not self.closed

    def close(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        if self._waiters:
            anyio.notify_closing(fd)  # they leave with ClosedResourceError; the last closes it
        else:
            self._release()


class Pipe:
    """One end of a pipe, read or written without blocking the event loop (asyncio and
    trio alike)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = Watched(fd, functools.partial(os.close, fd))

    @property
    def closed(self) -> bool:
        return self._fd.closed

    async def receive(self) -> bytes | None:
        """A chunk, or None at end of stream (or once closed)."""
        while (fd := self._fd.fd) is not None:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                await self._fd.readable()
                continue
            return data or None
        return None

    async def send(self, data: bytes) -> None:
        """Write all of ``data`` (or until closed); raise ``BrokenPipeError`` if the reader
        went away."""
        view = memoryview(data)
        while view and (fd := self._fd.fd) is not None:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                await self._fd.writable()
                continue
            view = view[written:]

    def close(self) -> None:
        self._fd.close()


class Child:
    """A process we forked, with our ends of its stdin (if asked for), stdout and stderr."""

    def __init__(
        self, popen: subprocess.Popen[bytes], stdin: Pipe | None, stdout: Pipe, stderr: Pipe
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError:  # no pidfds here: wait() polls
            self._pidfd: Watched | None = None
        else:
            self._pidfd = Watched(pidfd, functools.partial(os.close, pidfd))
        self._watching: anyio.Event | None = None
        self.status_lost = False

    @property
    def returncode(self) -> int | None:
        """Its exit status (-N: killed by signal N) once reaped, else None."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Its exit status, once it exited (any number of tasks may wait)."""
        while (code := self._poll()) is None:
            watching = self._watching
            if watching is not None:  # another task watches the pidfd (one may, at a time)
                await watching.wait()
                continue
            self._watching = watching = anyio.Event()
            try:
                if self._pidfd is None:
                    await anyio.sleep(_POLL_INTERVAL)
                else:
                    await self._pidfd.readable()
            finally:
                self._watching = None
                watching.set()
        if self._pidfd is not None:
            self._pidfd.close()
        return code

    def _poll(self) -> int | None:
        """Its exit status if it exited (reaping it), else None; :data:`LOST` (and
        :attr:`status_lost`) if something else in this process reaped it, where
        ``Popen.poll`` would say 0 for a status nobody can know."""
        if self._popen.returncode is None:
            try:
                exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # SIGCHLD ignored, or someone's waitpid(-1)
                self.status_lost = True
                self._popen.returncode = LOST
            else:
                if exited is None:
                    return None
        return self._popen.poll()

    def kill(self) -> None:
        """SIGKILL it (never another process that took its pid: the pidfd names it)."""
        pidfd = self._pidfd.fd if self._pidfd is not None else None
        if pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        elif self._popen.returncode is None:
            self._popen.kill()

    async def aclose(self) -> None:
        """Close our ends of its pipes and wait for it (kill it first to not wait long)."""
        for pipe in (self.stdin, self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        await self.wait()


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    stdin: bool,
    stdin_fd: int | None = None,
) -> Child:
    """Fork and exec ``argv`` in a session of its own, from this (the event loop's) thread.
    ``stdin``: a pipe to its stdin, ours to write; else ``stdin_fd`` (kept by the caller)
    or ``/dev/null``."""
    ours: list[int] = []
    theirs: list[int] = []
    try:
        for _ in range(3 if stdin else 2):
            read, write = os.pipe2(os.O_CLOEXEC)
            ours.append(read)
            theirs.append(write)
        if stdin:  # the child reads its end; we write ours
            ours[2], theirs[2] = theirs[2], ours[2]
        popen = subprocess.Popen(
            list(argv),
            stdin=theirs[2] if stdin else subprocess.DEVNULL if stdin_fd is None else stdin_fd,
            stdout=theirs[0],
            stderr=theirs[1],
            env=dict(env),
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return Child(popen, Pipe(ours[2]) if stdin else None, Pipe(ours[0]), Pipe(ours[1]))


async def pump(source: ChunkSource, name: Any, on_output: OutputCallback) -> None:
    """Hand each chunk of ``source`` (a :class:`Pipe`, or anything with its ``receive``) to
    ``on_output`` until its end."""
    while (chunk := await source.receive()) is not None:
        await on_output(name, chunk)


async def feed(pipe: Pipe, data: bytes) -> None:
    """Write ``data`` to a command's stdin, then close it."""
    try:
        await pipe.send(data)
    except BrokenPipeError:
        pass  # the command exited without reading all its input: not an error
    finally:
        pipe.close()
