"""The fast path: commands through the sandbox's resident executor, not the daemon.

An Engine API exec costs three daemon round trips (create, start, inspect) and saturates
near 36/s on a 2-core machine whatever the concurrency. The executor (:data:`PROGRAM`:
``_agent_executor.py`` with the agent, ``_agent.py``) is the container's main process; the
host attaches to its stdio before the container starts, and from then on a command is a
frame on that open stream and a fork inside the container. Frames are described in
``_agent_executor.py``; this module is the host side: one reader task per sandbox routes
frames to the jobs waiting for them.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any, Self

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from asyncsandbox import (
    BackendUnavailable,
    InfrastructureError,
    LaunchError,
    SandboxDied,
    SandboxError,
)
from asyncsandbox.abc import ExitStatus, OutputCallback
from asyncsandbox.log import get_logger

from ._api_path import AGENT
from ._engine import Engine, Hijacked

_EXECUTOR = files(__package__).joinpath("_agent_executor.py").read_text()
PROGRAM = f"""import sys, types
agent = types.ModuleType("agent")
exec(compile({AGENT!r}, "asyncsandbox_docker/_agent.py", "exec"), agent.__dict__)
executor = types.ModuleType("executor")
executor.agent = agent
exec(compile({_EXECUTOR!r}, "asyncsandbox_docker/_agent_executor.py", "exec"), executor.__dict__)
executor.main(sys.argv[1:])
"""
"""The container's main process on the fast path, ``python3 -I -S -u -c PROGRAM serve ...``:
the agent (the shepherd every command runs under) as the module ``agent``, then the
executor (``_agent_executor.py``), which is given it."""

FRAME = struct.Struct(">BII")
START, STDIN, STDIN_EOF, KILL = 1, 2, 3, 4
READY, STDOUT, STDERR, EXIT, FAILED = 10, 11, 12, 13, 14
READY_DEADLINE = 30.0
CHUNK = 256 * 1024

_KILLED = {"returncode": 137, "signal": 9, "oom": False}
SIGKILL = 9

log = get_logger("asyncsandbox.docker")


def _status(payload: bytes) -> dict[str, Any]:
    """A job's end as the executor reported it: the command's exit status (``returncode``,
    ``signal``, ``oom``), or ``launch_error`` (it never ran), or ``lost`` (its shepherd died
    without a word: how)."""
    try:
        status = json.loads(payload)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return {"lost": f"sent an unreadable status {payload[:200]!r}"}
    if status.get("lost") is not None and status.get("signal") == SIGKILL:
        # SIGKILLed: by the OOM killer (the command's tree exhausted its memory) or by a
        # command running as root. The command's tree died with it: as before, that is
        # the command's outcome (the host asks Docker about an OOM kill).
        return dict(_KILLED)
    return status


def _no_exit_status(sandbox_id: str, status: dict[str, Any]) -> SandboxError:
    """The error for a job that ended without the command's exit status."""
    if "launch_error" in status:
        return LaunchError(
            f"sandbox {sandbox_id}: the command could not be started: {status['launch_error']}",
            retryable=bool(status.get("retryable")),
        )
    # Only a crash of our own shepherd gets here (it reports every failure it can catch).
    return InfrastructureError(
        f"sandbox {sandbox_id}: the command's exit status was lost: its shepherd "
        f"{status.get('lost', 'ended')} without reporting it",
        retryable=False,
    )


class Job:
    """One command running under the executor. Iterate it for ``(stream, data)``."""

    def __init__(
        self, executor: Executor, job_id: int, frames: MemoryObjectReceiveStream[tuple[int, bytes]]
    ) -> None:
        self._executor = executor
        self.id = job_id
        self._frames = frames
        self.status: dict[str, Any] | None = None
        self.stderr = bytearray()

    async def send(self, data: bytes) -> None:
        for offset in range(0, len(data), CHUNK):
            await self._executor._send(STDIN, self.id, data[offset : offset + CHUNK])

    async def close_stdin(self) -> None:
        await self._executor._send(STDIN_EOF, self.id)

    def __aiter__(self) -> Job:
        return self

    async def __anext__(self) -> tuple[int, bytes]:
        """The next output chunk; ends when the command ended."""
        if self.status is not None:
            raise StopAsyncIteration
        try:
            kind, payload = await self._frames.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise self._executor.broken() from None
        if kind in (EXIT, FAILED):
            # FAILED: the executor could not fork the command's shepherd. Either way the job
            # is over (nothing to kill); a command that never ran has no exit status.
            self.status = _status(payload)
            if "returncode" not in self.status:
                raise _no_exit_status(self._executor._sandbox_id, self.status)
            raise StopAsyncIteration
        return kind, payload

    async def wait(self) -> dict[str, Any]:
        async for kind, data in self:
            if kind == STDERR:
                self.stderr.extend(data[: max(0, 4096 - len(self.stderr))])
        assert self.status is not None
        return self.status


