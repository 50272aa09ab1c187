"""The process backend's fast path: one resident executor per sandbox.

Without it, every command builds the sandbox's namespaces and filesystem view afresh (a
launcher per command, ~10-25 ms). With it, the native launcher builds them once, when the
sandbox first runs something, and stays as the sandbox's init (``_launcher.serve``): a
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
  the signals it handles reach it (it forwards them to the command). So the next command
  finds what a fresh init would give it, but a higher PID.
* A command's exit status comes from its init (which reaps it, forwards signals and kills
  what it left), written on a close-on-exec socket that the command never holds; or, if
  that init died first, from the executor's ``waitpid`` of it. Never from anything the
  command says; the only thing read from the command's stderr is whether it got as far
  as being started (the launcher's protocol), and the marker is written by our code
  before the command exists.
* A timeout or a cancellation asks the executor to kill the command's init (and with it
  the namespace, and everything in it); if the executor does not confirm within
  ``Timeouts.cleanup`` it is given up (killed with every command of the sandbox) and the
  sandbox goes on through a new one.
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
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from .._errors import InfrastructureError, LaunchError
from ._spawn import Child, Watched


class ExecutorGone(InfrastructureError):
    """The executor died or stopped answering; the commands it ran died with it."""


class _Command:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.exit: int | None = None
        self.error: str | None = None


class Executor:
    """The host side of one sandbox's resident executor."""

    def __init__(self, process: Child, control: socket.socket) -> None:
        self.process = process
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
                f"the sandbox's executor went away while the command ran ({self._gone}); "
                "the command was killed with it"
            )
        return command.exit

    async def reset(self) -> None:
        """Kill every command, and give the next ones a fresh IPC namespace and an empty
        ``/dev/shm`` (see ``_launcher.reset``); raise :class:`ExecutorGone` (or
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
        """Stop the executor (it kills every command) and reap it."""
        self._give_up("the executor was closed")
        self._watched.close()  # wakes our reader, then closes it
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(5):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
            await self.process.aclose()
