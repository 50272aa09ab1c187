"""The commands of one E2B sandbox (envd's ``process.Process``), on the public
:class:`asyncsandbox.Sandbox`.

* **A process outlives its request.** Each runs as one ``Sandbox.exec_stream`` in the
  server's task group, so a client that disconnects (a background command) can
  ``Connect`` to it again by pid or tag, ``List`` it, send it input or kill it. Its pid is
  this server's number for it (E2B's clients only hand it back to us). Removing the
  sandbox kills every process in it.
* **Output** is published to the requests that follow the process (the one that started
  it and any that connected), as envd sends it: from the moment they follow it.
* **Kill.** Any signal is delivered as the runtime's kill of the whole process tree
  (``SIGKILL``), which is what the SDKs send (``kill()``); a process killed so ends with
  ``signal: killed``, exit code -1, as envd reports it.
* **stdin** (``stdin=True``): the command reads a FIFO in the sandbox that a holder
  process keeps open for writing (from before the command starts: a ``SendInput``'s
  writer alone would give the command end of file after it); each ``SendInput`` writes
  to it with one command, in order; ``CloseStdin`` ends the holder, so the command reads
  end of file. Without ``stdin=True`` a command's stdin is empty (``/dev/null``).
* **PTY sessions** (``pty``): the command runs on a pseudo-terminal of ``_pty.py``'s in
  the sandbox, whose input is such a FIFO and whose output is the session's ``pty`` data;
  ``Update`` writes the new size to a second FIFO the relay reads.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import ObjectReceiveStream, TaskGroup
from anyio.streams.memory import MemoryObjectSendStream
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb
from protobuf import Oneof

from asyncsandbox import (
    ExecResult,
    ExecTimeout,
    InvalidArgument,
    Sandbox,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxNotFound,
)
from asyncsandbox.log import get_logger

__all__ = ("Proc", "Processes", "end_event")

log = get_logger("asyncsandbox.remote")

FIFO_DIR = "/tmp"
PTY_RELAY = Path(__file__).with_name("_pty.py").read_text()
BUFFERED_EVENTS = 64
"""Events buffered per follower; a follower that reads no faster slows the command."""
INPUT_TIMEOUT = 30.0
"""Longest a ``SendInput`` may wait for the command to take its input."""
MAX_PROCESSES = 256
"""Processes one sandbox may have at once."""
SIGNALS = {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}

Event = process_pb.ProcessEvent


def _event(name: str, value: object) -> Event:
    return Event(event=Oneof(name, value))  # type: ignore[arg-type]  # (a oneof by name)


def end_event(result: ExecResult | None, *, killed: bool = False, error: str = "") -> Event:
    """envd's end event: ``exit status N``, or ``signal: NAME`` with exit code -1."""
    if result is None:
        end = process_pb.ProcessEvent.EndEvent(
            exit_code=-1, exited=False, status="signal: killed" if killed else "error"
        )
        if error:
            end.error = error
        return _event("end", end)
    if result.signal is not None:
        name = SIGNALS.get(result.signal, f"signal {result.signal}")
        return _event(
            "end",
            process_pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=f"signal: {name}"),
        )
    return _event(
        "end",
        process_pb.ProcessEvent.EndEvent(
            exit_code=result.returncode, exited=True, status=f"exit status {result.returncode}"
        ),
    )


