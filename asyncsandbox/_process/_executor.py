"""The process backend's fast path: one resident executor per sandbox.

Without it, every command builds the sandbox's namespaces and filesystem view afresh (a
launcher per command, ~10-25 ms). With it, the native launcher builds them once, when the
sandbox first runs something, and stays as the sandbox's init (``_resident.serve``): a
command then costs a ``posix_spawn`` in the sandbox plus a few messages on sockets (a fork
only when no command init is idle), and its output goes straight from the command to us
through pipes it was handed.

Trust model (what a command can and cannot do to the executor):

* The executor is PID 1 of the sandbox's PID namespace; every command runs in a PID and
  mount namespace of its own below it, with its own ``/proc``, under an init of its own
  (PID 1 there): it cannot see the executor, nor another command, so it cannot signal,
  trace (seccomp denies ``ptrace`` anyway) or read them. The executor and the inits are
  not dumpable, and hold their sockets close-on-exec: no command ever has one, so none
  can forge a request or an answer.
* A command init runs one command at a time. Once its command has exited and it has
  killed and reaped everything the command left, its namespace holds nothing but itself;
  only then does it say the command's exit status, and only then may the executor hand it
  the sandbox's next command (a command costs a message and a ``posix_spawn`` then, not a
  fork of an interpreter and a new namespace). It shed its capabilities and loaded the
  seccomp filter before its first command, so it holds nothing a command lacks; a
  command cannot change its namespaces (no capability, no mount, no ``setns``) and only
  the signals it handles reach it (it forwards them to the command). What a process of
  the same user can still change in it without either (its scheduling: niceness, policy,
  CPUs, I/O priority, time slice; its resource limits, lowered with ``prlimit``) it
  compares after each command with what it had before the first, and exits instead of
  running another if any differs. So the next command finds what a fresh init would give
  it, but a higher PID.
* A command's exit status comes from its init (which reaps it, forwards signals and kills
  what it left), written on a close-on-exec socket that the command never holds; or, if
  that init died first, from the executor's ``waitpid`` of it. Never from anything the
  command says; the only thing read from the command's stderr is whether it got as far
  as being started (the launcher's protocol), and the marker is written by our code
  before the command exists.
* A timeout or a cancellation asks the executor to kill the command's init (and with it
  the namespace, and everything in it); if the executor does not confirm within
  ``Timeouts.cleanup`` it is given up: killed from the host at once, with every process
  under it (every command of the sandbox; with gVisor, the whole gVisor sandbox: runsc,
  its kernel and its file server, which may be what stopped answering), and the sandbox
  goes on through a new one. So the exec ends within its timeout plus the cleanup
  deadline, however the executor hangs.
* The sandbox's files, ``/tmp``, ``/dev/shm`` and network namespace are shared by its
  commands (as in a container): one episode, one trust domain. Between sandboxes nothing
  is shared, exactly as on the per-command path.
* When the backend's process dies or closes the socket, the executor kills every command
  and exits; so does it when the sandbox is removed.
"""

from __future__ import annotations

import array
import contextlib
import marshal
import os
import signal
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from .._errors import InfrastructureError, LaunchError
from ._path import descendants
from ._spawn import Child, Watched


class ExecutorGone(InfrastructureError):
    """The executor died or stopped answering; the commands it ran died with it."""


class _Command:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.exit: int | None = None
        self.cpu: float | None = None  # its CPU seconds, when its init could say
        self.error: str | None = None


