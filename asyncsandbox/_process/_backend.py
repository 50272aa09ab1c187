from __future__ import annotations

import builtins
import contextlib
import functools
import os
import re
import resource
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from anyio import TypedAttributeSet, typed_attribute

from .. import _validate as check
from .._errors import (
    BackendUnavailable,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    SandboxDied,
    SandboxNotFound,
)
from .._log import get_logger
from .._models import SandboxInfo, SandboxStatus, SnapshotInfo
from .._shellfiles import InteractiveProcess, ShellFiles
from .._util import single_error
from ..abc import (
    Backend,
    BackendCapabilities,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
)
from . import _layout, _overlay, _state
from ._cgroups import Cgroups, SandboxCgroup
from ._executor import Executor, ExecutorGone
from ._isolation import (
    MODES,
    IsolationUnavailable,
    LaunchOutput,
    Mechanism,
    Mode,
    Native,
    candidates,
    probe,
    scratch_layout,
    transient,
    userns_problem,
)
from ._layout import READ_ONLY_PREFIXES, HostIds, Layout, rmtree
from ._spawn import Child, Pipe, feed, pump, spawn
from ._uids import DEFAULT_RANGE, UidPool

__all__ = ("ProcessAttributes", "ProcessBackend")

UNISOLATED_PIPE_GRACE = 1.0
LAUNCHER_EXIT_GRACE = 3.0
ISOLATION_ENV = "ASYNCSANDBOX_PROCESS_ISOLATION"
LIMITS_ENV = "ASYNCSANDBOX_PROCESS_LIMITS"
LIMITS = ("enforce", "best-effort")
ETC_SWEEP_AGE = 3600.0  # unused /etc snapshots older than this are removed


class ProcessAttributes(TypedAttributeSet):
    """Typed attributes of process sandboxes (``sandbox.extra(ProcessAttributes.root)``)."""

    root: Path = typed_attribute()
    """The sandbox's directory on the host."""
    isolation: str = typed_attribute()
    """The isolation mechanism in use: ``bwrap``, ``native`` or ``none``."""
    fast_path: bool = typed_attribute()
    """Whether commands run through the sandbox's resident executor (see ``fast_path``)."""


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
    etc: str = ""
    host_uid: int | None = None
    host_gid: int | None = None
    quota: bool = False
    snapshot: str | None = None  # started from it (and reset to it)
    layers: list[str] = []  # the snapshot's layers it mounts, top first (see _state)


_meta_decoder = msgspec.json.Decoder(_Meta)


_WARNED: set[str] = set()


def _warn_once(key: str, event: str, **fields: Any) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        get_logger().warning(event, **fields)


_SELECTED: dict[tuple[Mode, bool], Mechanism] = {}
_ETC_SNAPSHOTS: dict[tuple[Path, Path], Path] = {}  # (backend root, system root) -> snapshot


def _select(mode: Mode, seccomp: bool, scratch: Path, etc: Path, ids: HostIds | None) -> Mechanism:
    """The mechanism ``mode`` resolves to on this machine, probed once per process."""
    key = (mode, seccomp)
    if key in _SELECTED:
        return _SELECTED[key]
    problems: list[str] = []
    for candidate in candidates(mode, seccomp=seccomp):
        if isinstance(candidate, IsolationUnavailable):
            problems.append(str(candidate))
            continue
        layout = scratch_layout(scratch, etc, ids)
        try:
            problem = probe(candidate, layout)
        finally:
            rmtree(layout.root)
        if problem is None:
            _SELECTED[key] = candidate
            return candidate
        problems.append(problem)
    if mode in ("auto", "native") and (why := userns_problem()):
        problems.append(why)
    hints = [
        "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)",
        "or allow unprivileged user namespaces",
    ]
    if any(p.startswith("seccomp") for p in problems):
        hints.append(
            "or pass backend_options={'seccomp': False} to run without the seccomp filter "
            "(weaker isolation)"
        )
    hints.append(
        "or pass backend_options={'isolation': 'none'} to run commands on the host without "
        "any isolation (unsafe for untrusted code)"
    )
    raise BackendUnavailable(
        "the process backend cannot isolate sandboxes on this machine ("
        + "; ".join(problems)
        + "). To fix it: "
        + ", ".join(hints)
        + ".",
        retryable=False,
    )