@dataclass(eq=False)
class Proc:
    """One process of a sandbox."""

    pid: int
    config: process_pb.ProcessConfig
    tag: str | None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    followers: list[MemoryObjectSendStream[Event]] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)
    end: Event | None = None
    fifo: str | None = None
    holder: anyio.CancelScope | None = None
    control: str | None = None
    """A PTY session's FIFO of sizes (see the module docstring)."""
    input_lock: anyio.Lock = field(default_factory=anyio.Lock)
    killed: bool = False
    gone: bool = False
    """The sandbox ended under the process (killed, paused, its timeout)."""

    def follow(self) -> ObjectReceiveStream[Event]:
        """A stream of this process's events from now on (its end, if it ended)."""
        send, receive = anyio.create_memory_object_stream[Event](BUFFERED_EVENTS)
        if self.end is not None:
            send.send_nowait(self.end)
            send.close()
        else:
            self.followers.append(send)
        return receive

    async def publish(self, event: Event) -> None:
        for follower in list(self.followers):
            try:
                await follower.send(event)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.followers.remove(follower)

    def finish(self, event: Event) -> None:
        self.end = event
        for follower in self.followers:
            # A follower that far behind, or gone, gets the end from follow() instead.
            with suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                follower.send_nowait(event)
            follower.close()
        self.followers.clear()
        self.done.set()

    def info(self) -> process_pb.ProcessInfo:
        info = process_pb.ProcessInfo(config=self.config, pid=self.pid)
        if self.tag is not None:
            info.tag = self.tag
        return info


