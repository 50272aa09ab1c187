"""A process sandbox's filesystem state: snapshots of it, sandboxes started from one, and
the reset that hands a sandbox to its next episode (all synchronous: run in a thread).

A sandbox's whole writable state is its ``fs/`` directory (``/tmp``, the home and the
workdir; everything else in its view is read-only). Two ways to keep it:

* **Layers** (as root, where the kernel has idmapped mounts and overlayfs takes them): a
  snapshot adds one read-only layer under ``<root>/.layers/``: a copy of what the sandbox
  changed (its own overlay layer; or its whole ``fs/`` if it was not started from a
  snapshot). A sandbox started from a snapshot mounts the snapshot's layers (idmapped to
  its own uid, see :mod:`._overlay`) under an empty layer of its own at ``fs/``: starting,
  snapshotting and resetting cost O(what changed), never O(the prepared state). Chains
  are flattened past :data:`MAX_LAYERS`. Layers no snapshot or live sandbox refers to are
  deleted (under a lock shared with every process using this root).
* **Copies** (without root): a snapshot is a copy of ``fs/`` under
  ``<root>/.snapshots/<id>/fs``, and a sandbox starts from it by copying it back. Copies
  are ``cp -a --reflink=auto``: O(files) on filesystems with reflinks (btrfs, XFS), O(data)
  elsewhere.

A snapshot is taken with the sandbox's processes frozen (its cgroup's freezer), so that
the copy is one moment's state and nothing in the sandbox can change what is copied while
it is read. Without a freezer (cgroups need root) the copy runs as the same user as the
sandbox, so a race gains nothing; it is then refused while commands run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec

from .._errors import InvalidArgument
from .._log import get_logger
from . import _layout, _overlay, _trash
from ._cgroups import SandboxCgroup
from ._layout import HostIds, Layout, rmtree

SNAPSHOTS = ".snapshots"
LAYERS = ".layers"
SNAPSHOT_ID = re.compile(r"s-[0-9a-f]{12}")
PARTIAL_AGE = 3600.0  # snapshots being written for longer than this were abandoned
FREEZE_DEADLINE = 10.0
MAX_LAYERS = 16  # a snapshot of a deeper chain is one layer again (the mount options' size)


class SnapshotMeta(msgspec.Struct, kw_only=True):
    """Persisted with each snapshot."""

    id: str
    image: str | None
    workdir: str
    source: str  # the sandbox it was taken from
    created_at: float
    layers: list[str] = []  # its layers, top first; none: a copy, in the snapshot's fs/
    labels: dict[str, str] = {}  # its owner's, when it goes with its session


_decoder = msgspec.json.Decoder(SnapshotMeta)


def new_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


def directory(root: Path, snapshot_id: str) -> Path | None:
    """Where the snapshot ``snapshot_id`` lives under the backend's ``root`` (None for an
    id that cannot be one of ours)."""
    if not SNAPSHOT_ID.fullmatch(snapshot_id):
        return None
    return root / SNAPSHOTS / snapshot_id


def listed(root: Path) -> list[SnapshotMeta]:
    """The snapshots under the backend's ``root`` (those whose meta is complete)."""
    try:
        entries = list((root / SNAPSHOTS).iterdir())
    except FileNotFoundError:
        return []
    found = (read_meta(entry) for entry in entries if SNAPSHOT_ID.fullmatch(entry.name))
    return [meta for meta in found if meta is not None]


