"""The process backend's sandboxes on disk (all synchronous: run in a thread).

One directory per sandbox under the backend's root, named by its id, with its
``meta.json``: what any process using this root needs to list, attach and remove it.
Beside them: ``.trash/`` (directories being deleted, see :mod:`._trash`), ``.etc/`` (the
/etc snapshots sandboxes see) and the snapshots (:mod:`._state`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from pathlib import Path

import msgspec

from .._models import SandboxInfo, SandboxStatus
from ..abc import SandboxSpec
from . import _layout, _overlay, _trash
from ._cgroups import Cgroups, SandboxCgroup
from ._layout import HostIds, Layout, rmtree
from ._state import SNAPSHOTS, Snapshots, layers_lock, mount_layers, restore, sweep
from ._uids import UidPool

__all__ = ("SandboxMeta", "Store", "etc_for", "prepare")

ETC_SWEEP_AGE = 3600.0  # unused /etc snapshots older than this are removed
SANDBOX_ID = re.compile(r"p-[0-9a-f]{12}")


class SandboxMeta(msgspec.Struct, kw_only=True):
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
    nproc: int | None = None  # gVisor: the pids limit, as the sandbox user's RLIMIT_NPROC


_meta_decoder = msgspec.json.Decoder(SandboxMeta)
_ETC_SNAPSHOTS: dict[tuple[Path, Path], Path] = {}  # (backend root, system root) -> snapshot


def new_id() -> str:
    return "p-" + uuid.uuid4().hex[:12]


def read_meta(root: Path, sandbox_id: str) -> SandboxMeta | None:
    """The meta of sandbox ``sandbox_id`` under ``root``; None if there is none (or not
    yet: it is written last, once the sandbox is complete)."""
    if not SANDBOX_ID.fullmatch(sandbox_id):
        return None
    try:
        return _meta_decoder.decode((root / sandbox_id / "meta.json").read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def prepare(root: Path) -> None:
    """Make ``root`` and its shared directories; finish the removals a crash interrupted;
    remove what no sandbox uses any more (old /etc snapshots, abandoned snapshots)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o711)
    root.chmod(0o711)
    for hidden, mode in ((_trash.TRASH, 0o700), (".etc", 0o711), (SNAPSHOTS, 0o700)):
        (root / hidden).mkdir(exist_ok=True, mode=mode)
    _trash.sweep(root)  # removals a crash interrupted
    _sweep_etc(root)
    sweep(root)


def closed_above(root: Path) -> Path | None:
    """The nearest directory above ``root`` that other users cannot pass (no execute bit
    for others, and no ACL that might grant one), or None. As root, sandboxes run as other
    users, who must pass every directory on the way to theirs."""
    for parent in root.resolve().parents:
        if parent.stat().st_mode & 0o001:
            continue
        try:
            if any(name.startswith("system.posix_acl") for name in os.listxattr(parent)):
                continue  # an ACL may let them through: the probe will tell
        except OSError:
            continue
        return parent
    return None


def etc_for(root: Path, image: Path | None) -> Path:
    """The /etc snapshot of the host (``None``) or of an image, made on first use in this
    process (and shared by its backends with the same root)."""
    key = (root, Path("/") if image is None else image)
    snapshot = _ETC_SNAPSHOTS.get(key)
    if snapshot is None or not snapshot.is_dir():
        snapshot = _ETC_SNAPSHOTS[key] = _layout.etc_snapshot(root / ".etc", key[1])
    return snapshot


def _sweep_etc(root: Path) -> None:
    """Remove /etc snapshots no sandbox uses any more (older ones only: another process
    sharing this root may have just made one)."""
    used = set()
    for name in os.listdir(root):
        meta = read_meta(root, name)
        if meta is not None:
            used.add(meta.etc)
    now = time.time()
    for snapshot in (root / ".etc").iterdir():
        with contextlib.suppress(FileNotFoundError):
            old = now - snapshot.stat().st_mtime > ETC_SWEEP_AGE
            if old and str(snapshot) not in used:
                rmtree(snapshot)


