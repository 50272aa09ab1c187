"""envd's filesystem operations, as commands in the sandbox (through the public
:class:`asyncsandbox.Sandbox`, like everything the server does in a sandbox): a stat or a
directory listing is one run of ``_lister.py`` whose records are NUL-separated, so any
file name comes back intact, with the file's metadata (its ``user.e2b.*`` extended
attributes, as envd keeps it); ``mkdir``, ``mv`` and ``rm`` do the rest. Paths are
resolved against the sandbox's home (``/home/user``, its working directory) as envd
resolves them, and every command runs inside the sandbox: a path can name nothing
outside it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from asyncsandbox import ExecResult, InvalidArgument, Sandbox, SandboxError

__all__ = ("Entry", "Filesystem", "resolve")

HOME = "/home/user"
USER = "user"
"""E2B's name for the sandbox's user: files it owns are shown as owned by ``user``."""
LISTER = Path(__file__).with_name("_lister.py").read_text()
FIELDS = 11
"""type, target type, size, mode (octal), permissions (ls), owner, group, mtime, link,
metadata (JSON), path: see ``_lister.py``."""
MKDIR = """
[ -e "$1" ] && { echo "directory already exists" >&2; exit 17; }
exec mkdir -p -- "$1"
"""
MOVE = """
[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
[ "$1" = "$2" ] && exit 0  # (a rename onto itself does nothing, as envd's)
mkdir -p -- "$(dirname -- "$2")" && exec mv -T -- "$1" "$2"
"""
REMOVE = 'exec rm -rf -- "$1"'  # (a path that does not exist: nothing to do, as envd)
TYPES = {
    "f": filesystem_pb.FileType.FILE,
    "d": filesystem_pb.FileType.DIRECTORY,
    "l": filesystem_pb.FileType.SYMLINK,
}


def resolve(path: str, home: str = HOME) -> str:
    """``path`` made absolute against the home and normalised (no ``..`` left)."""
    if not path:
        return home
    if "\0" in path:
        raise ConnectError(Code.INVALID_ARGUMENT, "paths cannot contain NUL bytes")
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    normalised = posixpath.normpath(posixpath.join(home, path))
    return "/" + normalised.lstrip("/")


@dataclass(frozen=True)
class Entry:
    """One file as the lister described it."""

    kind: str
    target_kind: str
    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    mtime: float
    link: str
    path: str
    metadata: dict[str, str] = field(default_factory=dict)

    def info(self) -> filesystem_pb.EntryInfo:
        """envd's ``EntryInfo``: a symlink has its target's type and its absolute target."""
        kind = self.target_kind if self.kind == "l" else self.kind
        seconds = int(self.mtime)
        info = filesystem_pb.EntryInfo(
            name=posixpath.basename(self.path) or "/",
            type=TYPES.get(kind, filesystem_pb.FileType.UNSPECIFIED),
            path=self.path,
            size=self.size,
            mode=self.mode,
            permissions=self.permissions,
            owner=self.owner,
            group=self.group,
            modified_time=Timestamp(seconds=seconds, nanos=int((self.mtime - seconds) * 1e9)),
            is_symlink=self.kind == "l",
        )
        if self.metadata:
            info.metadata = dict(self.metadata)
        if self.kind == "l":
            info.symlink_target = posixpath.normpath(
                posixpath.join(posixpath.dirname(self.path), self.link)
            )
        return info

    @property
    def key(self) -> tuple[str, int, float]:
        """What changes when the file is written (for watchers)."""
        return (self.kind, self.size, self.mtime)

    def when(self) -> datetime:
        return datetime.fromtimestamp(self.mtime, UTC)


def parse(output: bytes) -> list[Entry]:
    fields = output.split(b"\0")
    entries = []
    for i in range(0, len(fields) - FIELDS + 1, FIELDS):
        kind, target, size, mode, perms, owner, group, mtime, link, meta, path = (
            f.decode("utf-8", "surrogateescape") for f in fields[i : i + FIELDS]
        )
        try:
            entries.append(
                Entry(
                    kind=kind,
                    target_kind=target,
                    size=int(size),
                    mode=int(mode, 8),
                    permissions=perms,
                    owner=owner,
                    group=group,
                    mtime=float(mtime),
                    link=link,
                    path=path,
                    metadata=msgspec.json.decode(meta, type=dict[str, str]),
                )
            )
        except (ValueError, msgspec.DecodeError):
            continue  # (a file that changed while it was listed)
    return entries


def _error(result: ExecResult, path: str) -> ConnectError:
    detail = result.stderr_text.strip().splitlines()
    message = f"{detail[-1] if detail else 'failed'}: {path[:300]}"
    if result.returncode == 2:
        return ConnectError(Code.NOT_FOUND, message)
    if result.returncode == 3:
        return ConnectError(Code.INVALID_ARGUMENT, message)
    if result.returncode == 17:
        return ConnectError(Code.ALREADY_EXISTS, message)
    lowered = message.lower()
    if "permission denied" in lowered or "read-only" in lowered:
        return ConnectError(Code.PERMISSION_DENIED, message)
    if "not a directory" in lowered:
        return ConnectError(Code.INVALID_ARGUMENT, message)
    # What else a command on the sandbox's files refuses is about their state (a move
    # onto itself, into its own subdirectory, a full disk), never an error of the server.
    return ConnectError(Code.FAILED_PRECONDITION, message)


class Filesystem:
    """The filesystem operations of one sandbox (see the module docstring)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self.tagged: set[str] = set()
        """Files given metadata through uploads: an upload without metadata clears it."""

    async def _run(self, script: str, *args: str) -> ExecResult:
        return await self._exec(("sh", "-c", script, "sh", *args))

    async def _exec(self, argv: tuple[str, ...]) -> ExecResult:
        try:
            return await self._sandbox.exec(argv)
        except InvalidArgument as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None
        except SandboxError as exc:
            raise ConnectError(Code.UNAVAILABLE, f"the sandbox failed: {exc}") from None

    async def entries(self, path: str, depth: int) -> list[Entry]:
        """``path`` itself (depth 0) or what it holds down to ``depth`` levels."""
        result = await self._exec(
            ("python3", "-I", "-S", "-c", LISTER, "list", path, str(depth), USER)
        )
        if result.returncode != 0:
            raise _error(result, path)
        return sorted(parse(result.stdout), key=lambda e: e.path)

    async def tag(self, path: str, metadata: dict[str, str]) -> None:
        """Make ``metadata`` the file's (envd's ``user.e2b.*`` extended attributes),
        replacing what it had."""
        wanted = msgspec.json.encode(metadata).decode()
        result = await self._exec(("python3", "-I", "-S", "-c", LISTER, "tag", path, wanted))
        if result.returncode != 0:
            raise _error(result, path)
        if metadata:
            self.tagged.add(path)
        else:
            self.tagged.discard(path)

    async def stat(self, path: str) -> filesystem_pb.EntryInfo:
        entries = await self.entries(path, 0)
        if not entries:
            raise ConnectError(Code.NOT_FOUND, f"no such file or directory: {path[:300]}")
        return entries[0].info()

    async def make_dir(self, path: str) -> filesystem_pb.EntryInfo:
        result = await self._run(MKDIR, path)
        if result.returncode != 0:
            raise _error(result, path)
        return await self.stat(path)

    async def move(self, source: str, destination: str) -> filesystem_pb.EntryInfo:
        result = await self._run(MOVE, source, destination)
        if result.returncode != 0:
            raise _error(result, source)
        self._forget(source, moved_to=destination)
        return await self.stat(destination)

    async def remove(self, path: str) -> None:
        result = await self._run(REMOVE, path)
        if result.returncode != 0:
            raise _error(result, path)
        self._forget(path)

    def _forget(self, path: str, *, moved_to: str | None = None) -> None:
        inside = path.rstrip("/") + "/"
        for tagged in [t for t in self.tagged if t == path or t.startswith(inside)]:
            self.tagged.discard(tagged)
            if moved_to is not None:
                self.tagged.add(moved_to + tagged[len(path) :])
