"""File operations as small ``sh`` scripts run inside the sandbox (see ``ShellFiles``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import anyio

from ._errors import FileErrorReason, SandboxFileError

__all__ = ("InteractiveProcess", "ShellFiles")

CHUNK = 256 * 1024

# Exit codes of the scripts below, for checks that an error message cannot carry reliably.
_EXIT_REASONS = {
    21: FileErrorReason.IS_A_DIRECTORY,
    22: FileErrorReason.NOT_FOUND,
    23: FileErrorReason.TOO_LARGE,
    24: FileErrorReason.NOT_A_DIRECTORY,
}
_STDERR_REASONS = (
    ("No such file or directory", FileErrorReason.NOT_FOUND),
    ("Is a directory", FileErrorReason.IS_A_DIRECTORY),
    ("Not a directory", FileErrorReason.NOT_A_DIRECTORY),
    ("File exists", FileErrorReason.NOT_A_DIRECTORY),  # mkdir -p over a file
    ("Permission denied", FileErrorReason.PERMISSION),
    ("Read-only file system", FileErrorReason.PERMISSION),
    ("Operation not permitted", FileErrorReason.PERMISSION),
)
# $1 is always the path; LC_ALL=C keeps error messages parseable.
# Only regular files are opened: a FIFO would block the open forever, a device (/dev/zero)
# would never end. READ refuses them; WRITE replaces them with the file.
READ = (
    '[ -d "$1" ] && exit 21; [ -e "$1" ] || exit 22; '
    '[ -f "$1" ] || { echo "not a regular file" >&2; exit 1; }; '
    's=$(stat -L -c %s -- "$1" 2>/dev/null || wc -c < "$1") || exit 1; '
    '[ "$s" -gt "$2" ] && exit 23; exec cat -- "$1"'
)
# (``wc -c``, which GNU's answers from fstat, where ``stat`` fails: gVisor 20221219 refuses
# the AT_NO_AUTOMOUNT flag that coreutils 9's stat passes to statx.)
WRITE = (
    '[ -d "$1" ] && exit 21; d=$(dirname -- "$1"); '
    'if [ ! -d "$d" ]; then mkdir -p -- "$d" || exit 24; fi; '
    'if [ -e "$1" ] && [ ! -f "$1" ]; then rm -f -- "$1" || exit 1; fi; '
    'cat > "$1" && chmod "$2" -- "$1"'
)
PUT_ARCHIVE = 'mkdir -p -- "$1" && exec tar -x -f - -C "$1" --no-same-owner --no-overwrite-dir'
GET_ARCHIVE = (
    '[ -e "$1" ] || { [ -L "$1" ] || exit 22; }; p=$(readlink -f -- "$1") || exit 22; '
    'cd -- "$(dirname -- "$p")" && exec tar -c -f - -- "$(basename -- "$p")"'
)


class InteractiveProcess(Protocol):
    """A process running in a sandbox with streamed stdin and stdout, as
    :meth:`~asyncsandbox.abc.SandboxHandle.interact` provides it (a file operation's ``sh``
    script, the code interpreter's runner).

    Iterate it for stdout chunks (until EOF). The implementation collects stderr by itself
    (its first few KiB suffice) so that a chatty stderr never blocks the process.
    """

    async def send(self, data: bytes) -> None:
        """Write to the process's stdin; raise ``anyio.BrokenResourceError`` once the process
        stopped reading."""

    async def close_stdin(self) -> None:
        """Close the process's stdin (it sees EOF)."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        """stdout chunks as they come."""

    async def wait(self) -> tuple[int, bytes]:
        """Wait for the process to end; return its exit status and the start of its stderr."""


def _file_error(path: str, returncode: int, stderr: bytes) -> SandboxFileError:
    reason = _EXIT_REASONS.get(returncode)
    text = stderr.decode(errors="replace").strip()
    if reason is None:
        reason = next((r for needle, r in _STDERR_REASONS if needle in text), FileErrorReason.OTHER)
    return SandboxFileError(reason, path, text.splitlines()[-1] if text else None)


class ShellFiles:
    """Mixin: the four file operations of :class:`SandboxHandle`, for sandboxes that can run
    ``sh`` scripts (with ``cat``, ``stat``, ``mkdir``, ``tar``) with streamed stdin and stdout.

    Implement :meth:`interact` (the handle's primitive, see
    :meth:`~asyncsandbox.abc.SandboxHandle.interact`); the operations then run inside the
    sandbox with the sandbox user's rights and view of the filesystem (so paths and
    symlinks resolve as the sandbox sees them, never on the host), stream their data, and
    map failures to typed :class:`SandboxFileError` reasons.
    """

    @abstractmethod
    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        """See :meth:`asyncsandbox.abc.SandboxHandle.interact`."""

    def shell(
        self, script: str, args: Sequence[str], *, stdin: bool
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        """Run ``sh -c script sh args...`` in the sandbox as the sandbox user, with
        ``LC_ALL=C``, in ``/``, through :meth:`interact`. ``stdin=False``: an empty stdin."""
        argv = ("/bin/sh", "-c", script, "sh", *args)
        return self.interact(argv, cwd="/", env={"LC_ALL": "C"}, stdin=stdin)

    def shell_path(self, path: str) -> str:
        """``path`` as the script must see it (override to map paths)."""
        return path

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        content = bytearray()
        async with self.shell(READ, (self.shell_path(path), str(max_bytes)), stdin=False) as script:
            async for chunk in script:
                content += chunk
                if len(content) > max_bytes:  # it grew after the size check
                    raise SandboxFileError(
                        FileErrorReason.TOO_LARGE, path, f"more than {max_bytes} bytes"
                    )
            returncode, stderr = await script.wait()
        if returncode != 0:
            raise _file_error(path, returncode, stderr)
        return bytes(content)

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        await self._feed(WRITE, (self.shell_path(path), format(mode, "o")), _Chunks(data), path)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        await self._feed(PUT_ARCHIVE, (self.shell_path(path),), archive, path)

    async def _feed(
        self, script_text: str, args: tuple[str, ...], data: AsyncIterable[bytes], path: str
    ) -> None:
        async with self.shell(script_text, args, stdin=True) as script:
            try:
                async for chunk in data:
                    await script.send(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the script stopped reading: its exit status says why
            finally:
                with anyio.CancelScope(shield=True):
                    await script.close_stdin()
            async for _ in script:
                pass
            returncode, stderr = await script.wait()
        if returncode != 0:
            raise _file_error(path, returncode, stderr)

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        async with self.shell(GET_ARCHIVE, (self.shell_path(path),), stdin=False) as script:
            chunks = aiter(script)
            # Read ahead one chunk, so that errors (no such file) surface on entering.
            first = await anext(chunks, None)
            if first is None:
                returncode, stderr = await script.wait()
                raise _file_error(path, returncode or 1, stderr)
            yield _prepend(first, chunks)
            returncode, stderr = await script.wait()
            if returncode != 0:
                raise _file_error(path, returncode, stderr)


class _Chunks:
    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        if not self._data:
            raise StopAsyncIteration
        chunk, self._data = bytes(self._data[:CHUNK]), self._data[CHUNK:]
        return chunk


class _prepend:
    def __init__(self, first: bytes, rest: AsyncIterator[bytes]) -> None:
        self._first: bytes | None = first
        self._rest = rest

    def __aiter__(self) -> _prepend:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await anext(self._rest)
