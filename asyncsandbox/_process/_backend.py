"""The embedded ``process`` backend: its options, what it finds on this machine when it
opens (the isolation mechanism, cgroups, how snapshots are kept) and the sandboxes' life
cycle. A sandbox's commands are its own (``_sandbox.py``), by the path chosen here when
it is made or attached; sandboxes on disk are the store's (``_store.py``), snapshots the
state's (``_state.py``)."""

from __future__ import annotations

import builtins
import os
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc
import anyio.to_thread
import msgspec

from .. import _validate as check
from .._errors import BackendUnavailable, InvalidArgument, SandboxNotFound
from .._log import get_logger
from .._models import SandboxInfo, SnapshotInfo
from ..abc import Backend, BackendCapabilities, SandboxHandle, SandboxSpec
from . import _state, _store
from ._cgroups import Cgroups, SandboxCgroup
from ._executor_path import ExecutorPath
from ._gvisor import GVisor, host_pids
from ._isolation import MODES, Mechanism, Mode, Resident
from ._launcher_path import LauncherPath
from ._layout import READ_ONLY_PREFIXES
from ._path import Box, Path as CommandPath
from ._sandbox import ProcessAttributes, ProcessSandbox
from ._select import select, select_resident
from ._store import SandboxMeta, Store
from ._uids import DEFAULT_RANGE, UidPool

__all__ = ("ProcessAttributes", "ProcessBackend", "default_root")

ISOLATION_ENV = "ASYNCSANDBOX_PROCESS_ISOLATION"
LIMITS_ENV = "ASYNCSANDBOX_PROCESS_LIMITS"
LIMITS = ("enforce", "best-effort")


def default_root() -> Path:
    env = os.environ.get("ASYNCSANDBOX_PROCESS_ROOT")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        # Must be traversable by the unprivileged sandbox user (so not under /root).
        return Path("/var/lib/asyncsandbox/process")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache, "asyncsandbox", "process")


_WARNED: set[str] = set()


def _warn_once(key: str, event: str, **fields: Any) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        get_logger().warning(event, **fields)