class ProcessBackend(Backend):
    """The embedded backend: sandboxes are directories, commands run in Linux namespaces.

    No daemon: every command is launched, by bubblewrap or by our own launcher, into fresh
    namespaces over the sandbox's filesystem view. Idle sandboxes cost only disk. Memory,
    pids and CPU limits and disk quotas need root (cgroups, a tmpfs per sandbox).

    :param root: where sandbox directories live (default ``/var/lib/asyncsandbox/process``
        as root, else ``~/.cache/asyncsandbox/process``; or ``$ASYNCSANDBOX_PROCESS_ROOT``).
    :param isolation: ``"auto"`` (bubblewrap if installed, else the native launcher, else
        refuse with what is missing), ``"bwrap"``, ``"native"``, or ``"none"`` to run on the
        host unisolated (unsafe; explicit only, with a warning). Default:
        ``$ASYNCSANDBOX_PROCESS_ISOLATION``, else ``"auto"``.
    :param seccomp: load the seccomp filter (default). ``False`` is a weaker mode, for
        machines without libseccomp; it is logged as a warning.
    :param uid_range: ``(first, count)``: host uids for sandboxes when running as root,
        one per live sandbox (default: 2^20 uids from ``0x70000000``).
    :param fast_path: run each sandbox's commands through a resident executor (the native
        launcher, staying in the sandbox's namespaces: a fork per command instead of a
        launcher), started at the sandbox's first command and stopped after
        ``executor_idle`` seconds without one. Where the native launcher cannot run (or
        with ``False``), every command is launched on its own by the chosen mechanism.
    :param executor_idle: seconds an executor waits for its next command before it stops
        (``None``: until the sandbox is removed).
    :param limits: ``"enforce"`` (default): a sandbox asking for a limit this backend
        cannot enforce here is refused, naming the limit and how to get it;
        ``"best-effort"``: such sandboxes run without it (a weaker mode, explicit only,
        with a warning). Default: ``$ASYNCSANDBOX_PROCESS_LIMITS``, else ``"enforce"``.
    """

    name = "process"

    def __init__(
        self,
        *,
        root: str | os.PathLike[str] | None = None,
        isolation: Mode | None = None,
        seccomp: bool = True,
        uid_range: tuple[int, int] | list[int] | None = None,
        fast_path: bool = True,
        executor_idle: float | None = 30.0,
        limits: str | None = None,
    ) -> None:
        mode = isolation if isolation is not None else os.environ.get(ISOLATION_ENV) or "auto"
        if mode not in MODES:
            where = "isolation" if isolation is not None else f"${ISOLATION_ENV}"
            raise InvalidArgument(f"{where} must be one of {', '.join(MODES)}; got {mode!r}")
        chosen = limits if limits is not None else os.environ.get(LIMITS_ENV) or "enforce"
        if chosen not in LIMITS:
            where = "limits" if limits is not None else f"${LIMITS_ENV}"
            raise InvalidArgument(f"{where} must be one of {', '.join(LIMITS)}; got {chosen!r}")
        self._best_effort = chosen == "best-effort"
        if not isinstance(seccomp, bool):
            raise InvalidArgument(f"seccomp must be a bool, got {seccomp!r}")
        if not isinstance(fast_path, bool):
            raise InvalidArgument(f"fast_path must be a bool, got {fast_path!r}")
        self._executor_idle = check.seconds("executor_idle", executor_idle)
        if self._executor_idle == 0:
            raise InvalidArgument("executor_idle must be > 0 or None")
        self.root = Path(root) if root is not None else default_root()
        self._mode: Mode = mode
        self._seccomp = seccomp
        self._uids: UidPool | None = None
        if os.geteuid() == 0:
            first, count = _uid_range(uid_range)
            self._uids = UidPool(first, count)
        elif uid_range is not None:
            raise InvalidArgument("uid_range needs root (without it, sandboxes run as you)")
        self._mechanism: Mechanism | None = None
        self._fast_path = fast_path and mode != "none"
        self._native: Native | None = None  # the fast path's, once probed
        self._task_group: anyio.abc.TaskGroup | None = None
        self._cgroups: Cgroups | None = None
        self._caps: BackendCapabilities | None = None
        self._handles: dict[str, ProcessSandbox] = {}
        # The uid snapshot layers belong to, where sandboxes mount them (root, a kernel
        # with idmapped overlay layers); None: snapshots are copies (see _state).
        self._layer_owner: int | None = None

    async def __aenter__(self) -> Self:
        try:
            await anyio.to_thread.run_sync(self._setup)
        except OSError as exc:
            raise BackendUnavailable(
                f"the process backend cannot prepare its root {self.root}: {exc}"
            ) from exc
        # The executors' readers run here; exited in aclose() (same task).
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        return self

    def _setup(self) -> None:
        _raise_descriptor_limit()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        self.root.chmod(0o711)
        for hidden, mode in ((".trash", 0o700), (".etc", 0o711), (_state.SNAPSHOTS, 0o700)):
            (self.root / hidden).mkdir(exist_ok=True, mode=mode)
        for leftover in (self.root / ".trash").iterdir():  # removals interrupted by a crash
            with contextlib.suppress(OSError):  # (never delete what is still mounted)
                _overlay.unmount_under(leftover)
                rmtree(leftover)
        self._sweep_etc()
        _state.sweep(self.root)
        probe_ids = self._uids.claim(self.root / ".probe") if self._uids else None
        try:
            self._mechanism = _select(
                self._mode, self._seccomp, self.root, self._etc_for(None), probe_ids
            )
            if self._fast_path:
                self._native = self._fast_path_mechanism(probe_ids)
            if probe_ids is not None and self._uids is not None:
                self._layer_owner = self._probe_layers(probe_ids, self._uids.start - 1)
        finally:
            if self._uids and probe_ids:
                self._uids.release(probe_ids, self.root / ".probe")
        mechanism = self._mechanism
        if not mechanism.isolated:
            _warn_once(
                "none",
                "process.isolation.none",
                hint="commands run on the host without isolation: unsafe for untrusted code",
            )
        elif not self._seccomp:
            _warn_once(
                "seccomp",
                "process.isolation.weaker",
                missing="seccomp filter",
                hint="sandboxed commands may use ptrace, io_uring, bpf and other calls the "
                "filter would deny",
            )
        self._cgroups = Cgroups.detect() if mechanism.isolated else None
        limits = set(self._cgroups.controllers) if self._cgroups else set()
        if self._uids is not None and mechanism.isolated:
            limits.add("disk_mb")
        self._caps = BackendCapabilities(
            isolation=mechanism.describe(root=self._uids is not None)
            + (
                "; commands forked by a resident executor per sandbox (fast path, native)"
                if self._native is not None
                else ""
            )
            + (
                "; snapshots are overlay layers (O(changed))"
                if self._layer_owner is not None
                else "; snapshots are copies (O(data) without reflinks)"
            ),
            enforced_limits=frozenset(limits),
            # Without isolation nothing is enforced: that mode is explicit and warned of.
            best_effort_limits=self._best_effort or not mechanism.isolated,
            limits_note=self._limits_note(frozenset(limits)),
            network_modes=frozenset({"none", "host"} if mechanism.isolated else {"host"}),
            reports_signal=False,
            snapshots=True,
            # Without isolation, a command's daemons leave its process group: a reset
            # could not be sure that none survives.
            reset=mechanism.isolated,
            interactive=True,
        )
        get_logger().debug(
            "process.backend.ready",
            root=str(self.root),
            isolation=mechanism.name,
            cgroups=self._cgroups.version if self._cgroups else None,
        )

    def _limits_note(self, enforced: frozenset[str]) -> str:
        """Why the limits missing from ``enforced`` cannot be had here, and how to."""
        why = []
        if not {"memory_mb", "pids", "cpus"} <= enforced:
            if os.geteuid() == 0:
                why.append(
                    "this machine gives this process no writable cgroup controllers "
                    "(memory, pids, cpu) for memory_mb, pids and cpus"
                )
            else:
                why.append("memory_mb, pids and cpus need cgroups, which need root")
        if "disk_mb" not in enforced:
            why.append("disk_mb needs root (a tmpfs of that size per sandbox)")
        if not why:
            return ""
        return (
            "; ".join(why)
            + f"; to run without them, backend_options={{'limits': 'best-effort'}} (or "
            f"${LIMITS_ENV}=best-effort)"
        )

    def _probe_layers(self, ids: HostIds, owner: int) -> int | None:
        """``owner`` if this kernel mounts idmapped layers under an overlay, else None."""
        scratch = self.root / ".trash" / f"probe-{uuid.uuid4().hex[:8]}"
        layer = scratch / _state.LAYERS / "layer"
        (layer / "work").mkdir(parents=True)
        os.chown(layer / "work", owner, owner)
        layout = Layout(
            root=scratch / "sandbox",
            image=None,
            workdir="/workspace",
            network="none",
            etc=Path("/"),
            host_ids=ids,
        )
        try:
            _layout.prepare(layout, layered=True)
            _state.mount_layers(layout, ["layer"], owner)
            ok = (layout.root / "fs" / "work").stat().st_uid == ids.uid
        except OSError as exc:
            get_logger().debug("process.snapshots.copies", reason=str(exc))
            ok = False
        finally:
            with contextlib.suppress(OSError):
                _overlay.unmount_under(scratch)
                rmtree(scratch)
        return owner if ok else None

    def _fast_path_mechanism(self, probe_ids: HostIds | None) -> Native | None:
        """The native launcher for resident executors, if it runs here."""
        if isinstance(self._mechanism, Native):
            return self._mechanism
        try:
            native = _select("native", self._seccomp, self.root, self._etc_for(None), probe_ids)
        except BackendUnavailable as exc:
            get_logger().debug("process.fast_path.unavailable", reason=str(exc))
            return None
        assert isinstance(native, Native)
        return native

    def _etc_for(self, image: Path | None) -> Path:
        """The /etc snapshot of the host (``None``) or of an image, made on first use in
        this process (and shared by its backends with the same root)."""
        key = (self.root, Path("/") if image is None else image)
        snapshot = _ETC_SNAPSHOTS.get(key)
        if snapshot is None or not snapshot.is_dir():
            snapshot = _ETC_SNAPSHOTS[key] = _layout.etc_snapshot(self.root / ".etc", key[1])
        return snapshot

    def _sweep_etc(self) -> None:
        """Remove /etc snapshots no sandbox uses any more (older ones only: another
        process sharing this root may have just made one)."""
        used = set()
        for name in os.listdir(self.root):
            meta = self._read_meta(name)
            if meta is not None:
                used.add(meta.etc)
        now = time.time()
        for snapshot in (self.root / ".etc").iterdir():
            with contextlib.suppress(FileNotFoundError):
                old = now - snapshot.stat().st_mtime > ETC_SWEEP_AGE
                if old and str(snapshot) not in used:
                    rmtree(snapshot)

    @property
    def capabilities(self) -> BackendCapabilities:
        # Until the backend is entered (and has probed the machine) only the static part.
        return self._caps or BackendCapabilities(
            isolation="(not probed yet)", network_modes=frozenset({"none", "host"})
        )

    @property
    def mechanism(self) -> Mechanism:
        if self._mechanism is None:
            raise BackendUnavailable("the process backend is not open (use it through a Session)")
        return self._mechanism

    async def aclose(self) -> None:
        # Shielded: the executors (and every command they run) must stop with us.
        with anyio.CancelScope(shield=True):
            for handle in list(self._handles.values()):
                await handle.stop_executor()
        self._handles.clear()
        if self._task_group is not None:
            task_group, self._task_group = self._task_group, None
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)

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
        if spec.snapshot is not None:
            snapshot = await anyio.to_thread.run_sync(self._snapshot_meta, spec.snapshot)
            if spec.image is not None and spec.image != snapshot.image:
                raise InvalidArgument(
                    f"snapshot {snapshot.id} was taken of image {snapshot.image!r}, not "
                    f"{spec.image!r}"
                )
            image = None if snapshot.image is None else Path(snapshot.image)
            if snapshot.layers and self._layer_owner is None:
                raise InvalidArgument(
                    f"snapshot {snapshot.id} is made of layers, which only a backend running "
                    "as root (on a kernel with idmapped mounts) can mount"
                )
        sandbox_id = "p-" + uuid.uuid4().hex[:12]
        now = time.time()
        meta = _Meta(
            id=sandbox_id,
            image=None if image is None else str(image),
            workdir=spec.workdir,
            network=spec.network,
            labels=dict(spec.labels),
            created_at=now,
            expires_at=None if spec.max_lifetime is None else now + spec.max_lifetime,
            cgroup=self._cgroups is not None,
            quota=spec.resources.disk_mb is not None
            and "disk_mb" in self.capabilities.enforced_limits,
            snapshot=spec.snapshot,
            layers=snapshot.layers if spec.snapshot is not None else [],
        )
        try:
            layout, cgroup = await anyio.to_thread.run_sync(self._create_sync, meta, spec)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a cancelled create leaves nothing behind
                await anyio.to_thread.run_sync(self._remove_sync, sandbox_id, None)
            raise
        handle = ProcessSandbox(self, layout, meta, cgroup)
        self._handles[sandbox_id] = handle
        return handle

    def _create_sync(self, meta: _Meta, spec: SandboxSpec) -> tuple[Layout, SandboxCgroup | None]:
        directory = self.root / meta.id
        ids = self._uids.claim(directory) if self._uids else None
        image = None if meta.image is None else Path(meta.image)
        meta.etc = str(self._etc_for(image))
        if ids is not None:
            meta.host_uid, meta.host_gid = ids.uid, ids.gid
        layout = self._layout(meta)
        quota = spec.resources.disk_mb if meta.quota else None
        _layout.prepare(layout, disk_mb=quota, layered=bool(meta.layers))
        cgroup = self._cgroups.create(meta.id, spec.resources) if self._cgroups else None
        if meta.layers:
            assert self._layer_owner is not None
            # Until its meta.json names them, nothing may delete the layers it mounts.
            with _state.layers_lock(self.root):
                self._snapshot_dir(meta.snapshot or "")  # not deleted meanwhile
                _state.mount_layers(layout, meta.layers, self._layer_owner)
                self._write_meta(layout, meta)
            return layout, cgroup
        if meta.snapshot is not None:
            _state.restore(self._snapshot_dir(meta.snapshot), layout)
        self._write_meta(layout, meta)
        return layout, cgroup

    @staticmethod
    def _write_meta(layout: Layout, meta: _Meta) -> None:
        tmp = layout.root / "meta.json.tmp"
        tmp.write_bytes(msgspec.json.encode(meta))
        tmp.rename(layout.root / "meta.json")  # visible to list() only once complete

    # -- snapshots -------------------------------------------------------------------------

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        path = _state.directory(self.root, snapshot_id)
        if path is None or not path.is_dir():
            raise InvalidArgument(
                f"no snapshot {snapshot_id!r} in the process backend at {self.root} (it was "
                "deleted, or taken by another backend)"
            )
        return path

    def _snapshot_meta(self, snapshot_id: str) -> _state.SnapshotMeta:
        meta = _state.read_meta(self._snapshot_dir(snapshot_id))
        if meta is None:
            raise InvalidArgument(f"snapshot {snapshot_id!r} is unreadable")
        return meta

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        metas = await anyio.to_thread.run_sync(_state.listed, self.root)
        return [SnapshotInfo(id=m.id, labels=m.labels, created_at=m.created_at) for m in metas]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        path = _state.directory(self.root, snapshot_id)
        if path is None:
            raise InvalidArgument(f"{snapshot_id!r} is not a process backend snapshot id")
        trash = self.root / ".trash" / f"{snapshot_id}-{uuid.uuid4().hex[:6]}"

        def delete() -> None:
            with contextlib.suppress(FileNotFoundError):
                path.rename(trash)  # atomic: no sandbox starts from half of it
                rmtree(trash)
            self._gc_layers()

        await anyio.to_thread.run_sync(delete)

    def _gc_layers(self) -> None:
        """Delete the layers no snapshot and no live sandbox uses."""
        if self._layer_owner is None:
            return
        live: set[str] = set()
        for name in os.listdir(self.root):
            meta = self._read_meta(name)
            if meta is not None:
                live.update(meta.layers)
        _state.gc_layers(self.root, live)

    def _layout(self, meta: _Meta) -> Layout:
        ids = None if meta.host_uid is None else HostIds(meta.host_uid, meta.host_gid or 0)
        return Layout(
            root=self.root / meta.id,
            image=None if meta.image is None else Path(meta.image),
            workdir=meta.workdir,
            network=meta.network,
            etc=Path(meta.etc),
            host_ids=ids,
        )

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
            cgroup = self._cgroups.attach(meta.id) if (self._cgroups and meta.cgroup) else None
            handle = ProcessSandbox(self, self._layout(meta), meta, cgroup)
            self._handles[meta.id] = handle
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
        directory = self.root / sandbox_id
        meta = self._read_meta(sandbox_id)
        trash = self.root / ".trash" / f"{sandbox_id}-{uuid.uuid4().hex[:6]}"
        with contextlib.suppress(FileNotFoundError):
            directory.rename(trash)  # atomic: list() and attach() stop seeing it
        if cgroup is None and self._cgroups is not None:
            cgroup = self._cgroups.attach(sandbox_id)
        if cgroup is not None:
            cgroup.remove()  # kills every process of the sandbox, whoever started it
        if trash.exists():
            # Never delete through a mount: a layer under it is other sandboxes' too.
            _overlay.unmount_under(trash)
            rmtree(trash)
        if meta is not None and meta.host_uid is not None and self._uids is not None:
            self._uids.release(HostIds(meta.host_uid, meta.host_gid or 0), directory)
        if meta is not None and meta.layers:
            self._gc_layers()


