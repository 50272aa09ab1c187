"""The workspace backend: pydantic-ai's contract (``pydantic_ai/workspaces/protocol.py``)
over the public API of asyncsandbox.

How the contract's rules are kept:

* No I/O when built. The first operation makes the sandbox (one, however many operations
  start at once: a lock) or, built with a ``ref``, attaches to it
  (:meth:`Session.attach <asyncsandbox.Session.attach>`); a sandbox that is gone is
  ``WorkspaceUnavailableError``, never a replacement.
* The ref (``provider="asyncsandbox"``, the sandbox's id) is set when the sandbox has
  started and never changes. The backend never removes the sandbox: the
  :class:`~asyncsandbox.Session` that made it does when it closes (or whoever holds the
  ref, through ``Session.attach(...).stop()``).
* Commands: a non-zero exit is a result; a missing program exits 127 (as in the sandbox's
  shell); stdin is at EOF; ``timeout`` is the command's own limit
  (:class:`~asyncsandbox.ExecTimeout` becomes ``WorkspaceTimeoutError`` with the partial
  output); cancelling kills the command (asyncsandbox's guarantee); output that would not
  be complete raises ``WorkspaceOutputLimitError``.
* Files: read and written with the sandbox's own file API (bytes-safe, through symlinks,
  parents created); their :class:`~asyncsandbox.SandboxFileError` reasons become the
  builtin errors. ``stat``, ``list_dir``, ``make_dir``, ``remove``, ``exists`` and
  ``realpath`` are pydantic-ai's own shell implementations (its :class:`Workspace` over
  this backend's commands), so their semantics are the reference's.
* Errors: a dead or removed sandbox is ``WorkspaceUnavailableError``; the other
  infrastructure failures (:class:`~asyncsandbox.InfrastructureError`: the backend
  unreachable, a deadline of ours) propagate as the asyncsandbox errors they are, for a
  durable engine to retry, and stay apart from the command's own outcome.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import anyio
from pydantic_ai.workspaces import (
    CommandResult,
    FileEntry,
    SupportsCommands,
    SupportsFilesystem,
    SupportsRealpath,
    Workspace,
    WorkspaceBackend,
    WorkspaceCommand,
    WorkspaceOutputLimitError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)

from asyncsandbox import (
    ExecTimeout,
    FileErrorReason,
    Sandbox,
    SandboxClosed,
    SandboxDied,
    SandboxFileError,
    SandboxNotFound,
    Session,
)

__all__ = ("PROVIDER", "SandboxWorkspace")

PROVIDER = "asyncsandbox"
"""The ``provider`` of this backend's :class:`WorkspaceRef`."""

_OUTPUT_BYTES = 10 * 1024 * 1024  # per stream: pydantic-ai's local backend's ceiling
_FILE_BYTES = 1 << 30  # the largest file read_bytes reads

_FILE_ERRORS: dict[FileErrorReason, tuple[type[OSError], int]] = {
    FileErrorReason.NOT_FOUND: (FileNotFoundError, errno.ENOENT),
    FileErrorReason.IS_A_DIRECTORY: (IsADirectoryError, errno.EISDIR),
    FileErrorReason.NOT_A_DIRECTORY: (NotADirectoryError, errno.ENOTDIR),
    FileErrorReason.PERMISSION: (PermissionError, errno.EACCES),
    FileErrorReason.TOO_LARGE: (OSError, errno.EFBIG),
    FileErrorReason.INVALID_PATH: (OSError, errno.EINVAL),
    FileErrorReason.OTHER: (OSError, errno.EIO),
}

_GONE = (SandboxDied, SandboxNotFound, SandboxClosed)
"""The sandbox is dead, removed, or stopped: retrying cannot help."""