class ProcessBackend(Backend):
    """The embedded backend: sandboxes are directories, commands run in Linux namespaces.

    No daemon: every command is launched, by bubblewrap or by our own launcher, into fresh
    namespaces over the sandbox's filesystem view. Idle sandboxes cost only disk. Memory,
    pids and CPU limits and disk quotas need root (cgroups, a tmpfs per sandbox).

    :param root: where sandbox directories live (default ``/var/lib/asyncsandbox/process``
        as root, else ``~/.cache/asyncsandbox/process``; or ``$ASYNCSANDBOX_PROCESS_ROOT``).
    :param isolation: ``"auto"`` (bubblewrap if installed, else the native launcher, else
        refuse with what is missing), ``"bwrap"``, ``"native"``, ``"gvisor"`` (each sandbox
        a gVisor sandbox: a user-space kernel between its commands and the host's; needs
        root and ``runsc``, chosen only when asked for), or ``"none"`` to run on the host
        unisolated (unsafe; explicit only, with a warning). Default:
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
        gVisor runs commands only this way (``False`` is refused with it).
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
        if mode == "gvisor" and not fast_path:
            raise InvalidArgument(
                "isolation='gvisor' runs commands through each sandbox's resident executor "
                "(a gVisor sandbox per command would boot a kernel per command); "
                "fast_path=False is not on this mechanism"
            )
        self._fast_path = fast_path and mode != "none"
        self._resident: Resident | None = None  # the fast path's, once probed
        self._task_group: anyio.abc.TaskGroup | None = None
        self._store: Store | None = None  # once open
        self._caps: BackendCapabilities | None = None
        self._handles: dict[str, ProcessSandbox] = {}

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
        root = self.root
        _store.prepare(root)
        if self._uids is not None and (closed := _store.closed_above(root)) is not None:
            mode = closed.stat().st_mode & 0o7777
            raise BackendUnavailable(
                f"the process backend's sandboxes cannot reach its root {root}: "
                f"{closed} (mode {mode:04o}) lets no other user through, and as root the "
                f"sandboxes run as other users (host uids {self._uids.start} to "
                f"{self._uids.start + self._uids.count - 1}). To fix it: chmod o+x {closed}, "
                "or choose a root every user can reach (backend_options={'root': ...})"
            )
        probe_ids = self._uids.claim(root / ".probe") if self._uids else None
        layer_owner: int | None = None  # None: snapshots are copies (see _state)
        try:
            etc = _store.etc_for(root, None)
            mechanism = select(self._mode, self._seccomp, root, etc, probe_ids)
            self._mechanism = mechanism
            if self._fast_path:
                self._resident = select_resident(mechanism, self._seccomp, root, etc, probe_ids)
            if probe_ids is not None and self._uids is not None:
                # The uid snapshot layers belong to, where sandboxes mount them (root, a
                # kernel with idmapped overlay layers).
                owner = self._uids.start - 1
                layer_owner = owner if _state.layers_work(root, probe_ids, owner) else None
        finally:
            if self._uids and probe_ids:
                self._uids.release(probe_ids, root / ".probe")
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
        cgroups = Cgroups.detect() if mechanism.isolated else None
        gvisor = isinstance(mechanism, GVisor)
        self._store = Store(
            root,
            uids=self._uids,
            cgroups=cgroups,
            snapshots=_state.Snapshots(root, owner=layer_owner),
        )
        # (gVisor: the cgroup holds the whole gVisor sandbox, its kernel too; see _gvisor.)
        limits = set(cgroups.controllers) if cgroups else set()
        if self._uids is not None and mechanism.isolated:
            limits.add("disk_mb")
        self._caps = BackendCapabilities(
            isolation=mechanism.describe(root=self._uids is not None)
            + (
                f"; commands forked by a resident executor per sandbox (fast path, "
                f"{self._resident.name})"
                if self._resident is not None
                else ""
            )
            + (
                "; snapshots are overlay layers (O(changed))"
                if layer_owner is not None
                else "; snapshots are copies (O(data) without reflinks)"
            ),
            enforced_limits=frozenset(limits),
            # Without isolation nothing is enforced: that mode is explicit and warned of.
            best_effort_limits=self._best_effort or not mechanism.isolated,
            limits_note=self._limits_note(frozenset(limits)),
            network_modes=frozenset(
                {"none"} if gvisor else {"none", "host"} if mechanism.isolated else {"host"}
            ),
            reports_signal=False,
            snapshots=True,
            # Without isolation, a command's daemons leave its process group: a reset
            # could not be sure that none survives.
            reset=mechanism.isolated,
            interactive=True,
        )
        get_logger().debug(
            "process.backend.ready",
            root=str(root),
            isolation=mechanism.name,
            cgroups=cgroups.version if cgroups else None,
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

    @property
    def store(self) -> Store:
        """The sandboxes on disk (and their snapshots), once the backend is open."""
        if self._store is None:
            raise BackendUnavailable("the process backend is not open (use it through a Session)")
        return self._store

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
        store = self.store
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
            snapshot = await anyio.to_thread.run_sync(store.snapshots.meta, spec.snapshot)
            if spec.image is not None and spec.image != snapshot.image:
                raise InvalidArgument(
                    f"snapshot {snapshot.id} was taken of image {snapshot.image!r}, not "
                    f"{spec.image!r}"
                )
            image = None if snapshot.image is None else Path(snapshot.image)
            if snapshot.layers and store.snapshots.owner is None:
                raise InvalidArgument(
                    f"snapshot {snapshot.id} is made of layers, which only a backend running "
                    "as root (on a kernel with idmapped mounts) can mount"
                )
        sandbox_id = _store.new_id()
        now = time.time()
        meta = SandboxMeta(
            id=sandbox_id,
            image=None if image is None else str(image),
            workdir=spec.workdir,
            network=spec.network,
            labels=dict(spec.labels),
            created_at=now,
            expires_at=None if spec.max_lifetime is None else now + spec.max_lifetime,
            cgroup=store.cgroups is not None,
            quota=spec.resources.disk_mb is not None
            and "disk_mb" in self.capabilities.enforced_limits,
            snapshot=spec.snapshot,
            layers=snapshot.layers if spec.snapshot is not None else [],
        )
        if isinstance(self.mechanism, GVisor) and spec.resources.pids is not None:
            # Enforced by gVisor's kernel; the cgroup bounds gVisor as a whole (see _gvisor).
            meta.nproc = pids = spec.resources.pids
            spec = msgspec.structs.replace(
                spec, resources=msgspec.structs.replace(spec.resources, pids=host_pids(pids))
            )
        try:
            cgroup = await anyio.to_thread.run_sync(store.create, meta, spec)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a cancelled create leaves nothing behind
                await anyio.to_thread.run_sync(store.remove, sandbox_id, None)
            raise
        return self._sandbox(meta, cgroup)

    def _sandbox(self, meta: SandboxMeta, cgroup: SandboxCgroup | None) -> ProcessSandbox:
        """The handle of sandbox ``meta``, with its command path, chosen here once: the
        resident executor where the native launcher runs, else a launcher per command."""
        box = Box(
            self.store.layout(meta), meta, cgroup, mechanism=self.mechanism, timeouts=self.timeouts
        )
        path: CommandPath
        if self._resident is not None and self._task_group is not None:
            path = ExecutorPath(
                box, resident=self._resident, task_group=self._task_group, idle=self._executor_idle
            )
        else:
            path = LauncherPath(box)
        handle = ProcessSandbox(box, path, self.store, forget=self._forget)
        self._handles[meta.id] = handle
        return handle

    def _forget(self, sandbox_id: str) -> None:
        self._handles.pop(sandbox_id, None)

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        store = self.store
        meta = await anyio.to_thread.run_sync(store.read_meta, sandbox_id)
        if meta is None:
            raise SandboxNotFound(sandbox_id)
        handle = self._handles.get(meta.id)
        return handle if handle is not None else self._sandbox(meta, store.cgroup(meta))

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        return await anyio.to_thread.run_sync(self.store.listing, dict(labels))

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        metas = await anyio.to_thread.run_sync(self.store.snapshots.listing)
        return [SnapshotInfo(id=m.id, labels=m.labels, created_at=m.created_at) for m in metas]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await anyio.to_thread.run_sync(self.store.delete_snapshot, snapshot_id)


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