def _uid_range(value: object) -> tuple[int, int]:
    if value is None:
        return DEFAULT_RANGE
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and value[0] >= 65536
        and value[1] >= 1
        and value[0] + value[1] < 2**32 - 1
    ):
        return int(value[0]), int(value[1])
    raise InvalidArgument(
        f"uid_range must be (first, count) with first >= 65536 and the range below 2**32 - 1, "
        f"got {value!r}"
    )


def _raise_descriptor_limit() -> None:
    """Lift this process's soft limit on open descriptors to its hard limit.

    A live sandbox holds about six descriptors while a command runs (its executor's
    channel, the command's pipes, a pidfd), so the usual soft limit of 1,024 for
    unprivileged users runs out near 170 concurrent sandboxes, while the hard limit
    (typically 2^19 or more) is the one the administrator meant. Python's own
    selectors and subprocess handle descriptors above 1,023; nothing here uses select().
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (OSError, ValueError):  # a limit the kernel refuses (above fs.nr_open)
            return
        get_logger().debug("process.descriptors.raised", soft=soft, now=wanted)


class ProcessSandbox(ShellFiles, SandboxHandle):
    def __init__(
        self, backend: ProcessBackend, layout: Layout, meta: _Meta, cgroup: SandboxCgroup | None
    ) -> None:
        self._backend = backend
        self._layout = layout
        self._meta = meta
        self._cgroup = cgroup
        self._processes: set[Child] = set()
        self._removed = False
        self._executor: Executor | None = None
        self._executor_lock = anyio.Lock()

    @property
    def id(self) -> str:
        return self._meta.id

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            ProcessAttributes.root: lambda: self._layout.root,
            ProcessAttributes.isolation: lambda: self._backend.mechanism.name,
            ProcessAttributes.fast_path: lambda: self._backend._native is not None,
        }

    def _check_alive(self) -> None:
        if self._removed or not self._layout.root.exists():
            raise SandboxDied(self.id, "removed")
        expires = self._meta.expires_at
        if expires is not None and expires < time.time():
            raise SandboxDied(self.id, "max lifetime exceeded")

    @property
    def _cgroup_files(self) -> Sequence[str]:
        return self._cgroup.procs_files if self._cgroup is not None else ()

    # -- commands ------------------------------------------------------------------------

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
        expires = self._meta.expires_at
        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        with anyio.move_on_after(
            float("inf") if expires is None else expires - time.time()
        ) as lifetime:
            async with self._started(argv, cwd, env, stdin is not None) as run:
                with single_error():
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(pump, run.stdout, "stdout", on_output)
                        tg.start_soon(pump, run.stderr, "stderr", on_output)
                        if stdin is not None:
                            assert run.stdin is not None
                            tg.start_soon(feed, run.stdin, stdin)
                        returncode = await run.wait()
                        if not self._backend.mechanism.isolated:
                            # No PID namespace: stop waiting for pipes that escaped
                            # children may hold open. Otherwise every pipe is at its end.
                            tg.cancel_scope.deadline = anyio.current_time() + UNISOLATED_PIPE_GRACE
        if lifetime.cancelled_caught:
            raise SandboxDied(self.id, "max lifetime exceeded")
        oom = self._cgroup is not None and self._cgroup.oom_kills() > oom_before
        if returncode < 0:  # the launcher itself was killed by a signal
            returncode = 128 - returncode
        return ExitStatus(returncode=returncode, signal=9 if oom else None, oom_killed=oom)

    @asynccontextmanager
    async def _started(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[_Run]:
        """A command, once started: forked by the sandbox's executor (the fast path), or
        by a launcher that builds the sandbox around it. Killed, with all it started, if
        the block exits before it ended."""
        executor = await self._executor_or_none()
        if executor is not None:
            async with self._run_on(executor, argv, cwd, env, stdin) as run:
                yield run
        else:
            async with self._launched(argv, cwd, env, stdin) as run:
                yield run

    @asynccontextmanager
    async def _run_on(
        self, executor: Executor, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[_Run]:
        """A command run by the executor, once started, with its pipes. Killed (and waited
        for) if the block exits before it ended; raise :class:`LaunchError` if it could
        not be started."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = (
            os.pipe2(os.O_CLOEXEC)
            if stdin
            else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
        )
        run = _Run(Pipe(out_r), Pipe(err_r), Pipe(in_w) if in_w >= 0 else None)
        try:
            try:
                run.command = await executor.run(
                    argv, cwd=cwd, env=self._layout.env(env), stdin=in_r, stdout=out_w, stderr=err_w
                )
                run.exited = functools.partial(executor.wait, run.command)
            except ExecutorGone as exc:
                # The command was never handed over: a new executor may run it.
                await self._drop_executor(executor)
                raise LaunchError(f"sandbox {self.id}: {exc}", retryable=True) from exc
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
            try:
                if not await run.stderr.started():
                    try:
                        returncode = await executor.wait(run.command)
                    except ExecutorGone as exc:  # gone before the command started
                        await self._drop_executor(executor)
                        raise LaunchError(f"sandbox {self.id}: {exc}", retryable=True) from exc
                    self._check_alive()
                    raise self._launch_error(returncode, run.stderr.launcher_output)
                yield run
            finally:
                # Whenever the block exits before the command ended (an error, a
                # cancellation, or a caller done with it: an interactive process), its
                # whole tree must be gone before we return. Shielded and bounded; an
                # executor that does not confirm it is given up (with every command of the
                # sandbox: that is the only way to be sure). A no-op for an ended command.
                with anyio.CancelScope(shield=True):
                    with anyio.move_on_after(self._backend.timeouts.cleanup) as scope:
                        await executor.kill(run.command)
                    if scope.cancelled_caught:
                        await self._drop_executor(executor)
        finally:
            run.close()

    async def _executor_or_none(self) -> Executor | None:
        """The sandbox's executor (started now if needed), or None for the per-command path."""
        native = self._backend._native
        if native is None:
            return None
        self._check_alive()
        async with self._executor_lock:
            executor = self._executor
            if executor is not None and executor.alive:
                return executor
            if executor is not None:
                await self._drop_executor(executor)
            self._executor = executor = await self._start_executor(native)
            return executor

    async def _start_executor(self, native: Native) -> Executor:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            launch = native.executor(
                self._layout, control=theirs.fileno(), cgroups=self._cgroup_files
            )
            try:
                process = spawn(
                    launch.argv,
                    env=launch.env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    pass_fds=[*launch.fds, theirs.fileno()],
                    stdin=False,
                )
            finally:
                launch.close()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._processes.add(process)
        ours.setblocking(False)
        executor = Executor(process, ours)
        try:
            output = LaunchOutput(process.stderr)
            if not await output.started():
                returncode = await process.wait()
                self._check_alive()
                raise self._launch_error(returncode, output.launcher_output)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await executor.aclose()
                self._processes.discard(process)
            raise
        assert self._backend._task_group is not None
        self._backend._task_group.start_soon(self._keep, executor, name=f"executor {self.id}")
        return executor

    async def _keep(self, executor: Executor) -> None:
        """Serve the executor's answers until it goes; stop it once idle for
        ``executor_idle`` seconds (the next command starts a new one)."""
        idle = self._backend._executor_idle
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor.serve)
            while idle is not None and executor.alive:
                await anyio.sleep(max(0.0, executor.last_used + idle - anyio.current_time()))
                if executor.busy or anyio.current_time() - executor.last_used < idle:
                    continue
                async with self._executor_lock:  # a command may just be asking for it
                    if not executor.busy:
                        await self._drop_executor(executor)

    async def _drop_executor(self, executor: Executor) -> None:
        if self._executor is executor:
            self._executor = None
        await executor.aclose()
        self._processes.discard(executor.process)

    async def stop_executor(self) -> None:
        """Stop the executor, if any: every command it runs dies."""
        if self._executor is not None:
            await self._drop_executor(self._executor)

    # -- the per-command path --------------------------------------------------------------

    @asynccontextmanager
    async def _launched(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[_Run]:
        """A command with a launcher of its own, once it started (its setup done, its
        program being executed). It is SIGKILLed (with all it started) if the block exits
        before it ended, by an error or by cancellation. Raise :class:`LaunchError` if it
        could not be set up: then it never ran."""
        self._check_alive()
        try:
            launch = self._backend.mechanism.launch(
                self._layout, argv, cwd=cwd, env=env, cgroups=self._cgroup_files
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        try:
            process = spawn(
                launch.argv,
                env=launch.env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                pass_fds=launch.fds,
                stdin=stdin,
            )
        finally:
            launch.close()
        self._processes.add(process)
        isolated = self._backend.mechanism.isolated

        async def exited() -> int:
            returncode = await process.wait()
            if not isolated:  # no PID namespace: kill what is left of its process group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            if process.status_lost:
                raise InfrastructureError(
                    f"sandbox {self.id}: the command's exit status is lost: something else "
                    "in this process reaped its launcher (SIGCHLD is ignored here, or a "
                    "library waits for every child with waitpid(-1)); leave SIGCHLD at its "
                    "default"
                )
            return returncode

        run = _Run(process.stdout, process.stderr, process.stdin)
        run.exited = exited
        try:
            if not await run.stderr.started():
                returncode = await process.wait()
                self._check_alive()  # the sandbox removed or expired under the launch
                raise self._launch_error(returncode, run.stderr.launcher_output)
            if run.stderr.launcher_output:
                get_logger().debug(
                    "process.launcher.output", output=run.stderr.launcher_output[-2000:]
                )
            yield run
        finally:
            # Shielded and bounded: every process of the command must be dead before we
            # return, even when our caller is being cancelled.
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(self._backend.timeouts.cleanup),
            ):
                await _terminate(process)
            self._processes.discard(process)

    def _launch_error(self, returncode: int, output: str) -> LaunchError:
        mechanism = self._backend.mechanism.name
        message = output.strip() or f"it exited with status {returncode} and said nothing"
        error = LaunchError(
            f"sandbox {self.id}: the {mechanism} launcher could not start the command: {message}",
            retryable=transient(message),
        )
        get_logger().warning(
            "process.launch.failed",
            sandbox_id=self.id,
            mechanism=mechanism,
            error=message[-2000:],
            retryable=error.retryable,
        )
        return error

    # -- interactive processes (file operations, the code interpreter) ----------------------

    @asynccontextmanager
    async def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AsyncIterator[InteractiveProcess]:
        async with self._started(argv, cwd, env, stdin) as run:
            started = _Script(run)
            with single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(started.read_stderr)
                    yield started
                    tg.cancel_scope.cancel()

    def shell_path(self, path: str) -> str:
        if not self._backend.mechanism.isolated:
            return self._layout.host_path(path)
        return path

    async def inspect(self) -> SandboxInfo:
        meta = await anyio.to_thread.run_sync(self._backend._read_meta, self.id)
        if meta is None:
            raise SandboxNotFound(self.id)
        return self._backend._info(meta)

    # -- state -----------------------------------------------------------------------------

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        self._check_alive()
        if (self._cgroup is None or not self._cgroup.can_freeze) and self._commands_running():
            raise InvalidArgument(
                f"sandbox {self.id}: a snapshot while commands run needs the cgroup freezer "
                "(root, cgroup v2); wait for the commands to end"
            )
        meta = _state.SnapshotMeta(
            id=_state.new_id(),
            image=self._meta.image,
            workdir=self._meta.workdir,
            source=self.id,
            created_at=time.time(),
            labels=dict(labels or {}),
        )
        target = self._backend.root / _state.SNAPSHOTS / meta.id
        try:
            await anyio.to_thread.run_sync(
                functools.partial(
                    _state.take,
                    self._layout,
                    meta,
                    target,
                    self._cgroup,
                    layers=self._meta.layers,
                    owner=self._backend._layer_owner,
                )
            )
        except BaseException:
            with anyio.CancelScope(shield=True):  # cancelled after the copy: nothing stays
                await self._backend.delete_snapshot(meta.id)
            raise
        return meta.id

    async def reset(self) -> None:
        self._check_alive()
        if not self._backend.mechanism.isolated:
            raise InvalidArgument("the process backend resets only isolated sandboxes")
        # Every command goes, with what it left: the executor kills them all and gives the
        # next ones a fresh IPC namespace and /dev/shm, so it stays (the next episode's
        # first command costs no executor start); without one (or if it cannot), it goes
        # too, with the namespaces it holds. Each launched command goes, and whatever
        # else is in the cgroup.
        layers = self._meta.layers  # a reset remounts them: the view goes, with the executor
        executor = None if layers else self._executor
        if executor is not None and executor.alive:
            try:
                with anyio.fail_after(self._backend.timeouts.cleanup):
                    await executor.reset()
            except (InfrastructureError, TimeoutError):
                executor = None
        if executor is None or not executor.alive:
            executor = None
            await self.stop_executor()
        for process in list(self._processes):
            if executor is None or process is not executor.process:
                process.kill()
        with anyio.fail_after(self._backend.timeouts.cleanup):
            for process in list(self._processes):
                if executor is None or process is not executor.process:
                    await process.wait()  # a launcher's namespace dies with it, and all in it
        layout, snapshot = self._layout, self._meta.snapshot
        # The executor's launcher, and the executor under it (PID 1 of the sandbox).
        kept = (
            set() if executor is None else {executor.process.pid, *_children(executor.process.pid)}
        )

        def restore() -> None:
            if self._cgroup is not None and not self._cgroup.kill_all(sparing=kept):
                raise OSError(f"sandbox {self.id}: processes survived the cgroup's kill")
            if layers:  # its own layer dropped: O(what the episode changed)
                _state.reset_layers(layout, layers)
                return
            if executor is not None:
                _state.empty(layout)  # the executor's view binds the areas: they stay
            else:
                _state.wipe(layout)
                _layout.populate(layout)
            if snapshot is not None:
                _state.restore(self._backend._snapshot_dir(snapshot), layout)

        await anyio.to_thread.run_sync(restore)

    def _commands_running(self) -> bool:
        executor = self._executor
        return any(
            executor is None or process is not executor.process or executor.busy
            for process in self._processes
        )

    async def remove(self) -> None:
        self._removed = True
        await self.stop_executor()
        for process in list(self._processes):
            process.kill()
        await anyio.to_thread.run_sync(self._backend._remove_sync, self.id, self._cgroup)
        self._backend._handles.pop(self.id, None)


class _Run:
    """A started command: our ends of its pipes, and its exit status to wait for."""

    def __init__(self, stdout: Pipe, stderr: Pipe, stdin: Pipe | None) -> None:
        self.stdout = stdout
        self.stderr = LaunchOutput(stderr)
        self.stdin = stdin
        self._pipes = (stdout, stderr, stdin)
        self.command: Any = None  # the executor's request, on the fast path
        self.exited: Callable[[], Awaitable[int]] | None = None

    async def wait(self) -> int:
        """Its exit status, once every process of it is gone."""
        assert self.exited is not None
        return await self.exited()

    def close(self) -> None:
        for pipe in self._pipes:
            if pipe is not None:
                pipe.close()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except (OSError, ValueError):
        return []


async def _terminate(process: Child) -> None:
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
            process.kill()
    await process.aclose()


class _Script:
    """An interactive process (:class:`InteractiveProcess`): a started command whose stderr
    (its first 4 KiB) says why it failed. Run :meth:`read_stderr` alongside."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self._stderr = bytearray()
        self._stderr_read = anyio.Event()

    async def read_stderr(self) -> None:
        try:
            while (chunk := await self._run.stderr.receive()) is not None:
                self._stderr.extend(chunk[: max(0, 4096 - len(self._stderr))])
        finally:
            self._stderr_read.set()

    async def send(self, data: bytes) -> None:
        stdin = self._run.stdin
        if stdin is None or stdin.closed:
            raise anyio.ClosedResourceError
        try:
            await stdin.send(data)
        except BrokenPipeError:
            raise anyio.BrokenResourceError from None

    async def close_stdin(self) -> None:
        if self._run.stdin is not None:
            self._run.stdin.close()

    def __aiter__(self) -> _Script:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._run.stdout.receive()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def wait(self) -> tuple[int, bytes]:
        await self.close_stdin()
        returncode = await self._run.wait()
        # Its stderr is at its end now (none of its processes is left), but the exit status
        # may have come first: its reason must not be judged on half of what it said.
        with anyio.move_on_after(UNISOLATED_PIPE_GRACE):
            await self._stderr_read.wait()
        return returncode, bytes(self._stderr)