class Processes:
    """The processes of one sandbox (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, task_group: Callable[[], TaskGroup]) -> None:
        self._sandbox = sandbox
        self._task_group = task_group
        self._procs: dict[int, Proc] = {}
        self._next_pid = 1000

    def list(self) -> list[Proc]:
        return [p for p in self._procs.values() if p.end is None]

    def find(self, selector: process_pb.ProcessSelector | None) -> Proc:
        """The running process a selector names (NOT_FOUND if none)."""
        match selector.selector if selector is not None else None:
            case Oneof(field="pid", value=pid):
                proc = self._procs.get(int(pid))
                if proc is not None and proc.end is None:
                    return proc
                raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
            case Oneof(field="tag", value=tag):
                for proc in self._procs.values():
                    if proc.tag == tag and proc.end is None:
                        return proc
                raise ConnectError(Code.NOT_FOUND, f"process with tag {str(tag)[:100]!r} not found")
        raise ConnectError(Code.INVALID_ARGUMENT, "a process selector (pid or tag) is required")

    async def start(
        self,
        config: process_pb.ProcessConfig,
        tag: str | None,
        *,
        stdin: bool,
        pty: process_pb.PTY | None = None,
        deadline: float = math.inf,
    ) -> tuple[Proc, ObjectReceiveStream[Event]]:
        """Start a process; return it and a stream of its events (its start first). At
        ``deadline`` (``anyio.current_time()``) its process tree is killed, whether or not
        its client still follows it."""
        if len(self.list()) >= MAX_PROCESSES:
            raise ConnectError(
                Code.RESOURCE_EXHAUSTED,
                f"the sandbox already runs {MAX_PROCESSES} processes; kill some first",
            )
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        argv = (config.cmd, *config.args)
        pid = self._next_pid
        self._next_pid += 1
        proc = Proc(pid=pid, config=config, tag=tag)
        proc.scope.deadline = deadline
        tg = self._task_group()
        try:
            if pty is not None:
                size = pty.size or process_pb.PTY.Size(cols=80, rows=24)
                rows, cols = min(max(size.rows, 1), 1000), min(max(size.cols, 1), 1000)
                proc.control = f"{FIFO_DIR}/.e2b-pty-{pid}-{secrets.token_hex(6)}"
                await self._command(("mkfifo", "-m", "600", proc.control))
                argv = (
                    "python3",
                    "-I",
                    "-S",
                    "-c",
                    PTY_RELAY,
                    str(rows),
                    str(cols),
                    proc.control,
                    *argv,
                )
                stdin = True
            if stdin:
                proc.fifo = f"{FIFO_DIR}/.e2b-stdin-{pid}-{secrets.token_hex(6)}"
                await self._command(("mkfifo", "-m", "600", proc.fifo))
                argv = ("sh", "-c", 'exec "$@" <"$0"', proc.fifo, *argv)
                # Held before anything can write to it: a writer alone would give the
                # command its input and then end of file.
                proc.holder = anyio.CancelScope()
                await tg.start(self._hold, proc.fifo, proc.holder)
        except BaseException:
            # Not started: nothing of it stays (its FIFOs, its holder).
            with anyio.CancelScope(shield=True):
                await self._release(proc)
            raise
        events = proc.follow()
        self._procs[pid] = proc
        await proc.publish(_event("start", process_pb.ProcessEvent.StartEvent(pid=pid)))
        await tg.start(self._run, proc, argv)
        return proc, events

    async def _command(self, argv: tuple[str, ...], stdin: bytes | None = None) -> None:
        try:
            result = await self._sandbox.exec(argv, stdin=stdin)
        except SandboxError as exc:
            raise ConnectError(Code.UNAVAILABLE, f"the sandbox could not run it: {exc}") from None
        if result.returncode != 0:
            detail = result.stderr_text.strip()[:300]
            raise ConnectError(Code.INTERNAL, f"{argv[0]} failed in the sandbox: {detail}")

    async def _hold(
        self,
        fifo: str,
        scope: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep the FIFO open for writing until ``scope`` is cancelled (end of input);
        started once it is open. (Opened for reading too, which on Linux does not wait
        for the command to open it.) Raises :class:`ConnectError` (``UNAVAILABLE``) if it
        cannot be held: the command is then not started, as its input would end early."""
        hold = 'exec 3<>"$0"; echo; exec sleep 2147483647'
        held = False
        with scope:
            try:
                async with self._sandbox.exec_stream(("sh", "-c", hold, fifo)) as stream:
                    async for chunk in stream:
                        if chunk.stream == "stdout":  # its line: the FIFO is held
                            held = True
                            break
                    if not held:
                        ended = await stream.wait()
                        why = ended.stderr_text.strip()[-300:] or f"exit status {ended.returncode}"
                        raise _unheld(why)
                    task_status.started()
                    await stream.wait()
            except SandboxError as exc:
                if not held:
                    raise _unheld(f"{type(exc).__name__}: {exc}") from None
                # (The sandbox ended under it: so does the command.)
                log.debug("remote.e2b.stdin_holder_ended", error=str(exc))
        if not held:  # cancelled before it held the FIFO (the start's caller was)
            raise _unheld("cancelled")

    async def _run(
        self,
        proc: Proc,
        argv: tuple[str, ...],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        config = proc.config
        result: ExecResult | None = None
        error = ""
        task_status.started()
        with proc.scope:
            try:
                async with self._sandbox.exec_stream(
                    argv,
                    cwd=config.cwd if config.has_field("cwd") and config.cwd else None,
                    env=dict(config.envs),
                    max_output_bytes=1,  # the output goes to the followers; keep none here
                ) as stream:
                    async for chunk in stream:
                        # (A PTY session's terminal output is its relay's stdout.)
                        kind = "pty" if proc.control is not None else chunk.stream
                        output = Oneof(kind, chunk.data)
                        data = process_pb.ProcessEvent.DataEvent(output=output)  # type: ignore[arg-type]
                        await proc.publish(_event("data", data))
                    try:
                        result = await stream.wait()
                    except ExecTimeout as exc:
                        result = exc.result
            except InvalidArgument as exc:
                error = str(exc)
            except (SandboxClosed, SandboxDied, SandboxNotFound) as exc:
                proc.gone = True
                error = f"{type(exc).__name__}: {exc}"
            except SandboxError as exc:
                error = f"{type(exc).__name__}: {exc}"
        if proc.scope.cancelled_caught:
            result = None
        proc.finish(end_event(result, killed=result is None and not error, error=error))
        with anyio.CancelScope(shield=True):
            await self._release(proc)

    async def _release(self, proc: Proc) -> None:
        # Shielded by the caller: the FIFO and its holder go with the process even when
        # the server is shutting down (bounded: removing a file).
        if proc.holder is not None:
            proc.holder.cancel()
        fifos = tuple(f for f in (proc.fifo, proc.control) if f is not None)
        if fifos:
            # (SandboxError: the sandbox is gone, and its files with it)
            with anyio.move_on_after(5), suppress(SandboxError):
                await self._sandbox.exec(("rm", "-f", *fifos))
        self._procs.pop(proc.pid, None)

    async def kill(self, proc: Proc) -> None:
        """Kill the process tree and wait until it is gone."""
        proc.killed = True
        proc.scope.cancel()
        await proc.done.wait()

    async def send_input(self, proc: Proc, data: bytes) -> None:
        if proc.fifo is None:
            raise ConnectError(
                Code.FAILED_PRECONDITION,
                "the process was not started with stdin=True; its stdin is closed",
            )
        if proc.holder is not None and proc.holder.cancel_called:
            raise ConnectError(Code.FAILED_PRECONDITION, "the process's stdin was closed")
        async with proc.input_lock:
            # Writing blocks while the process does not read (a full pipe); the process's
            # end or the deadline stops it.
            with anyio.move_on_after(INPUT_TIMEOUT) as deadline:
                async with anyio.create_task_group() as tg:

                    async def stop_at_end() -> None:
                        await proc.done.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(stop_at_end)
                    await self._command(("sh", "-c", 'exec cat >"$0"', proc.fifo), stdin=data)
                    tg.cancel_scope.cancel()
            if deadline.cancelled_caught:
                raise ConnectError(
                    Code.DEADLINE_EXCEEDED,
                    f"the process did not read its input within {INPUT_TIMEOUT:g}s",
                )

    async def resize(self, proc: Proc, rows: int, cols: int) -> None:
        """Give a PTY session's terminal another size."""
        if proc.control is None:
            raise ConnectError(Code.FAILED_PRECONDITION, "the process has no PTY")
        rows, cols = min(max(rows, 1), 1000), min(max(cols, 1), 1000)
        line = 'printf "%s %s\\n" "$1" "$2" >"$0"'
        with anyio.move_on_after(INPUT_TIMEOUT):
            await self._command(("sh", "-c", line, proc.control, str(rows), str(cols)))

    def close_stdin(self, proc: Proc) -> None:
        if proc.holder is None:
            raise ConnectError(
                Code.FAILED_PRECONDITION, "the process was not started with stdin=True"
            )
        proc.holder.cancel()

    async def kill_all(self) -> None:
        for proc in list(self._procs.values()):
            proc.scope.cancel()


def _unheld(why: str) -> ConnectError:
    return ConnectError(
        Code.UNAVAILABLE,
        f"the sandbox could not hold the command's stdin open, so it was not started: {why}",
    )


async def follow(
    proc: Proc,
    events: ObjectReceiveStream[Event],
    *,
    keepalive: float,
    deadline: float,
    on_deadline: Callable[[], Awaitable[None]],
) -> AsyncIterator[Event]:
    """Yield a process's events as they come, a keepalive after ``keepalive`` seconds of
    silence (a client that left is noticed at the next one), until its end; at
    ``deadline`` (``anyio.current_time()``), call ``on_deadline`` and raise
    DEADLINE_EXCEEDED."""
    async with events:
        while True:
            now = anyio.current_time()
            if now >= deadline:
                await on_deadline()
                raise ConnectError(Code.DEADLINE_EXCEEDED, "the request's deadline was exceeded")
            event: Event | None = None
            ended = False
            with anyio.move_on_after(min(keepalive, deadline - now)):
                try:
                    event = await events.receive()
                except anyio.EndOfStream:
                    ended = True
            if ended:
                # The end was not delivered to this follower (it was too far behind).
                if proc.end is not None:
                    _check_gone(proc)
                    yield proc.end
                return
            if event is None:
                if anyio.current_time() < deadline:
                    yield _event("keepalive", process_pb.ProcessEvent.KeepAlive())
                continue
            if event.event is not None and event.event.field == "end":
                _check_gone(proc)
                yield event
                return
            yield event


def _check_gone(proc: Proc) -> None:
    if proc.gone:
        # As envd's stream ends when its sandbox goes: the client probes the sandbox and
        # reports it ended (502 "was not found").
        raise ConnectError(
            Code.UNAVAILABLE, "the connection to the sandbox ended before the stream completed"
        )
