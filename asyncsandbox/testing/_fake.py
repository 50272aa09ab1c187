"""FakeBackend: an in-memory backend for tests of code that uses asyncsandbox.

Sandboxes are dictionaries; commands are coroutines. It runs a few built-in commands
(``true``, ``false``, ``echo``, ``cat``, ``sleep``, ``pwd``, ``env``) and the conformance
suite's probe, plus any command you register. Latency and failures are scripted, so
cancellation and limit tests are deterministic (``sleep`` and the delays use
``anyio.sleep``, so they work with a mocked clock as well).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import posixpath
import shlex
import tarfile
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from .._errors import (
    BackendUnavailable,
    FileErrorReason,
    LaunchError,
    SandboxDied,
    SandboxFileError,
    SandboxNotFound,
)
from .._models import SandboxInfo, SandboxStatus, Stream
from .._util import single_error
from ..abc import (
    Backend,
    BackendCapabilities,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
)
from ._probe import PROBE, emitted

__all__ = ("FakeBackend", "FakeCommand", "FakeProcess", "FakeWorld")

READ_ONLY = ("/usr", "/etc", "/bin", "/proc")


class _Node:
    __slots__ = ("data", "kind", "mode", "target")

    def __init__(self, kind: str, data: bytes = b"", mode: int = 0o644, target: str = "") -> None:
        self.kind = kind  # "file", "dir" or "symlink"
        self.data = bytearray(data)
        self.mode = mode
        self.target = target


class _FakeFS:
    def __init__(self, workdir: str) -> None:
        self.nodes: dict[str, _Node] = {"/": _Node("dir", mode=0o755)}
        for path in ("/usr/bin", "/etc", "/tmp", "/home/sandbox", workdir):
            self.mkdir(path, force=True)
        self.nodes["/etc/hostname"] = _Node("file", b"fake\n")
        self.nodes["/usr/bin/python3"] = _Node("file", b"", 0o755)

    def resolve(self, path: str, depth: int = 0) -> str:
        node = self.nodes.get(path)
        if node is not None and node.kind == "symlink" and depth < 20:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), node.target))
            return self.resolve(target, depth + 1)
        return path

    def _check_writable(self, path: str) -> None:
        if any(path == p or path.startswith(p + "/") for p in READ_ONLY):
            raise SandboxFileError(FileErrorReason.PERMISSION, path, "read-only file system")

    def mkdir(self, path: str, *, force: bool = False) -> None:
        parts = [p for p in path.split("/") if p]
        current = ""
        for part in parts:
            current += "/" + part
            node = self.nodes.get(self.resolve(current))
            if node is None:
                if not force:
                    self._check_writable(current)
                self.nodes[current] = _Node("dir", mode=0o755)
            elif node.kind != "dir":
                raise SandboxFileError(
                    FileErrorReason.NOT_A_DIRECTORY, path, f"{current} is a file"
                )

    def read(self, path: str) -> bytes:
        node = self.nodes.get(self.resolve(path))
        if node is None:
            raise SandboxFileError(FileErrorReason.NOT_FOUND, path)
        if node.kind == "dir":
            raise SandboxFileError(FileErrorReason.IS_A_DIRECTORY, path)
        return bytes(node.data)

    def write(self, path: str, data: bytes, mode: int = 0o644, *, append: bool = False) -> None:
        path = self.resolve(path)
        node = self.nodes.get(path)
        if node is not None and node.kind == "dir":
            raise SandboxFileError(FileErrorReason.IS_A_DIRECTORY, path)
        self._check_writable(path)
        self.mkdir(posixpath.dirname(path))
        if node is not None and append:
            node.data += data
        else:
            self.nodes[path] = _Node("file", data, mode)

    def is_dir(self, path: str) -> bool:
        node = self.nodes.get(self.resolve(path))
        return node is not None and node.kind == "dir"

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix) :])

    def tar(self, path: str) -> bytes:
        path = self.resolve(path)
        if path not in self.nodes:
            raise SandboxFileError(FileErrorReason.NOT_FOUND, path)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            self._add(tar, path, posixpath.basename(path) or ".")
        return buffer.getvalue()

    def _add(self, tar: tarfile.TarFile, path: str, name: str) -> None:
        node = self.nodes[path]
        info = tarfile.TarInfo(name)
        info.mode = node.mode
        info.mtime = int(time.time())
        if node.kind == "dir":
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            for child in self.children(path):
                self._add(tar, child, name + "/" + posixpath.basename(child))
        elif node.kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, node.target
            tar.addfile(info)
        else:
            info.size = len(node.data)
            tar.addfile(info, io.BytesIO(bytes(node.data)))

    def untar(self, directory: str, data: bytes) -> None:
        self.mkdir(directory)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            for member in tar:
                path = posixpath.normpath(posixpath.join(directory, member.name))
                if member.isdir():
                    self.mkdir(path)
                    self.nodes[self.resolve(path)].mode = member.mode & 0o7777
                elif member.issym():
                    self._check_writable(path)
                    self.mkdir(posixpath.dirname(path))
                    self.nodes[path] = _Node("symlink", target=member.linkname)
                elif member.isfile():
                    source = tar.extractfile(member)
                    assert source is not None
                    self.write(path, source.read(), member.mode & 0o7777)


class FakeProcess:
    """What a fake command sees: its arguments, its sandbox's files, its output."""

    def __init__(
        self,
        sandbox: _FakeSandbox,
        argv: tuple[str, ...],
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes,
        on_output: OutputCallback,
        tree: anyio.abc.TaskGroup,
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.env = dict(env)
        self.stdin = stdin
        self._sandbox = sandbox
        self._on_output = on_output
        self._tree = tree
        self.spawned = False

    async def write(self, stream: Stream, data: bytes) -> None:
        if data:
            await self._on_output(stream, data)

    def path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def read_file(self, path: str) -> bytes:
        return self._sandbox.fs.read(self.path(path))

    def write_file(self, path: str, data: bytes, *, append: bool = False) -> None:
        self._sandbox.fs.write(self.path(path), data, append=append)

    def stat_mode(self, path: str) -> int:
        fs = self._sandbox.fs
        node = fs.nodes.get(fs.resolve(self.path(path)))
        if node is None:
            raise SandboxFileError(FileErrorReason.NOT_FOUND, path)
        return node.mode

    def spawn(self, func: Callable[[], Awaitable[Any]]) -> None:
        """Start a child "process"; it is killed when the command ends (as on real backends)."""

        async def child() -> None:
            with contextlib.suppress(Exception):  # a crashing child does not fail its parent
                await func()

        self.spawned = True
        self._tree.start_soon(child)


FakeCommand = Callable[[FakeProcess], Awaitable[int]]
"""A fake program: gets a :class:`FakeProcess`, returns its exit status."""


async def _true(p: FakeProcess) -> int:
    return 0


async def _false(p: FakeProcess) -> int:
    return 1


async def _echo(p: FakeProcess) -> int:
    await p.write("stdout", (" ".join(p.argv[1:]) + "\n").encode())
    return 0


async def _cat(p: FakeProcess) -> int:
    if len(p.argv) == 1:
        await p.write("stdout", p.stdin)
        return 0
    for name in p.argv[1:]:
        try:
            await p.write("stdout", p.read_file(name))
        except SandboxFileError as exc:
            await p.write("stderr", f"cat: {name}: {exc.reason.value}\n".encode())
            return 1
    return 0


async def _sleep(p: FakeProcess) -> int:
    await anyio.sleep(float(p.argv[1]))
    return 0


async def _pwd(p: FakeProcess) -> int:
    await p.write("stdout", p.cwd.encode() + b"\n")
    return 0


async def _env(p: FakeProcess) -> int:
    await p.write("stdout", "".join(f"{k}={v}\n" for k, v in p.env.items()).encode())
    return 0


async def _probe(p: FakeProcess) -> int:
    """Emulates ``python3 -c PROBE`` (see :mod:`asyncsandbox.testing._probe`)."""
    if p.argv[1:3] != ("-c", PROBE) or len(p.argv) < 4:
        await p.write("stderr", b"fake python3 runs only the conformance probe\n")
        return 2
    mode, args = p.argv[3], p.argv[4:]

    def beat(path: str, first: anyio.Event | None = None) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            while True:
                p.write_file(path, b".", append=True)
                if first is not None:
                    first.set()
                await anyio.sleep(0.02)

        return run

    if mode == "echo":
        await p.write("stdout", p.stdin)
    elif mode == "env":
        await p.write("stdout", p.env.get(args[0], "<unset>").encode())
    elif mode == "pwd":
        await p.write("stdout", p.cwd.encode())
    elif mode == "exit":
        return int(args[0])
    elif mode == "emit":
        total = int(args[1])
        for start in range(0, total, 1 << 16):
            block = emitted(min(start + (1 << 16), total), start)
            await p.write("stdout" if args[0] == "stdout" else "stderr", block)
    elif mode == "binary":
        await p.write("stdout", bytes(range(256)) * 4)
        await p.write("stderr", b"invalid \xff\xfe utf-8")
    elif mode == "heartbeat":
        await beat(args[0])()
    elif mode == "tree":
        beating = [anyio.Event(), anyio.Event()]
        for name, first in zip(("child.hb", "daemon.hb"), beating, strict=True):
            p.spawn(beat(posixpath.join(args[0], name), first))
        for first in beating:  # ready: both beat (as the real probe)
            await first.wait()
        await p.write("stdout", b"ready\n")
        p.write_file(posixpath.join(args[0], "ready"), b"")
        await anyio.sleep(3600)
    elif mode == "spawn-and-exit":
        p.spawn(beat(posixpath.join(args[0], "bg.hb")))
        await p.write("stdout", b"parent done\n")
    elif mode == "sleep":
        await anyio.sleep(float(args[0]))
    elif mode in ("cat", "write", "mode"):
        try:
            if mode == "cat":
                await p.write("stdout", p.read_file(args[0]))
            elif mode == "write":
                p.write_file(args[0], args[1].encode())
            else:
                await p.write("stdout", b"%o" % (p.stat_mode(args[0]) & 0o777))
        except SandboxFileError as exc:
            await p.write("stderr", f"{exc}\n".encode())
            return 1
    else:
        return 1
    return 0


BUILTIN_COMMANDS: dict[str, FakeCommand] = {
    "true": _true,
    "false": _false,
    "echo": _echo,
    "cat": _cat,
    "sleep": _sleep,
    "pwd": _pwd,
    "env": _env,
    "python3": _probe,
}


class FakeWorld:
    """The sandboxes of one imaginary machine. Backends sharing a world see each other's
    sandboxes (as real backends do through their daemon or disk)."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, _FakeSandbox] = {}
        self.peak_live = 0
        self.created = 0
        self.removed = 0

    @property
    def live(self) -> int:
        return len(self.sandboxes)


class FakeBackend(Backend):
    """In-memory backend with scripted latency and failures (see the module docstring).

    :param create_delay: seconds each ``create`` takes (likewise ``remove_delay``,
        ``exec_delay``).
    :param create_failures: how many of the first ``create`` calls fail with a retryable
        :class:`BackendUnavailable` (to exercise retries).
    :param launch_failures: how many of the first commands fail to launch: ``exec`` raises a
        retryable :class:`~asyncsandbox.LaunchError` and the command never runs (to exercise
        how infrastructure errors are masked). See also :meth:`break_launcher`.
    :param commands: extra commands by program name, overriding the built-in ones.
    :param async_libraries: async libraries to declare (default: asyncio and trio).
    :param world: share sandboxes with other FakeBackends (default: a world of its own).

    ``world.live`` and ``world.peak_live`` count sandboxes as the backend sees them.
    """

    name = "fake"

    def __init__(
        self,
        *,
        create_delay: float = 0.0,
        remove_delay: float = 0.0,
        exec_delay: float = 0.0,
        create_failures: int = 0,
        launch_failures: int = 0,
        commands: Mapping[str, FakeCommand] | None = None,
        async_libraries: frozenset[str] = frozenset({"asyncio", "trio"}),
        world: FakeWorld | None = None,
    ) -> None:
        self.create_delay = create_delay
        self.remove_delay = remove_delay
        self.exec_delay = exec_delay
        self.create_failures = create_failures
        self.launch_failures = launch_failures
        self.commands = {**BUILTIN_COMMANDS, **(commands or {})}
        self.world = world or FakeWorld()
        self._caps = BackendCapabilities(
            async_libraries=async_libraries,
            isolation="none (in-memory fake)",
            enforced_limits=frozenset(),
            best_effort_limits=True,  # a fake: nothing is enforced, nothing is refused
            network_modes=frozenset({"none", "host"}),
            reports_signal=True,
        )

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._caps

    @property
    def sandboxes(self) -> dict[str, _FakeSandbox]:
        return self.world.sandboxes

    def kill(self, sandbox_id: str, reason: str = "killed from outside") -> None:
        """Make a sandbox die (its commands fail with :class:`SandboxDied`)."""
        self.sandboxes[sandbox_id].dead = reason

    def break_launcher(
        self, sandbox_id: str, reason: str | None = "the launcher cannot start commands"
    ) -> None:
        """Make every command of a sandbox fail to launch (``exec`` raises a retryable
        :class:`~asyncsandbox.LaunchError`; the command never runs) until called again with
        ``reason=None``. The sandbox itself stays alive."""
        self.sandboxes[sandbox_id].launch_failure = reason

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if self.create_delay:
            await anyio.sleep(self.create_delay)
        if self.create_failures > 0:
            self.create_failures -= 1
            raise BackendUnavailable("fake: scripted create failure", retryable=True)
        sandbox = _FakeSandbox(self, "f-" + uuid.uuid4().hex[:12], spec)
        world = self.world
        world.sandboxes[sandbox.id] = sandbox
        world.created += 1
        world.peak_live = max(world.peak_live, world.live)
        return sandbox

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        await anyio.lowlevel.checkpoint()
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        await anyio.lowlevel.checkpoint()
        return [
            s.info()
            for s in self.sandboxes.values()
            if all(s.spec.labels.get(k) == v for k, v in labels.items())
        ]


class _FakeSandbox(SandboxHandle):
    def __init__(self, backend: FakeBackend, sandbox_id: str, spec: SandboxSpec) -> None:
        self._backend = backend
        self._id = sandbox_id
        self.spec = spec
        self.fs = _FakeFS(spec.workdir)
        self.dead: str | None = None
        self.launch_failure: str | None = None
        self.created_at = time.time()
        self._trees: set[anyio.CancelScope] = set()

    @property
    def id(self) -> str:
        return self._id

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self._id,
            status=SandboxStatus.DEAD if self.dead else SandboxStatus.RUNNING,
            labels=dict(self.spec.labels),
            image=self.spec.image,
            created_at=self.created_at,
            backend="fake",
        )

    def _check(self) -> None:
        if self.dead is not None:
            raise SandboxDied(self._id, self.dead)
        if self._id not in self._backend.sandboxes:
            raise SandboxDied(self._id, "removed")

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,  # advisory (see the contract)
    ) -> ExitStatus:
        self._check()
        if self._backend.exec_delay:
            await anyio.sleep(self._backend.exec_delay)
        backend = self._backend
        if self.launch_failure is not None or backend.launch_failures > 0:
            if self.launch_failure is None:
                backend.launch_failures -= 1
            reason = self.launch_failure or "scripted launch failure"
            raise LaunchError(f"fake: sandbox {self._id}: {reason}", retryable=True)
        if not self.fs.is_dir(cwd):
            await on_output("stderr", f"cannot change to directory {cwd}\n".encode())
            return ExitStatus(returncode=126)
        command = self._backend.commands.get(posixpath.basename(argv[0]))
        if command is None:
            await on_output("stderr", f"fake: {shlex.quote(argv[0])}: command not found\n".encode())
            return ExitStatus(returncode=127)
        # The task group is the command's process tree: leaving it kills every child.
        returncode: int | None = None
        with single_error():  # children never raise: a command's own error stays unwrapped
            async with anyio.create_task_group() as tree:
                self._trees.add(tree.cancel_scope)
                try:
                    full_env = {
                        "PATH": "/usr/bin:/bin",
                        "HOME": "/home/sandbox",
                        "LANG": "C.UTF-8",
                        **env,
                    }
                    process = FakeProcess(self, argv, cwd, full_env, stdin or b"", on_output, tree)
                    returncode = await command(process)
                    if process.spawned:  # (cancelling costs, and a lone command has no child)
                        tree.cancel_scope.cancel()
                finally:
                    self._trees.discard(tree.cancel_scope)
        self._check()
        if returncode is None:  # its tree was killed by remove()
            raise SandboxDied(self._id, "removed")
        return ExitStatus(returncode=returncode)

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        self._check()
        await anyio.lowlevel.checkpoint()
        data = self.fs.read(path)
        if len(data) > max_bytes:
            raise SandboxFileError(
                FileErrorReason.TOO_LARGE, path, f"{len(data)} > {max_bytes} bytes"
            )
        return data

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        self._check()
        await anyio.lowlevel.checkpoint()
        self.fs.write(path, data, mode)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        self._check()
        buffer = bytearray()
        async for chunk in archive:
            buffer += chunk
        self.fs.untar(path, bytes(buffer))

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        self._check()
        await anyio.lowlevel.checkpoint()
        data = self.fs.tar(path)
        yield _chunks(data)

    async def inspect(self) -> SandboxInfo:
        await anyio.lowlevel.checkpoint()
        if self._id not in self._backend.sandboxes:
            raise SandboxNotFound(self._id)
        return self.info()

    async def remove(self) -> None:
        if self._backend.remove_delay:
            await anyio.sleep(self._backend.remove_delay)
        for scope in list(self._trees):
            scope.cancel()
        if self._backend.sandboxes.pop(self._id, None) is not None:
            self._backend.world.removed += 1


class _chunks:
    def __init__(self, data: bytes, size: int = 1 << 16) -> None:
        self._data = memoryview(data)
        self._size = size

    def __aiter__(self) -> _chunks:
        return self

    async def __anext__(self) -> bytes:
        await anyio.lowlevel.checkpoint()
        if not self._data:
            raise StopAsyncIteration
        chunk, self._data = bytes(self._data[: self._size]), self._data[self._size :]
        return chunk