def read_meta(path: Path) -> SnapshotMeta | None:
    try:
        return _decoder.decode((path / "meta.json").read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


@contextlib.contextmanager
def layers_lock(root: Path, *, exclusive: bool = False) -> Iterator[None]:
    """Held shared while a layer is made or a sandbox mounts layers, exclusive while
    unused layers are deleted (by any process using ``root``)."""
    (root / LAYERS).mkdir(mode=0o700, exist_ok=True)
    fd = os.open(root / LAYERS / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


# -- snapshots ---------------------------------------------------------------------------


class Snapshots:
    """The snapshots under a backend's ``root``: taken, found, listed and deleted.

    :param owner: the uid layers belong to, where sandboxes mount them (see
        :func:`layers_work`); None: snapshots are copies.
    """

    def __init__(self, root: Path, *, owner: int | None) -> None:
        self.root = root
        self.owner = owner

    def directory(self, snapshot_id: str) -> Path:
        """Where snapshot ``snapshot_id`` is; raise :class:`InvalidArgument` if it is not."""
        path = directory(self.root, snapshot_id)
        if path is None or not path.is_dir():
            raise InvalidArgument(
                f"no snapshot {snapshot_id!r} in the process backend at {self.root} (it was "
                "deleted, or taken by another backend)"
            )
        return path

    def meta(self, snapshot_id: str) -> SnapshotMeta:
        meta = read_meta(self.directory(snapshot_id))
        if meta is None:
            raise InvalidArgument(f"snapshot {snapshot_id!r} is unreadable")
        return meta

    def listing(self) -> list[SnapshotMeta]:
        return listed(self.root)

    def take(
        self, layout: Layout, meta: SnapshotMeta, cgroup: SandboxCgroup | None, layers: list[str]
    ) -> None:
        """Snapshot the sandbox of ``layout`` (started from ``layers``) as ``meta``: see
        :func:`take`."""
        target = self.root / SNAPSHOTS / meta.id
        take(layout, meta, target, cgroup, layers=layers, owner=self.owner)

    def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot (not its layers: see :meth:`gc`). Idempotent."""
        path = directory(self.root, snapshot_id)
        if path is None:
            raise InvalidArgument(f"{snapshot_id!r} is not a process backend snapshot id")
        with _trash.moved(path, self.root) as trash:  # atomic: no sandbox starts from half of it
            if trash is not None:
                rmtree(trash)

    def gc(self, live: set[str]) -> None:
        """Delete the layers of no snapshot and not in ``live`` (those live sandboxes mount)."""
        if self.owner is not None:
            gc_layers(self.root, live)


# layers_work's answers in this process, by the filesystem (st_dev) and the layer owner.
_LAYERS_WORK: dict[tuple[int, int], bool] = {}


def layers_work(root: Path, ids: HostIds, owner: int) -> bool:
    """Whether this kernel mounts idmapped layers (owned by ``owner``) under an overlay, for
    a sandbox of host ``ids``: tried under ``root``'s trash, once per process and filesystem
    (the answer is the kernel's and the filesystem's, not the root's: a backend per root,
    as a test suite makes, would pay a user namespace, two mounts and a fork each)."""
    key = (os.stat(root).st_dev, owner)
    known = _LAYERS_WORK.get(key)
    if known is None:
        known = _LAYERS_WORK[key] = _try_layers(root, ids, owner)
    return known


def _try_layers(root: Path, ids: HostIds, owner: int) -> bool:
    with _trash.scratch(root, "probe") as scratch:
        layer = scratch / LAYERS / "layer"
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
            mount_layers(layout, ["layer"], owner)
            return (layout.root / "fs" / "work").stat().st_uid == ids.uid
        except OSError as exc:
            get_logger().debug("process.snapshots.copies", reason=str(exc))
            return False


def take(
    layout: Layout,
    meta: SnapshotMeta,
    target: Path,
    cgroup: SandboxCgroup | None,
    *,
    layers: list[str] | None,
    owner: int | None,
) -> None:
    """Snapshot the sandbox into the new snapshot directory ``target``, atomically (it
    appears complete or not at all). ``owner``: the layer owner's uid (layers mode), with
    ``layers`` those the sandbox was started from; ``None``: copy mode."""
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(mode=0o700, parents=True)

    def complete() -> None:
        (partial / "meta.json").write_bytes(msgspec.json.encode(meta))
        partial.rename(target)

    try:
        if owner is None:
            with _frozen(cgroup):
                _copy(layout.root / "fs", partial / "fs")
            complete()
        else:
            # The layer and the snapshot naming it appear under one hold of the lock: a
            # layer gc in between would delete the layer no snapshot names yet.
            with layers_lock(target.parent.parent):
                meta.layers = _add_layer(layout, meta.id, cgroup, layers or [], owner)
                complete()
    except BaseException:
        rmtree(partial)
        raise


def _add_layer(
    layout: Layout, layer_id: str, cgroup: SandboxCgroup | None, layers: list[str], owner: int
) -> list[str]:
    """A new layer of the sandbox's changes; the snapshot's layers, top first."""
    store = layout.root.parent / LAYERS
    partial = store / f"{layer_id}.partial"
    flatten = len(layers) + 1 > MAX_LAYERS
    # The changes alone (the sandbox's own layer) on top of what it was started from, or
    # everything it sees (a sandbox of no snapshot, or a chain to flatten).
    source = layout.root / "rw" / "upper" if layers and not flatten else layout.root / "fs"
    try:
        with _frozen(cgroup):
            _copy(source, partial)
        _chown(partial, HostIds(owner, owner))
        partial.chmod(0o755)
        partial.rename(store / layer_id)
    except BaseException:
        rmtree(partial)
        raise
    return [layer_id] if flatten or not layers else [layer_id, *layers]


def gc_layers(root: Path, referenced: set[str]) -> None:
    """Delete the layers in none of ``referenced`` (those of live sandboxes) and of no
    snapshot; and layers being written for longer than :data:`PARTIAL_AGE`."""
    store = root / LAYERS
    if not store.is_dir():
        return
    with layers_lock(root, exclusive=True):
        used = set(referenced)
        with contextlib.suppress(FileNotFoundError):
            for snapshot in (root / SNAPSHOTS).iterdir():
                meta = read_meta(snapshot)
                if meta is not None:
                    used.update(meta.layers)
        for layer in store.iterdir():
            name = layer.name
            if name == ".lock" or name in used:
                continue
            with contextlib.suppress(FileNotFoundError):
                if name.endswith(".partial") and time.time() - layer.stat().st_mtime < PARTIAL_AGE:
                    continue
                rmtree(layer)


# -- sandboxes -----------------------------------------------------------------------------


def restore(snapshot: Path, layout: Layout) -> None:
    """Copy mode: fill a just-prepared sandbox's (empty) writable areas from ``snapshot``."""
    fs = layout.root / "fs"
    _copy(snapshot / "fs", fs, into=True)
    if layout.host_ids is not None:
        _chown(fs, layout.host_ids)


def mount_layers(layout: Layout, layers: list[str], owner: int) -> None:
    """Layers mode: mount ``layers`` (idmapped to the sandbox's uid) under the sandbox's
    own empty layer at ``fs/``. The caller holds :func:`layers_lock`."""
    assert layout.host_ids is not None
    store, lower = layout.root.parent / LAYERS, []
    (layout.root / "lower").mkdir(mode=0o700)  # the layers are another sandbox's files
    for i, layer in enumerate(layers):
        point = layout.root / "lower" / str(i)
        point.mkdir()
        _overlay.idmapped_bind(store / layer, point, owner=owner, uid=layout.host_ids.uid)
        lower.append(point)
    _mount_own_layer(layout, lower)


def reset_layers(layout: Layout, layers: list[str]) -> None:
    """Layers mode: drop the sandbox's own layer (its processes are dead by now)."""
    fs = layout.root / "fs"
    if os.path.ismount(fs):
        _overlay.unmount(fs)
    rw = layout.root / "rw"
    for name in ("upper", "work"):
        rmtree(rw / name)
    _mount_own_layer(layout, [layout.root / "lower" / str(i) for i in range(len(layers))])


def _mount_own_layer(layout: Layout, lower: list[Path]) -> None:
    assert layout.host_ids is not None
    rw = layout.root / "rw"
    upper, work = rw / "upper", rw / "work"
    upper.mkdir(mode=0o700)
    work.mkdir(mode=0o700)
    os.chown(upper, layout.host_ids.uid, layout.host_ids.gid)
    _overlay.mount_overlay(lower, upper, work, layout.root / "fs")


def wipe(layout: Layout) -> None:
    """Empty the sandbox's writable areas (its processes are dead by now). ``fs`` itself
    stays: it may be the mount point of the sandbox's disk quota."""
    fs = layout.root / "fs"
    for entry in os.listdir(fs):
        path = fs / entry
        if path.is_dir() and not path.is_symlink():
            rmtree(path)
        else:
            path.unlink()


def empty(layout: Layout) -> None:
    """Empty the sandbox's writable areas in place, for a sandbox whose executor stays
    (its processes are dead by now): the executor's view binds the three directories, so
    they stay, their content goes, and they are as :func:`_layout.populate` makes them
    (mode, owner, no extended attributes or ACL, new times); anything else in ``fs`` goes."""
    fs = layout.root / "fs"
    areas = {layout.tmp: 0o1777, layout.home: 0o755, layout.work: 0o755}
    for entry in os.listdir(fs):
        path = fs / entry
        if path in areas and path.is_dir() and not path.is_symlink():
            # Opened first: the episode may have left it unwritable (chmod 500), which
            # stops no root owner, but any other.
            os.chmod(path, stat.S_IRWXU)
            for child in os.listdir(path):
                inside = path / child
                if inside.is_dir() and not inside.is_symlink():
                    rmtree(inside)
                else:
                    inside.unlink()
        elif path.is_dir() and not path.is_symlink():
            rmtree(path)
        else:
            path.unlink()
    for path, mode in areas.items():
        for name in os.listxattr(path, follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.removexattr(path, name, follow_symlinks=False)
        ids = layout.host_ids
        if ids is not None:
            os.chown(path, ids.uid, ids.gid)
        os.chmod(path, mode)
        os.utime(path)


def sweep(root: Path) -> None:
    """Remove snapshots whose writing was abandoned (their process crashed)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in (root / SNAPSHOTS).iterdir():
            if entry.name.endswith(".partial"):
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - entry.stat().st_mtime > PARTIAL_AGE:
                        rmtree(entry)


# -- helpers -------------------------------------------------------------------------------


def _copy(source: Path, target: Path, *, into: bool = False) -> None:
    """``cp -a --reflink=auto``: ownership, modes, times, links, extended attributes (an
    overlay's whiteouts and opaque directories) kept; ``into``: copy the content of
    ``source`` into the existing ``target``."""
    args = ["cp", "-a", "--reflink=auto", "--", f"{source}/." if into else str(source)]
    result = subprocess.run(
        [*args, str(target)], capture_output=True, text=True, check=False, env=_ENV
    )
    if result.returncode != 0:
        raise OSError(f"copying {source} failed: {result.stderr.strip()[-2000:]}")


def _chown(path: Path, ids: HostIds) -> None:
    # -h: symlinks themselves, never what they point to (a sandbox chose those targets).
    result = subprocess.run(
        ["chown", "-R", "-h", f"{ids.uid}:{ids.gid}", "--", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env=_ENV,
    )
    if result.returncode != 0:
        raise OSError(f"changing the owner of {path} failed: {result.stderr.strip()[-2000:]}")


_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


@contextlib.contextmanager
def _frozen(cgroup: SandboxCgroup | None) -> Iterator[None]:
    """The sandbox's processes frozen (with a cgroup v2 freezer; see the module docstring
    for the others)."""
    if cgroup is None or not cgroup.can_freeze:
        yield
        return
    try:
        if not cgroup.freeze(True, FREEZE_DEADLINE):
            raise OSError(f"the sandbox's processes did not freeze in {FREEZE_DEADLINE:g}s")
        yield
    finally:
        cgroup.freeze(False, FREEZE_DEADLINE)