class SandboxWorkspace(WorkspaceBackend, SupportsCommands, SupportsFilesystem, SupportsRealpath):
    """A pydantic-ai workspace backend whose environment is a sandbox of ``session``.

    :param session: an open :class:`~asyncsandbox.Session`; sandboxes this backend makes are
        removed when it closes.
    :param ref: attach to this sandbox (a :attr:`ref` kept from an earlier run, or from
        another process on the same backend) instead of making one.
    :param overrides: :class:`~asyncsandbox.SandboxDefaults` fields for the sandbox
        (``image``, ``env``, ``workdir``, ...); when attaching, what it was made with.
    """

    def __init__(self, session: Session, *, ref: WorkspaceRef | None = None, **overrides: Any):
        if ref is not None and ref.provider != PROVIDER:
            raise ValueError(f"a ref of provider {ref.provider!r}, not {PROVIDER!r}")
        self._session = session
        self._ref = ref
        self._overrides = overrides
        self._sandbox: Sandbox | None = None
        self._lock = anyio.Lock()
        # pydantic-ai's shell filesystem over our commands: stat, list_dir, make_dir, remove,
        # exists and realpath behave exactly as the reference does.
        self._shell = Workspace(_Commands(self))

    @property
    def ref(self) -> WorkspaceRef | None:
        """``WorkspaceRef(provider="asyncsandbox", id=<sandbox id>)`` once the sandbox exists
        (from construction when attaching)."""
        return self._ref

    async def sandbox(self) -> Sandbox:
        """The sandbox, made (or attached to) on first use.

        Cancellation: a cancelled start leaves nothing behind, and no ref.
        """
        if self._sandbox is not None:
            return self._sandbox
        async with self._lock:
            if self._sandbox is None:
                try:
                    if self._ref is not None:
                        sandbox = await self._session.attach(self._ref.id, **self._overrides)
                    else:
                        sandbox = await self._session.sandbox(**self._overrides).start()
                except _GONE as exc:
                    _unavailable(exc)
                assert sandbox.id is not None
                self._ref = WorkspaceRef(provider=PROVIDER, id=sandbox.id)
                self._sandbox = sandbox
        return self._sandbox

    async def working_dir(self) -> str:
        """Where commands start: the sandbox's ``workdir``.

        Cancellation: propagates (the sandbox may be made first; see :meth:`sandbox`).
        """
        return (await self.sandbox()).config.workdir

    # -- commands -----------------------------------------------------------------------

    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``command`` in the sandbox (``sh -c`` with ``shell=True``) and return its
        exit code and output. See the module docstring for the errors.

        Cancellation: the command is killed before the cancellation propagates.
        """
        if isinstance(command, str):
            if not shell:
                raise TypeError("a string command needs shell=True; else pass an argv sequence")
            argv = ["sh", "-c", command]
        else:
            if shell:
                raise TypeError("an argv sequence cannot be combined with shell=True")
            argv = list(command)
            if not argv:
                raise ValueError("command must not be empty")
        limit: object = timeout  # the caller's, whatever its annotation says
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise ValueError("timeout must be a positive finite number or None")
        sandbox = await self.sandbox()
        try:
            result = await sandbox.exec(
                argv, env=env, timeout=timeout, max_output_bytes=_OUTPUT_BYTES
            )
        except ExecTimeout as exc:
            raise WorkspaceTimeoutError(
                f"command timed out after {timeout:g}s and was killed",
                stdout=exc.result.stdout_text,
                stderr=exc.result.stderr_text,
            ) from exc
        except _GONE as exc:
            _unavailable(exc)
        if result.truncated:
            raise WorkspaceOutputLimitError(
                f"the command wrote more than {_OUTPUT_BYTES} bytes to a stream",
                limit=_OUTPUT_BYTES,
                stdout=result.stdout_text,
                stderr=result.stderr_text,
            )
        return CommandResult(
            exit_code=result.returncode, stdout=result.stdout_text, stderr=result.stderr_text
        )

    # -- files --------------------------------------------------------------------------

    async def read_bytes(self, path: str) -> bytes:
        """The content of the file at ``path``.

        Cancellation: propagates; nothing to undo.
        """
        sandbox = await self.sandbox()
        try:
            return await sandbox.read_file(path, max_bytes=_FILE_BYTES)
        except SandboxFileError as exc:
            _file_error(exc, path)
        except _GONE as exc:
            _unavailable(exc)

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Create or replace the file at ``path`` (parents made, through symlinks).

        Cancellation: propagates; the file may be left half written.
        """
        sandbox = await self.sandbox()
        try:
            await sandbox.write_file(path, data)
        except SandboxFileError as exc:
            _file_error(exc, path)
        except _GONE as exc:
            _unavailable(exc)

    async def stat(self, path: str) -> FileEntry:
        """Metadata of a file or directory. Cancellation: propagates."""
        return await self._shell.stat(path)

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        """The entries of a directory. Cancellation: propagates."""
        return await self._shell.list_dir(path)

    async def make_dir(self, path: str) -> None:
        """``mkdir -p``. Cancellation: propagates."""
        await self._shell.make_dir(path)

    async def remove(self, path: str) -> None:
        """Remove a file or a tree (never the working directory or its ancestors).
        Cancellation: propagates."""
        await self._shell.remove(path)

    async def exists(self, path: str) -> bool:
        """Whether something exists at ``path``. Cancellation: propagates."""
        return await self._shell.exists(path)

    async def realpath(self, path: str) -> str:
        """``path`` with symlinks resolved inside the sandbox. Cancellation: propagates."""
        return await self._shell.realpath(path)


class _Commands(WorkspaceBackend, SupportsCommands):
    """The commands of a :class:`SandboxWorkspace` alone: what pydantic-ai's
    :class:`Workspace` builds its shell filesystem on."""

    def __init__(self, backend: SandboxWorkspace) -> None:
        self._backend = backend

    @property
    def ref(self) -> WorkspaceRef | None:
        return self._backend.ref

    async def working_dir(self) -> str:
        return await self._backend.working_dir()

    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        return await self._backend.run(command, shell=shell, env=env, timeout=timeout)


def _file_error(exc: SandboxFileError, path: str) -> NoReturn:
    kind, code = _FILE_ERRORS.get(exc.reason, (OSError, errno.EIO))
    raise kind(code, str(exc), path) from exc


def _unavailable(exc: BaseException) -> NoReturn:
    raise WorkspaceUnavailableError(f"the sandbox is gone: {exc}") from exc
