"""Tar streams between the host and sandboxes, in bounded memory, safe on the host side.

``pack`` turns a local file or directory into a tar stream without following symlinks
(nothing outside the chosen path is ever read). ``unpack`` writes a tar stream that came
out of a sandbox — untrusted data — into a local directory: member paths may not leave
the destination (no absolute paths, no ``..``, no writing through symlinks), links must
point inside it, special files are refused, and permission bits are reduced to rwx.

tarfile is synchronous, so it runs in a worker thread; bytes cross to the event loop in
chunks through a bounded memory stream (backpressure both ways).
"""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, cast

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectSendStream

from ._errors import FileErrorReason, InvalidArgument, SandboxFileError
from ._util import single_error

CHUNK = 256 * 1024


class _ChunkWriter:
    """File-like sink for tarfile in a worker thread: hands each write to the event loop."""

    def __init__(self, send: MemoryObjectSendStream[bytes]) -> None:
        self._send = send

    def write(self, data: bytes) -> int:
        if data:
            anyio.from_thread.run(self._send.send, bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


class _ChunkReader:
    """File-like source for tarfile in a worker thread, fed from an async iterator."""

    def __init__(self, chunks: AsyncIterator[bytes], max_bytes: int | None, label: str) -> None:
        self._chunks = chunks
        self._buffer = bytearray()
        self._eof = False
        self._total = 0
        self._max = max_bytes
        self._label = label

    def read(self, size: int = -1) -> bytes:
        while not self._eof and (size < 0 or len(self._buffer) < size):
            chunk = anyio.from_thread.run(self._next)
            if chunk is None:
                self._eof = True
                break
            self._total += len(chunk)
            if self._max is not None and self._total > self._max:
                raise SandboxFileError(
                    FileErrorReason.TOO_LARGE, self._label, f"more than {self._max} bytes"
                )
            self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _next(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None


def _pack_sync(source: Path, arcname: str | None, writer: _ChunkWriter) -> None:
    fileobj = cast("IO[bytes]", writer)  # in stream mode tarfile only calls write()
    with tarfile.open(fileobj=fileobj, mode="w|", bufsize=CHUNK, format=tarfile.PAX_FORMAT) as tar:
        if arcname is not None:  # a single file
            tar.add(source, arcname=arcname, recursive=False)
            return
        for root, dirs, files in os.walk(source):  # os.walk does not follow symlinked dirs
            dirs.sort()
            rel_root = os.path.relpath(root, source)
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(root, name)
                rel = (
                    name if rel_root == "." else posixpath.join(rel_root.replace(os.sep, "/"), name)
                )
                tar.add(full, arcname=rel, recursive=False)
            # symlinks to directories appear in `dirs` and are added as links, not walked into


@asynccontextmanager
async def pack(source: Path, *, arcname: str | None = None) -> AsyncIterator[AsyncIterator[bytes]]:
    """Tar stream of ``source``: a directory's *contents*, or one file named ``arcname``.

    An error reading ``source`` (a file that vanished, a permission) ends the stream early
    and is raised when the context exits, in preference to the consumer's complaint about
    the short stream.
    """
    send, receive = anyio.create_memory_object_stream[bytes](4)
    error: list[BaseException] = []

    async def produce() -> None:
        async with send:
            try:
                await anyio.to_thread.run_sync(_pack_sync, source, arcname, _ChunkWriter(send))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the consumer stopped reading; its own error explains why
            except Exception as exc:  # noqa: BLE001 - raised when the context exits
                error.append(exc)

    try:
        with single_error():
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                # Closing `receive` unblocks a producer stuck on a full buffer.
                with receive:
                    yield receive
    except Exception as exc:
        if error:
            raise error[0] from exc
        raise
    if error:
        raise error[0]


def _safe_target(dest: Path, name: str) -> Path:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts:
        raise SandboxFileError(FileErrorReason.INVALID_PATH, name, "unsafe path in archive")
    target = dest.joinpath(*parts)
    # Refuse to write through a symlink in any parent directory inside dest.
    current = dest
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise SandboxFileError(
                FileErrorReason.INVALID_PATH, name, "path goes through a symlink"
            )
    return target


def _link_inside(dest: Path, target: Path, linkname: str) -> bool:
    if posixpath.isabs(linkname):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(str(target)), linkname))
    return resolved == str(dest) or resolved.startswith(str(dest) + "/")