class JobProcess:
    """A :class:`Job` seen as an ``InteractiveProcess``: its stdout as it comes, its
    stderr collected (the first 4 KiB)."""

    def __init__(self, job: Job) -> None:
        self._job = job

    async def send(self, data: bytes) -> None:
        await self._job.send(data)

    async def close_stdin(self) -> None:
        await self._job.close_stdin()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        while (item := await self._next()) is not None:
            kind, data = item
            if kind == STDOUT:
                return data
            self._job.stderr.extend(data[: max(0, 4096 - len(self._job.stderr))])
        raise StopAsyncIteration

    async def _next(self) -> tuple[int, bytes] | None:
        try:
            return await anext(self._job)
        except StopAsyncIteration:
            return None

    async def wait(self) -> tuple[int, bytes]:
        async for _ in self:
            pass
        assert self._job.status is not None
        return int(self._job.status["returncode"]), bytes(self._job.stderr)


class ShellJob(JobProcess):
    """A file operation's script: file operations have no deadline (they may move
    gigabytes), but their scripts are never silent for long: when nothing at all came from
    the executor for a call deadline while one waits, the executor (or the daemon relaying
    it) has stalled, and waiting longer would wait forever. (The code interpreter's runner,
    a plain :class:`JobProcess`, may be silent as long as it likes.)
    """

    async def _next(self) -> tuple[int, bytes] | None:
        executor = self._job._executor
        while True:
            deadline = executor._engine.timeouts.operation
            if deadline is None:  # no limit: wait as long as it takes
                return await super()._next()
            with anyio.move_on_after(deadline):
                return await super()._next()
            if executor.silent_for() >= deadline:
                raise await executor.stalled()


