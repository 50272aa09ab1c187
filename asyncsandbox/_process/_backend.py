from __future__ import annotations

import builtins
import contextlib
import functools
import os
import re
import shutil
import signal
import stat
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Self

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from anyio import TypedAttributeSet, typed_attribute
from anyio.abc import ByteReceiveStream

from .._errors import (
    BackendUnavailable,
    InvalidArgument,
    SandboxDied,
    SandboxNotFound,
)
from .._log import get_logger
from .._models import SandboxInfo, SandboxStatus
from .._shellfiles import ShellFiles, ShellProcess
from .._util import single_error
from ..abc import (
    Backend,
    BackendCapabilities,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
)
from ._cgroups import Cgroups, SandboxCgroup
from ._isolation import (
    HOME,
    JOIN_CGROUPS,
    READ_ONLY_PREFIXES,
    SANDBOX_UID,
    SANDBOX_USER,
    Bubblewrap,
    Isolation,
    Layout,
    Unshare,
    probe,
)

__all__ = ("ProcessAttributes", "ProcessBackend")

IsolationMode = Literal["auto", "bwrap", "unshare", "none"]
NOBODY = 65534
KILL_DEADLINE = 10.0
READ_CHUNK = 256 * 1024
UNISOLATED_PIPE_GRACE = 1.0
LAUNCHER_EXIT_GRACE = 3.0


class ProcessAttributes(TypedAttributeSet):
    """Typed attributes of process sandboxes (``sandbox.extra(ProcessAttributes.root)``)."""

    root: Path = typed_attribute()
    """The sandbox's directory on the host."""
    isolation: str = typed_attribute()
    """The isolation mode in use: ``bwrap``, ``unshare`` or ``none``."""


def default_root() -> Path:
    env = os.environ.get("ASYNCSANDBOX_PROCESS_ROOT")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        # Must be traversable by the unprivileged sandbox user (so not under /root).
        return Path("/var/lib/asyncsandbox/process")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache, "asyncsandbox", "process")


class _Meta(msgspec.Struct, kw_only=True):
    """Persisted next to each sandbox, so other processes can list and remove it."""

    id: str
    image: str | None
    workdir: str
    network: str
    labels: dict[str, str]
    created_at: float
    expires_at: float | None
    cgroup: bool = False


_meta_decoder = msgspec.json.Decoder(_Meta)