class Executor:
    """The host side of one sandbox's resident executor.

    :param grace: seconds it may take to stop when asked (:meth:`aclose`), and to be
        reaped once killed (the backend's ``Timeouts.cleanup``)."""

    def __init__(self, process: Child, control: socket.socket, *, grace: float) -> None:
        self.process = process
        self._grace = grace
        self._control = control
        self._watched = Watched(control.fileno(), control.close)
        self._commands: dict[int, _Command] = {}
        self._next_id = 0
        self._send_lock = anyio.Lock()
        self._gone: str | None = None
        self.last_used = anyio.current_time()

    @property
    def alive(self) -> bool:
        return self._gone is None

    @property
    def busy(self) -> bool:
        return bool(self._commands)

    async def serve(self) -> None:
        """Read the executor's answers until it goes (run in a task group)."""
        try:
            while await self._watched.readable():
                try:
                    data = self._control.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self._give_up(f"the control socket failed: {exc!r}")
                    return
                if not data:
                    self._give_up("the executor exited")
                    return
                answer: dict[str, Any] = marshal.loads(data)
                command = self._commands.get(answer["id"])
                if command is not None:
                    command.exit = answer.get("exit")
                    command.cpu = answer.get("cpu")
                    command.error = answer.get("error")
                    command.done.set()
        finally:
            if self._gone is None:
                self._give_up("the executor was closed")

    def _give_up(self, why: str) -> None:
        if self._gone is None:
            self._gone = why
        for command in self._commands.values():
            command.done.set()

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: int,
        stdout: int,
        stderr: int,
    ) -> _Command:
        """Ask the executor to run a command on these descriptors (ours to close)."""
        self._check()
        self._next_id += 1
        command_id = self._next_id
        command = self._commands[command_id] = _Command()
        request = {"op": "run", "id": command_id, "argv": list(argv), "env": dict(env), "cwd": cwd}
        try:
            await self._send(marshal.dumps(request), [stdin, stdout, stderr])
        except BaseException:
            self._commands.pop(command_id, None)
            raise
        command.id = command_id  # type: ignore[attr-defined]
        self.last_used = anyio.current_time()
        return command

    async def wait(self, command: _Command) -> int:
        """The command's exit status, once its namespace is empty."""
        try:
            await command.done.wait()
        finally:
            self.last_used = anyio.current_time()
        self._commands.pop(command.id, None)  # type: ignore[attr-defined]
        if command.error is not None:
            raise LaunchError(
                f"the sandbox's executor could not start the command: {command.error}"
            )
        if command.exit is None:
            raise ExecutorGone(
                f"the sandbox's executor went away while the command ran ({self._gone}"
                f"{await self._how_it_ended()}); the command was killed with it"
            )
        return command.exit

    async def _how_it_ended(self) -> str:
        """How the executor's launcher ended, once reaped (within the grace), for the
        error: its exit status, or the signal that killed the executor (the launcher
        exits 128+N when its child, the executor, was killed by signal N) or itself."""
        with anyio.move_on_after(self._grace):
            await self.process.wait()
        code = self.process.returncode
        if code is None or self.process.status_lost:
            return ""
        number = -code if code < 0 else code - 128
        try:
            return f": killed by {signal.Signals(number).name}"
        except ValueError:
            return f": exit status {code}"

    async def reset(self) -> None:
        """Kill every command, and give the next ones fresh IPC and network namespaces
        and an empty ``/dev/shm`` (see ``_resident.reset``); raise :class:`ExecutorGone` (or
        :class:`InfrastructureError`, with why) if it could not."""
        self._check()
        self._next_id += 1
        reset_id = self._next_id
        reset = self._commands[reset_id] = _Command()
        try:
            await self._send(marshal.dumps({"op": "reset", "id": reset_id}), [])
            await reset.done.wait()
        finally:
            self._commands.pop(reset_id, None)
        self._check()
        if reset.error is not None:
            raise InfrastructureError(f"the executor could not reset the sandbox: {reset.error}")

    async def kill(self, command: _Command) -> None:
        """Kill the command's whole tree; return once the executor says it is gone."""
        if command.done.is_set() or self._gone is not None:
            return
        with contextlib.suppress(OSError):
            await self._send(marshal.dumps({"op": "kill", "id": command.id}), [])  # type: ignore[attr-defined]
        await command.done.wait()

    async def _send(self, data: bytes, fds: list[int]) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        async with self._send_lock:
            while True:
                self._check()
                try:
                    self._control.sendmsg([data], ancillary)
                    return
                except BlockingIOError:
                    await self._watched.writable()  # closed: _check() says why
                except OSError as exc:
                    self._give_up(f"the control socket failed: {exc}")
                    self._check()

    def _check(self) -> None:
        if self._gone is not None:
            raise ExecutorGone(f"the sandbox's executor is gone ({self._gone})")

    async def aclose(self) -> None:
        """Stop the executor (it kills every command and exits) and reap it; if it has not
        exited within the grace, kill it as :meth:`abandon` does."""
        await self._close("the executor was closed", grace=self._grace)

    async def abandon(self) -> None:
        """Kill the executor from the host now, with every process under it, without
        asking it (it stopped answering: with gVisor, its kernel may be what hangs), and
        reap it (within the grace)."""
        await self._close("the executor stopped answering and was killed", grace=0)

    async def _close(self, why: str, *, grace: float) -> None:
        self._give_up(why)
        self._watched.close()  # wakes our reader, then closes it (the executor sees EOF)
        # Shielded: a cancelled caller must not leave the executor (and the commands under
        # it) running; bounded: the grace to exit, then killed and the grace to be reaped.
        with anyio.CancelScope(shield=True):
            if grace > 0:
                with anyio.move_on_after(grace):
                    await self.process.wait()
            under: list[int] = []
            try:
                if self.process.returncode is None:
                    under = self._kill_tree()
                with anyio.move_on_after(self._grace):
                    await self.process.aclose()
                    for pidfd in under:  # readable once that process exited
                        await anyio.wait_readable(pidfd)
            finally:
                for pidfd in under:
                    os.close(pidfd)

    def _kill_tree(self) -> list[int]:
        """SIGKILL the executor's process and everything under it, the deepest first;
        return pidfds of those under it, to wait for. For gVisor: runsc, then the
        sandbox's kernel and file server and the kernel's host processes, which runsc's
        death alone would leave to ``PDEATHSIG`` (Go forks them from any of its threads,
        and that signal follows the thread), and which take a while to exit."""
        pidfds = []
        for pid in reversed(descendants(self.process.pid)):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # gone already (or no pidfds here: killed by pid, not awaited)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                continue
            pidfds.append(pidfd)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        self.process.kill()
        return pidfds