class Executor:
    """The host side of one sandbox's executor."""

    def __init__(self, engine: Engine, sandbox_id: str) -> None:
        self._engine = engine
        self._sandbox_id = sandbox_id
        self._stream: Hijacked | None = None
        self._write_lock = anyio.Lock()
        self._jobs: dict[int, MemoryObjectSendStream[tuple[int, bytes]]] = {}
        self._next_id = 1
        self._ready = anyio.Event()
        self._failure: str | None = None
        self._closed = False
        self._exited = False
        self._removing = False
        self._reading_since: float | None = None  # when the reader began waiting for bytes

    @property
    def failure(self) -> str | None:
        """Why the executor stopped serving (None while it serves)."""
        return self._failure

    @property
    def exited(self) -> bool:
        """Whether the executor's output ended: it, the container's main process, exited
        (so the container is stopping, or stopped)."""
        return self._exited

    @property
    def usable(self) -> bool:
        """False once the executor failed: commands then take the Engine API path."""
        return self._failure is None and not self._closed

    def broken(self) -> SandboxError:
        return BackendUnavailable(
            f"lost the connection to sandbox {self._sandbox_id}'s executor: {self._failure or 'closed'}"
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Attach to the (created, not yet started) container's stdio, report that through
        ``task_status``, then route the executor's frames until it ends. A task of the
        backend; an attach failure is raised to the one who started it."""
        buffer = bytearray()
        started = False
        try:
            self._stream = stream = self._engine.attach_stream(self._sandbox_id)
            await stream.connect()
            task_status.started()
            started = True
            while not self._closed:
                self._reading_since = anyio.current_time()
                message = await stream.read()
                self._reading_since = None
                if message is None:
                    self._exited = True
                    break
                kind, data = message
                if kind != 1:
                    # The executor's own stderr: a crash report, or the runtime's start error.
                    self._failure = data.decode(errors="replace").strip()[-500:]
                    continue
                buffer += data
                await self._dispatch(buffer)
            self._failure = self._failure or "the executor exited"
        except SandboxError as exc:
            if not started:
                raise BackendUnavailable(
                    f"cannot attach to sandbox {self._sandbox_id}: {exc}"
                ) from exc
            self._failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._closed = True
            self._ready.set()  # waiters see the failure
            for channel in list(self._jobs.values()):
                channel.close()
            if self._stream is not None:
                with anyio.CancelScope(shield=True):
                    await self._stream.close()

    async def _dispatch(self, buffer: bytearray) -> None:
        while len(buffer) >= FRAME.size:
            kind, job_id, length = FRAME.unpack_from(buffer)
            if len(buffer) < FRAME.size + length:
                return
            payload = bytes(buffer[FRAME.size : FRAME.size + length])
            del buffer[: FRAME.size + length]
            if kind == READY:
                self._ready.set()
                continue
            channel = self._jobs.get(job_id)
            if channel is not None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await channel.send((kind, payload))  # backpressure from a slow reader

    def _give_up(self, failure: str) -> None:
        """The executor no longer answers: wake every job waiting on it (their channels
        end, and they fail) instead of leaving them hanging."""
        self._failure = failure
        for channel in list(self._jobs.values()):
            channel.close()

    def silent_for(self) -> float:
        """Seconds the reader has been waiting for the executor's next bytes (0 while it
        delivers frames: a slow consumer is not a silent executor)."""
        since = self._reading_since
        return 0.0 if since is None else anyio.current_time() - since

    async def stalled(self) -> SandboxError:
        """Give up on an executor that stopped answering: fail every job waiting on it (the
        sandbox's commands take the Engine API path from now on) and say why."""
        self._give_up(f"the executor sent nothing for {self.silent_for():.0f}s")
        log.warning("docker.executor.stalled", sandbox_id=self._sandbox_id)
        return await self._engine.diagnose("a file operation", self._sandbox_id)

    async def _send(self, kind: int, job_id: int, payload: bytes = b"") -> None:
        stream = self._stream
        if stream is None or self._closed:
            raise self.broken()
        async with self._write_lock:
            # Shielded (bounded by the call deadline, or by the cleanup deadline where calls
            # have none): a frame cut short by a cancellation would corrupt the stream for
            # every job of the sandbox.
            timeouts = self._engine.timeouts
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(
                    timeouts.cleanup if timeouts.operation is None else timeouts.operation
                ) as scope,
            ):
                try:
                    await stream.write(FRAME.pack(kind, job_id, len(payload)) + payload)
                except BackendUnavailable as exc:
                    raise BackendUnavailable(
                        f"writing to sandbox {self._sandbox_id}'s executor failed: {exc}"
                    ) from exc
            if scope.cancelled_caught:
                self._failure = "writing to the executor timed out"
                raise self.broken()

    async def wait_ready(self) -> bool:
        """Wait until the executor answered (True) or failed (False)."""
        with anyio.move_on_after(READY_DEADLINE):
            await self._ready.wait()
        return self.usable and self._ready.is_set()

    @asynccontextmanager
    async def open(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[Job]:
        """Start a command; leaving the block before it ended kills its whole tree."""
        job_id, self._next_id = self._next_id, self._next_id + 1
        send, receive = anyio.create_memory_object_stream[tuple[int, bytes]](64)
        self._jobs[job_id] = send
        job = Job(self, job_id, receive)
        sent = cancelled = False
        try:
            spec = {"argv": list(argv), "cwd": cwd, "env": dict(env), "stdin": stdin}
            await self._send(START, job_id, json.dumps(spec).encode())
            sent = True
            try:
                yield job
            except anyio.get_cancelled_exc_class():
                cancelled = True
                raise
        finally:
            try:
                # Not sent (cancelled while waiting to write): the executor never heard of
                # the job, and would never answer a KILL for it.
                if sent and job.status is None and self.usable:
                    # Shielded and bounded: the command's tree must die before we leave.
                    with (
                        anyio.CancelScope(shield=True),
                        anyio.move_on_after(self._engine.timeouts.cleanup) as scope,
                        contextlib.suppress(SandboxError),
                    ):
                        await self._send(KILL, job_id)
                        await job.wait()
                    if scope.cancelled_caught:
                        self._give_up("a command could not be killed")
                        raise SandboxDied(
                            self._sandbox_id, "lost: the executor did not kill a command"
                        )
                if sent and job.status is None and cancelled and not self._removing:
                    # Cancelled (the command's timeout, or the caller) and the executor no
                    # longer answers: the command's end is unknown, and letting the
                    # cancellation through would pass it off as killed (a timeout would be
                    # scored as the command's). Say what happened instead. (Unless the
                    # sandbox is being removed: the command ends with it.)
                    raise self.broken()
            finally:  # also when raising: the job's channels must not leak
                del self._jobs[job_id]
                send.close()
                receive.close()

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
    ) -> tuple[ExitStatus, bool]:
        """Run a command to completion; also return whether the executor judged the
        SIGKILL an OOM kill (False if it could not tell)."""
        async with self.open(argv, cwd=cwd, env=env, stdin=stdin is not None) as job:
            if stdin is not None:
                await job.send(stdin)
                await job.close_stdin()
            async for kind, data in job:
                await on_output("stdout" if kind == STDOUT else "stderr", data)
            status = job.status
        assert status is not None
        signal = status.get("signal")
        cpu = status.get("cpu")
        exit_status = ExitStatus(
            returncode=int(status["returncode"]),
            signal=signal,
            cpu_time=float(cpu) if isinstance(cpu, int | float) else None,
        )
        return exit_status, bool(status.get("oom"))

    async def aclose(self) -> None:
        """Stop serving: the sandbox is being removed (its commands end with it)."""
        self._closed = self._removing = True
        if self._stream is not None:
            with anyio.CancelScope(shield=True):
                await self._stream.close()