def prepare_layout(layout: Layout, run_as: int | None) -> None:
    """Create a sandbox's directories and user database on the host (synchronous)."""
    layout.root.mkdir(mode=0o711)
    (layout.root / "view").mkdir()  # mount point for the unshare isolation
    (layout.root / "fs").mkdir(mode=0o711)
    for directory in (layout.tmp, layout.home, layout.work):
        directory.mkdir(mode=0o755)
        if run_as is not None:
            os.chown(directory, run_as, run_as)
    layout.tmp.chmod(0o1777)
    uid = SANDBOX_UID
    (layout.root / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\n{SANDBOX_USER}:x:{uid}:{uid}::{HOME}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (layout.root / "group").write_text(f"root:x:0:\n{SANDBOX_USER}:x:{uid}:\nnogroup:x:65534:\n")
    for name in ("passwd", "group"):
        (layout.root / name).chmod(0o644)


def _rmtree(path: Path) -> None:
    def onexc(func: Any, failed: str, exc: BaseException) -> None:
        # A sandbox may leave directories without write permission (chmod 000).
        if isinstance(exc, FileNotFoundError):
            return
        parent = os.path.dirname(failed)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
            os.chmod(failed, stat.S_IRWXU)
        if os.path.isdir(failed) and not os.path.islink(failed):
            shutil.rmtree(failed, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=onexc)
    else:
        shutil.rmtree(path, onerror=lambda func, failed, info: onexc(func, failed, info[1]))


@functools.cache
def _select_isolation(mode: IsolationMode, run_as: int | None, scratch_parent: str) -> Isolation:
    """Pick (and probe, once per process) the isolation to use."""
    candidates: list[Isolation] = []
    if mode == "none":
        return Isolation(run_as)
    if mode in ("auto", "bwrap") and (exe := shutil.which("bwrap")):
        candidates.append(Bubblewrap(run_as, exe))
    if mode in ("auto", "unshare") and (exe := shutil.which("unshare")):
        candidates.append(Unshare(run_as, exe))
    errors: list[str] = []
    for candidate in candidates:
        scratch = Path(scratch_parent, f".probe-{uuid.uuid4().hex[:8]}")
        try:
            error = probe(candidate, scratch)
        finally:
            _rmtree(scratch)
        if error is None:
            return candidate
        errors.append(f"{candidate.name}: {error}")
    wanted = {"auto": "bubblewrap or unshare", "bwrap": "bubblewrap", "unshare": "unshare"}[mode]
    detail = "; ".join(errors) or f"{wanted} is not installed"
    raise BackendUnavailable(
        f"the process backend cannot isolate sandboxes on this machine ({detail}). "
        "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) and allow "
        "unprivileged user namespaces, or pass backend_options={'isolation': 'none'} to run "
        "commands on the host without isolation (unsafe for untrusted code).",
        retryable=False,
    )


class ProcessBackend(Backend):
    """The embedded backend: sandboxes are directories, commands run in Linux namespaces.

    No daemon: every command is a ``bwrap`` (or ``unshare``) child of this process, in fresh
    namespaces over the sandbox's filesystem view. Idle sandboxes cost only disk.
    Memory, pids and CPU limits need cgroups this process may create (root).

    :param root: where sandbox directories live (default ``/var/lib/asyncsandbox/process``
        as root, else ``~/.cache/asyncsandbox/process``; or ``$ASYNCSANDBOX_PROCESS_ROOT``).
    :param isolation: ``"auto"`` (bubblewrap, else unshare, else refuse), ``"bwrap"``,
        ``"unshare"``, or ``"none"`` to run on the host unisolated (unsafe; explicit only).
    :param run_as: host uid sandboxes run as when this process is root (default: nobody).
    """

    name = "process"

    def __init__(
        self,
        *,
        root: str | os.PathLike[str] | None = None,
        isolation: IsolationMode = "auto",
        run_as: int | None = None,
    ) -> None:
        if isolation not in ("auto", "bwrap", "unshare", "none"):
            raise InvalidArgument(
                f"isolation must be auto, bwrap, unshare or none, got {isolation!r}"
            )
        self.root = Path(root) if root is not None else default_root()
        self._mode: IsolationMode = isolation
        self._run_as = (NOBODY if run_as is None else run_as) if os.geteuid() == 0 else None
        self._isolation: Isolation | None = None
        self._cgroups: Cgroups | None = None
        self._caps: BackendCapabilities | None = None
        self._handles: dict[str, ProcessSandbox] = {}

    async def __aenter__(self) -> Self:
        await anyio.to_thread.run_sync(self._setup)
        return self

    def _setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        self.root.chmod(0o711)
        trash = self.root / ".trash"
        trash.mkdir(exist_ok=True, mode=0o700)
        for leftover in trash.iterdir():  # removals interrupted by a crash
            _rmtree(leftover)
        self._isolation = _select_isolation(self._mode, self._run_as, str(self.root))
        self._cgroups = Cgroups.detect() if self._isolation.name != "none" else None
        self._caps = BackendCapabilities(
            isolation=self._isolation.description,
            enforced_limits=self._cgroups.controllers if self._cgroups else frozenset(),
            network_modes=frozenset(
                {"none", "host"} if self._isolation.name != "none" else {"host"}
            ),
            reports_signal=False,
        )
        get_logger().debug(
            "process.backend.ready",
            root=str(self.root),
            isolation=self._isolation.name,
            cgroups=self._cgroups.version if self._cgroups else None,
        )

    @property
    def capabilities(self) -> BackendCapabilities:
        # Until the backend is entered (and has probed the machine) only the static part.
        return self._caps or BackendCapabilities(
            isolation="(not probed yet)", network_modes=frozenset({"none", "host"})
        )

    @property
    def isolation(self) -> Isolation:
        if self._isolation is None:
            raise BackendUnavailable("the process backend is not open (use it through a Session)")
        return self._isolation

    async def aclose(self) -> None:
        self._handles.clear()

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        image: Path | None = None
        if spec.image is not None:
            image = Path(spec.image)
            if not image.is_absolute() or not (image / "bin").exists():
                raise InvalidArgument(
                    f"the process backend runs images given as root filesystem directories "
                    f"(or None for the host's system); {spec.image!r} is not one"
                )
        if any(spec.workdir == p or spec.workdir.startswith(p + "/") for p in READ_ONLY_PREFIXES):
            raise InvalidArgument(
                f"workdir {spec.workdir!r} is inside a read-only system directory"
            )
        top, _, rest = spec.workdir.strip("/").partition("/")
        if image and rest and (image / top).is_dir() and not (image / spec.workdir[1:]).is_dir():
            raise InvalidArgument(
                f"workdir {spec.workdir!r} is inside the image's read-only /{top}: use a "
                "top-level directory or one that exists in the image"
            )
        missing = {"memory_mb", "pids", "cpus"} - self.capabilities.enforced_limits
        wanted = {
            n for n in ("memory_mb", "pids", "cpus") if getattr(spec.resources, n) is not None
        }
        if wanted & missing:
            get_logger().warning(
                "process.limits.unenforced",
                limits=sorted(wanted & missing),
                hint="run as root on a machine with cgroups to enforce them",
            )
        sandbox_id = "p-" + uuid.uuid4().hex[:12]
        layout = Layout(self.root / sandbox_id, image, spec.workdir, spec.network)
        now = time.time()
        meta = _Meta(
            id=sandbox_id,
            image=spec.image,
            workdir=spec.workdir,
            network=spec.network,
            labels=dict(spec.labels),
            created_at=now,
            expires_at=None if spec.max_lifetime is None else now + spec.max_lifetime,
            cgroup=self._cgroups is not None,
        )
        try:
            cgroup = await anyio.to_thread.run_sync(self._create_sync, layout, meta, spec)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a cancelled create leaves nothing behind
                await anyio.to_thread.run_sync(self._remove_sync, sandbox_id, None)
            raise
        handle = ProcessSandbox(self, layout, meta, cgroup)
        self._handles[sandbox_id] = handle
        return handle

    def _create_sync(self, layout: Layout, meta: _Meta, spec: SandboxSpec) -> SandboxCgroup | None:
        prepare_layout(layout, self._run_as)
        cgroup = self._cgroups.create(meta.id, spec.resources) if self._cgroups else None
        tmp = layout.root / "meta.json.tmp"
        tmp.write_bytes(msgspec.json.encode(meta))
        tmp.rename(layout.root / "meta.json")  # visible to list() only once complete
        return cgroup

    def _read_meta(self, sandbox_id: str) -> _Meta | None:
        if not re.fullmatch(r"p-[0-9a-f]{12}", sandbox_id):
            return None
        try:
            return _meta_decoder.decode((self.root / sandbox_id / "meta.json").read_bytes())
        except (OSError, msgspec.DecodeError):
            return None

    def _handle_for(self, meta: _Meta) -> ProcessSandbox:
        handle = self._handles.get(meta.id)
        if handle is None:
            image = None if meta.image is None else Path(meta.image)
            layout = Layout(self.root / meta.id, image, meta.workdir, meta.network)
            cgroup = self._cgroups.attach(meta.id) if (self._cgroups and meta.cgroup) else None
            handle = self._handles[meta.id] = ProcessSandbox(self, layout, meta, cgroup)
        return handle

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        meta = await anyio.to_thread.run_sync(self._read_meta, sandbox_id)
        if meta is None:
            raise SandboxNotFound(sandbox_id)
        return self._handle_for(meta)

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        return await anyio.to_thread.run_sync(self._list_sync, dict(labels))

    def _list_sync(self, labels: dict[str, str]) -> builtins.list[SandboxInfo]:
        infos = []
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        for name in sorted(names):
            meta = self._read_meta(name)
            if meta is None or any(meta.labels.get(k) != v for k, v in labels.items()):
                continue
            infos.append(self._info(meta))
        return infos

    def _info(self, meta: _Meta) -> SandboxInfo:
        expired = meta.expires_at is not None and meta.expires_at < time.time()
        return SandboxInfo(
            id=meta.id,
            status=SandboxStatus.DEAD if expired else SandboxStatus.RUNNING,
            labels=meta.labels,
            image=meta.image,
            created_at=meta.created_at,
            backend=self.name,
        )

    def _remove_sync(self, sandbox_id: str, cgroup: SandboxCgroup | None) -> None:
        trash = self.root / ".trash" / f"{sandbox_id}-{uuid.uuid4().hex[:6]}"
        with contextlib.suppress(FileNotFoundError):
            (self.root / sandbox_id).rename(trash)  # atomic: list() and attach() stop seeing it
        if cgroup is None and self._cgroups is not None:
            cgroup = self._cgroups.attach(sandbox_id)
        if cgroup is not None:
            cgroup.remove()  # kills every process of the sandbox, whoever started it
        if trash.exists():
            _rmtree(trash)


class ProcessSandbox(ShellFiles, SandboxHandle):
    def __init__(
        self, backend: ProcessBackend, layout: Layout, meta: _Meta, cgroup: SandboxCgroup | None
    ) -> None:
        self._backend = backend
        self._layout = layout
        self._meta = meta
        self._cgroup = cgroup
        self._processes: set[anyio.abc.Process] = set()
        self._removed = False

    @property
    def id(self) -> str:
        return self._meta.id

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            ProcessAttributes.root: lambda: self._layout.root,
            ProcessAttributes.isolation: lambda: self._backend.isolation.name,
        }

    def _check_alive(self) -> None:
        if self._removed or not self._layout.root.exists():
            raise SandboxDied(self.id, "removed")
        expires = self._meta.expires_at
        if expires is not None and expires < time.time():
            raise SandboxDied(self.id, "max lifetime exceeded")

    def _command(
        self, argv: tuple[str, ...], cwd: str, env: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        args, spawn_env = self._backend.isolation.command(self._layout, argv, cwd=cwd, env=env)
        if self._cgroup is not None:
            args = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *self._cgroup.procs_files, "--", *args]
        return args, spawn_env

    @asynccontextmanager
    async def _spawn(
        self, argv: tuple[str, ...], *, cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[anyio.abc.Process]:
        """A sandboxed process that is SIGKILLed (with all it started) if the block exits
        before it ended — by an error or by cancellation."""
        self._check_alive()
        args, spawn_env = self._command(argv, cwd, env)
        process = await anyio.open_process(
            args,
            stdin=-1 if stdin else -3,  # subprocess.PIPE / DEVNULL
            env=spawn_env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
        )
        self._processes.add(process)
        try:
            yield process
        finally:
            # Shielded and bounded: every process of the command must be dead before we
            # return, even when our caller is being cancelled.
            with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_DEADLINE):
                await _terminate(process)
            self._processes.discard(process)

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
    ) -> ExitStatus:
        expires = self._meta.expires_at
        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        with anyio.move_on_after(
            float("inf") if expires is None else expires - time.time()
        ) as lifetime:
            async with self._spawn(argv, cwd=cwd, env=env, stdin=stdin is not None) as process:
                with single_error():
                    async with anyio.create_task_group() as tg:
                        assert process.stdout is not None
                        assert process.stderr is not None
                        tg.start_soon(_pump, process.stdout, "stdout", on_output)
                        tg.start_soon(_pump, process.stderr, "stderr", on_output)
                        if stdin is not None:
                            tg.start_soon(_feed, process, stdin)
                        returncode = await process.wait()
                        if self._backend.isolation.name == "none":
                            # No PID namespace: kill what is left of the process group and
                            # stop waiting for pipes that escaped children may hold open.
                            with contextlib.suppress(ProcessLookupError, PermissionError):
                                os.killpg(process.pid, 9)
                            tg.cancel_scope.deadline = anyio.current_time() + UNISOLATED_PIPE_GRACE
                        # Otherwise the namespace died with its PID 1: every pipe is at EOF.
        if lifetime.cancelled_caught:
            raise SandboxDied(self.id, "max lifetime exceeded")
        oom = self._cgroup is not None and self._cgroup.oom_kills() > oom_before
        if returncode < 0:  # the launcher itself was killed by a signal
            returncode = 128 - returncode
        if returncode == 125 and self._cgroup is not None:
            self._check_alive()
        return ExitStatus(returncode=returncode, signal=9 if oom else None, oom_killed=oom)

    @asynccontextmanager
    async def shell(
        self, script: str, args: Sequence[str], *, stdin: bool
    ) -> AsyncIterator[ShellProcess]:
        argv = ("/bin/sh", "-c", script, "sh", *args)
        async with self._spawn(argv, cwd="/", env={"LC_ALL": "C"}, stdin=stdin) as process:
            assert process.stdout is not None
            assert process.stderr is not None
            stderr = bytearray()
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_drain, process.stderr, stderr)
                    yield _Script(process, stderr)
                    tg.cancel_scope.cancel()

    def shell_path(self, path: str) -> str:
        if self._backend.isolation.name == "none":
            return self._layout.host_path(path)
        return path

    async def inspect(self) -> SandboxInfo:
        meta = await anyio.to_thread.run_sync(self._backend._read_meta, self.id)
        if meta is None:
            raise SandboxNotFound(self.id)
        return self._backend._info(meta)

    async def remove(self) -> None:
        self._removed = True
        for process in list(self._processes):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await anyio.to_thread.run_sync(self._backend._remove_sync, self.id, self._cgroup)
        self._backend._handles.pop(self.id, None)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except (OSError, ValueError):
        return []