def _replace(target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()


def _unpack_sync(reader: _ChunkReader, dest: Path) -> None:
    dest = dest.absolute()
    links: list[Path] = []
    try:
        _extract(reader, dest, links)
    finally:
        _check_links(dest, links)


def _check_links(dest: Path, links: list[Path]) -> None:
    """Each link passed ``_link_inside`` when it was made, but that check is lexical: a chain
    of links that are each inside (``a -> .``, ``b -> a/..``) can resolve outside. Once the
    tree is complete, resolve every link we made and remove those that lead out."""
    root = os.path.realpath(dest)
    escaping = []
    for link in links:
        if not link.is_symlink():
            continue  # replaced by a later member
        resolved = os.path.realpath(link)
        if resolved != root and not resolved.startswith(root + os.sep):
            link.unlink()
            escaping.append(f"{link.relative_to(dest)} -> {resolved}")
    if escaping:
        raise SandboxFileError(
            FileErrorReason.INVALID_PATH,
            str(dest),
            "symlinks resolving outside the destination were removed: " + ", ".join(escaping),
        )


def _extract(reader: _ChunkReader, dest: Path, links: list[Path]) -> None:
    fileobj = cast("IO[bytes]", reader)  # in stream mode tarfile only calls read()
    with tarfile.open(fileobj=fileobj, mode="r|", bufsize=CHUNK) as tar:
        for member in tar:
            # The top-level member is the downloaded path itself: it becomes `dest`.
            name = member.name.lstrip("/").partition("/")[2]
            target = _safe_target(dest, name) if name else dest
            mode = member.mode & 0o777
            if member.isdir():
                if target.is_symlink():
                    target.unlink()
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(mode | 0o700)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                _replace(target)
                source = tar.extractfile(member)
                assert source is not None
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    while block := source.read(CHUNK):
                        out.write(block)
                os.chmod(target, mode)
            elif member.issym() and name:
                if not _link_inside(dest, target, member.linkname):
                    raise SandboxFileError(
                        FileErrorReason.INVALID_PATH,
                        member.name,
                        f"symlink to {member.linkname!r} points outside the destination",
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                _replace(target)
                os.symlink(member.linkname, target)
                links.append(target)
            elif member.islnk() and name:
                source_path = _safe_target(dest, member.linkname.lstrip("/").partition("/")[2])
                if source_path.is_symlink() or not source_path.is_file():
                    raise SandboxFileError(
                        FileErrorReason.INVALID_PATH, member.name, "bad hard link"
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                _replace(target)
                os.link(source_path, target)
            else:
                raise SandboxFileError(
                    FileErrorReason.OTHER,
                    member.name,
                    "only regular files, directories and links inside the tree are copied",
                )


async def unpack(
    chunks: AsyncIterator[bytes], dest: Path, *, max_bytes: int | None = None, label: str = ""
) -> None:
    """Extract a tar stream from ``get_archive`` into ``dest`` (see the module docstring for
    the safety rules). The top-level member becomes ``dest`` itself: a directory's contents
    land in it, a single file is written to it."""
    reader = _ChunkReader(chunks, max_bytes, label)
    try:
        await anyio.to_thread.run_sync(_unpack_sync, reader, dest)
    except tarfile.TarError as exc:
        raise SandboxFileError(FileErrorReason.OTHER, label, f"corrupt archive: {exc}") from exc


def local_source(path: object) -> Path:
    """A local path to upload: must exist; symlinks are not followed at the top level either."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"local path must be a str or os.PathLike, got {path!r}")
    source = Path(path)
    try:
        st = source.lstat()
    except FileNotFoundError:
        raise InvalidArgument(f"local path does not exist: {source}") from None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise InvalidArgument(f"local path must be a regular file or a directory: {source}")
    return source
