"""A process sandbox's filesystem state: snapshots of it, sandboxes started from one, and
the reset that hands a sandbox to its next episode (all synchronous: run in a thread).

A sandbox's whole writable state is its ``fs/`` directory (``/tmp``, the home and the
workdir; everything else in its view is read-only), so a snapshot is a copy of ``fs/``
under ``<root>/.snapshots/<id>/``, and a sandbox starts from one by copying it back. Copies
are ``cp -a --reflink=auto``: on a filesystem with reflinks (btrfs, XFS) they share data
blocks and cost O(files); elsewhere (ext4, tmpfs) they cost O(data). As root, a sandbox's
files belong to its own host uid, so a copy changes owner to the new sandbox's uid.

A snapshot is taken with the sandbox's processes frozen (its cgroup's freezer), so that
the copy is one moment's state and nothing in the sandbox can change what is copied while
it is read. Without a freezer (cgroups need root) the copy runs as the same user as the
sandbox, so a race gains nothing; it is then refused while commands run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ._cgroups import SandboxCgroup
from ._layout import HostIds, Layout, rmtree

SNAPSHOTS = ".snapshots"
SNAPSHOT_ID = re.compile(r"s-[0-9a-f]{12}")
PARTIAL_AGE = 3600.0  # snapshots being written for longer than this were abandoned
FREEZE_DEADLINE = 10.0


class SnapshotMeta(msgspec.Struct, kw_only=True):
    """Persisted with each snapshot."""

    id: str
    image: str | None
    workdir: str
    source: str  # the sandbox it was taken from
    created_at: float


_decoder = msgspec.json.Decoder(SnapshotMeta)


def new_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


def directory(root: Path, snapshot_id: str) -> Path | None:
    """Where the snapshot ``snapshot_id`` lives under the backend's ``root`` (None for an
    id that cannot be one of ours)."""
    if not SNAPSHOT_ID.fullmatch(snapshot_id):
        return None
    return root / SNAPSHOTS / snapshot_id


def read_meta(path: Path) -> SnapshotMeta | None:
    try:
        return _decoder.decode((path / "meta.json").read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def take(layout: Layout, meta: SnapshotMeta, target: Path, cgroup: SandboxCgroup | None) -> None:
    """Copy the sandbox's state into the new snapshot directory ``target``, atomically (it
    appears complete or not at all)."""
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(mode=0o700, parents=True)
    try:
        with _frozen(cgroup):
            _copy(layout.root / "fs", partial / "fs")
        (partial / "meta.json").write_bytes(msgspec.json.encode(meta))
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def restore(snapshot: Path, layout: Layout) -> None:
    """Fill a just-prepared sandbox's (empty) writable areas from ``snapshot``."""
    fs = layout.root / "fs"
    _copy(snapshot / "fs", fs, into=True)
    if layout.host_ids is not None:
        _chown(fs, layout.host_ids)


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


def sweep(root: Path) -> None:
    """Remove snapshots whose writing was abandoned (their process crashed)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in (root / SNAPSHOTS).iterdir():
            if entry.name.endswith(".partial"):
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - entry.stat().st_mtime > PARTIAL_AGE:
                        rmtree(entry)


def _copy(source: Path, target: Path, *, into: bool = False) -> None:
    """``cp -a --reflink=auto``: ownership, modes, times, links, sparse files and hard
    links kept; ``into``: copy the content of ``source`` into the existing ``target``."""
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