async def _terminate(process: anyio.abc.Process) -> None:
    """Kill a launched command and everything in its PID namespace; return once all died.

    Our child is the launcher (bwrap or unshare); its child is the namespace's PID 1.
    Killing PID 1 makes the kernel kill every process of the namespace, and the launcher
    exits only after it has reaped PID 1, which happens only once the namespace is empty.
    (Killing just the launcher would work too, through --die-with-parent / --kill-child,
    but asynchronously: processes could outlive our return by a moment.)
    """
    if process.returncode is None:
        inner = _children(process.pid)
        for pid in inner:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if inner:
            with anyio.move_on_after(LAUNCHER_EXIT_GRACE):
                await process.wait()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    await process.aclose()


class _Script:
    """A file-operation script (:class:`ShellProcess`) over an anyio process."""

    def __init__(self, process: anyio.abc.Process, stderr: bytearray) -> None:
        self._process = process
        self._stderr = stderr

    async def send(self, data: bytes) -> None:
        assert self._process.stdin is not None
        await self._process.stdin.send(data)

    async def close_stdin(self) -> None:
        if self._process.stdin is not None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._process.stdin.aclose()

    def __aiter__(self) -> _Script:
        return self

    async def __anext__(self) -> bytes:
        assert self._process.stdout is not None
        chunk = await _receive(self._process.stdout)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def wait(self) -> tuple[int, bytes]:
        returncode = await self._process.wait()
        return returncode, bytes(self._stderr)


async def _receive(stream: ByteReceiveStream) -> bytes | None:
    try:
        return await stream.receive(READ_CHUNK)
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        return None


async def _pump(stream: ByteReceiveStream, name: Any, on_output: OutputCallback) -> None:
    while (chunk := await _receive(stream)) is not None:
        await on_output(name, chunk)


async def _drain(stream: ByteReceiveStream, into: bytearray) -> None:
    while (chunk := await _receive(stream)) is not None:
        into.extend(chunk[: max(0, 4096 - len(into))])


async def _feed(process: anyio.abc.Process, data: bytes) -> None:
    assert process.stdin is not None
    try:
        for offset in range(0, len(data), READ_CHUNK):
            await process.stdin.send(data[offset : offset + READ_CHUNK])
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the command exited without reading all its input: not an error
    finally:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
