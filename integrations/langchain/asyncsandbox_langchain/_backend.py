"""The deepagents sandbox backend over the public API of asyncsandbox.

deepagents derives every file tool (``ls``, ``read``, ``write``, ``edit``, ``grep``,
``glob``) from three primitives, ``execute``, ``upload_files`` and ``download_files``, and
their async variants; this backend implements the async ones natively on a
:class:`~asyncsandbox.Sandbox` (anyio: asyncio and trio), and the sync ones by calling them
in the sandbox's event loop.

* ``aexecute(command, timeout=)``: ``sh -c command`` in the sandbox's working directory;
  stdout then stderr as ``output``; ``truncated`` when the sandbox cut the output. A
  timeout is deepagents' own convention (``LocalShellBackend``'s): exit code 124 and an
  ``Error: Command timed out ...`` line after the output so far; the command is killed.
* ``aupload_files``/``adownload_files``: the sandbox's file API, per file; failures are
  deepagents' error names (``file_not_found``, ``permission_denied``, ``is_directory``,
  ``invalid_path``: a relative path).
* Infrastructure failures (the sandbox died or was removed, the backend is unreachable)
  raise the :class:`~asyncsandbox.InfrastructureError` they are, never a command result:
  an agent's trainer can tell them from the program's failures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from asyncsandbox import ExecTimeout, FileErrorReason, Sandbox, SandboxFileError

__all__ = ("SandboxBackend",)

T = TypeVar("T")

_ERRORS = {
    FileErrorReason.NOT_FOUND: "file_not_found",
    FileErrorReason.PERMISSION: "permission_denied",
    FileErrorReason.IS_A_DIRECTORY: "is_directory",
    FileErrorReason.NOT_A_DIRECTORY: "file_not_found",  # a parent is a file: no such path
    FileErrorReason.INVALID_PATH: "invalid_path",
}


class SandboxBackend(BaseSandbox):
    """A deepagents sandbox backend on ``sandbox``.

    Build it in the event loop the sandbox belongs to (the one its
    :class:`~asyncsandbox.Session` was opened in). Its async methods run there natively;
    called from another event loop they hand the call over to the sandbox's loop. Its sync
    methods (deepagents' sync agents) block until the call is done in the sandbox's loop,
    which must then be running in another thread (a portal's, say): from inside that loop,
    use the async variants.

    :param sandbox: where commands run and files live; started on first use if it was not.
    :param timeout: seconds a command may run when the call says nothing (deepagents'
        ``LocalShellBackend`` default: 120).
    :param max_output_bytes: output kept per stream and command (head and tail kept
        beyond it, ``truncated`` set).
    :param max_file_bytes: the largest file ``download_files`` returns.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        timeout: float = 120.0,
        max_output_bytes: int = 10 * 1024 * 1024,
        max_file_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.sandbox = sandbox
        """The sandbox the backend works in."""
        self._timeout = timeout
        self._max_output_bytes = max_output_bytes
        self._max_file_bytes = max_file_bytes
        self._loop = anyio.lowlevel.current_token()

    @property
    def id(self) -> str:
        """The sandbox's id (empty until it has started)."""
        return self.sandbox.id or ""

    # -- async: native ------------------------------------------------------------------

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` (``sh -c``) and return its output and exit code.

        Cancellation: the command is killed before the cancellation propagates.
        """
        return await self._in_loop(self._execute, command, timeout)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each ``(path, content)`` (parents made); one response per file, in order.

        Cancellation: propagates; files already written stay.
        """
        return await self._in_loop(self._upload, files)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each path; one response per path, in order.

        Cancellation: propagates; nothing to undo.
        """
        return await self._in_loop(self._download, paths)

    # -- sync: the async ones, in the sandbox's loop ------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """:meth:`aexecute`, blocking."""
        return self._blocking(self._execute, command, timeout)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """:meth:`aupload_files`, blocking."""
        return self._blocking(self._upload, files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """:meth:`adownload_files`, blocking."""
        return self._blocking(self._download, paths)

    # -- the work -------------------------------------------------------------------------

    async def _execute(self, command: str, timeout: float | None) -> ExecuteResponse:
        limit = self._timeout if timeout is None else timeout
        if limit <= 0:
            raise ValueError(f"timeout must be positive, got {limit}")
        try:
            result = await self.sandbox.exec(
                ["sh", "-c", command], timeout=limit, max_output_bytes=self._max_output_bytes
            )
        except ExecTimeout as exc:
            partial = exc.result.stdout_text + exc.result.stderr_text
            how = "" if timeout is None else " (custom timeout)"
            return ExecuteResponse(
                output=f"{partial}\nError: Command timed out after {limit:g} seconds{how}.",
                exit_code=124,
                truncated=exc.result.truncated,
            )
        return ExecuteResponse(
            output=result.stdout_text + result.stderr_text,
            exit_code=result.returncode,
            truncated=result.truncated,
        )

    async def _upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            error: str | None = None
            if not path.startswith("/"):
                error = "invalid_path"
            else:
                try:
                    await self.sandbox.write_file(path, content)
                except SandboxFileError as exc:
                    error = _ERRORS.get(exc.reason, str(exc))
            responses.append(FileUploadResponse(path=path, error=error))
        return responses

    async def _download(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            if not path.startswith("/"):
                responses.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            try:
                content = await self.sandbox.read_file(path, max_bytes=self._max_file_bytes)
            except SandboxFileError as exc:
                responses.append(
                    FileDownloadResponse(path=path, error=_ERRORS.get(exc.reason, str(exc)))
                )
            else:
                responses.append(FileDownloadResponse(path=path, content=content))
        return responses

    # -- which loop -----------------------------------------------------------------------

    def _ours(self) -> bool:
        """Whether the calling thread runs the sandbox's event loop."""
        try:
            current = anyio.lowlevel.current_token()
        except RuntimeError:  # no event loop in this thread
            return False
        return current.native_token is self._loop.native_token

    async def _in_loop(self, work: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        if self._ours():
            return await work(*args)
        # Another event loop: the sandbox's objects belong to its own loop, so the call is
        # made there, from a worker thread of this one (a cancellation here stops waiting;
        # the call finishes there).
        call = functools.partial(anyio.from_thread.run, work, *args, token=self._loop)
        return await anyio.to_thread.run_sync(call)

    def _blocking(self, work: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        if self._ours():
            raise RuntimeError(
                "a blocking call from the sandbox's own event loop would wait for ever: "
                "use the async variant (aexecute, aupload_files, adownload_files, ...)"
            )
        return anyio.from_thread.run(work, *args, token=self._loop)