class Store:
    """The sandboxes under one root: made, found, listed and removed; and their snapshots
    (:attr:`snapshots`). Shared by a backend and its sandboxes.

    :param uids: the host uids to give sandboxes (as root), or None: they run as us.
    :param cgroups: where sandboxes' cgroups are made, or None (no cgroups here).
    """

    def __init__(
        self,
        root: Path,
        *,
        uids: UidPool | None,
        cgroups: Cgroups | None,
        snapshots: Snapshots,
    ) -> None:
        self.root = root
        self.uids = uids
        self.cgroups = cgroups
        self.snapshots = snapshots

    def read_meta(self, sandbox_id: str) -> SandboxMeta | None:
        return read_meta(self.root, sandbox_id)

    def layout(self, meta: SandboxMeta) -> Layout:
        ids = None if meta.host_uid is None else HostIds(meta.host_uid, meta.host_gid or 0)
        return Layout(
            root=self.root / meta.id,
            image=None if meta.image is None else Path(meta.image),
            workdir=meta.workdir,
            network=meta.network,
            etc=Path(meta.etc),
            host_ids=ids,
        )

    def cgroup(self, meta: SandboxMeta) -> SandboxCgroup | None:
        """The cgroup of an existing sandbox, if it has one."""
        return self.cgroups.attach(meta.id) if (self.cgroups and meta.cgroup) else None

    def info(self, sandbox_id: str) -> SandboxInfo | None:
        meta = self.read_meta(sandbox_id)
        return None if meta is None else _info(meta)

    def listing(self, labels: dict[str, str]) -> list[SandboxInfo]:
        infos = []
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        for name in sorted(names):
            meta = self.read_meta(name)
            if meta is None or any(meta.labels.get(k) != v for k, v in labels.items()):
                continue
            infos.append(_info(meta))
        return infos

    def create(self, meta: SandboxMeta, spec: SandboxSpec) -> SandboxCgroup | None:
        """Make the sandbox of ``meta`` (completing it: its ids, its /etc; its layout is then
        :meth:`layout`) and return its cgroup; its meta is written last, once it is
        complete. On an error the caller calls :meth:`remove`."""
        directory = self.root / meta.id
        ids = self.uids.claim(directory) if self.uids else None
        image = None if meta.image is None else Path(meta.image)
        meta.etc = str(etc_for(self.root, image))
        if ids is not None:
            meta.host_uid, meta.host_gid = ids.uid, ids.gid
        layout = self.layout(meta)
        quota = spec.resources.disk_mb if meta.quota else None
        _layout.prepare(layout, disk_mb=quota, layered=bool(meta.layers))
        cgroup = self.cgroups.create(meta.id, spec.resources) if self.cgroups else None
        if meta.layers:
            owner = self.snapshots.owner
            assert owner is not None
            # Until its meta.json names them, nothing may delete the layers it mounts.
            with layers_lock(self.root):
                self.snapshots.directory(meta.snapshot or "")  # not deleted meanwhile
                mount_layers(layout, meta.layers, owner)
                _write_meta(layout, meta)
            return cgroup
        if meta.snapshot is not None:
            restore(self.snapshots.directory(meta.snapshot), layout)
        _write_meta(layout, meta)
        return cgroup

    def remove(self, sandbox_id: str, cgroup: SandboxCgroup | None) -> None:
        """Remove a sandbox: every process of it killed (through its cgroup), its directory
        gone, its uid released, the layers only it used deleted. Idempotent."""
        directory = self.root / sandbox_id
        meta = self.read_meta(sandbox_id)
        # Moved first, atomically: list() and attach() stop seeing it.
        with _trash.moved(directory, self.root) as trash:
            if cgroup is None and self.cgroups is not None:
                cgroup = self.cgroups.attach(sandbox_id)
            if cgroup is not None:
                cgroup.remove()  # kills every process of the sandbox, whoever started it
            if trash is not None:
                # Never delete through a mount: a layer under it is other sandboxes' too.
                _overlay.unmount_under(trash)
                rmtree(trash)
        if meta is not None and meta.host_uid is not None and self.uids is not None:
            self.uids.release(HostIds(meta.host_uid, meta.host_gid or 0), directory)
        if meta is not None and meta.layers:
            self.gc_layers()

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot, then the layers nothing uses any more. Idempotent."""
        self.snapshots.delete(snapshot_id)
        self.gc_layers()

    def gc_layers(self) -> None:
        """Delete the layers no snapshot and no live sandbox uses."""
        if self.snapshots.owner is None:
            return
        live: set[str] = set()
        for name in os.listdir(self.root):
            meta = self.read_meta(name)
            if meta is not None:
                live.update(meta.layers)
        self.snapshots.gc(live)


def _write_meta(layout: Layout, meta: SandboxMeta) -> None:
    tmp = layout.root / "meta.json.tmp"
    tmp.write_bytes(msgspec.json.encode(meta))
    tmp.rename(layout.root / "meta.json")  # visible to list() only once complete


def _info(meta: SandboxMeta) -> SandboxInfo:
    expired = meta.expires_at is not None and meta.expires_at < time.time()
    return SandboxInfo(
        id=meta.id,
        status=SandboxStatus.DEAD if expired else SandboxStatus.RUNNING,
        labels=meta.labels,
        image=meta.image,
        created_at=meta.created_at,
        backend="process",
    )
