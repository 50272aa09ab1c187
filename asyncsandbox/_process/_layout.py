"""Where a process sandbox lives on the host, and how its filesystem looks from inside.

A sandbox is a directory: its writable areas (``/tmp``, the home, the workdir) under
``fs/``, a mount point for the view, its metadata. Inside, the sandbox sees the host's
system directories (or a root filesystem image) read-only, plus its writable areas, plus
a private ``/etc``: a snapshot of the system's, taken once per backend (see
:func:`etc_snapshot`), with the sandbox's own user database. Nothing in the view is a
host file that the host might replace while sandboxes run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
HOME = "/home/sandbox"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Programs the system lacks under their usual name, provided as symlinks (python -> python3,
# as an image's python-is-python3 would): the directory is appended to PATH.
SHIM_DIR = "/.asyncsandbox/bin"

# Host directories forming the read-only system view (when no image is given).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
# Top-level entries of an image that the sandbox provides itself.
PROVIDED = frozenset({"proc", "dev", "sys", "tmp", "home", "run"})
READ_ONLY_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/etc", "/opt", "/proc", "/dev", "/sys")


@dataclass(frozen=True)
class HostIds:
    """The host uid and gid a sandbox's user is (one pair per live sandbox, when root)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class Layout:
    """Where a sandbox lives on the host, and how it looks from inside."""

    root: Path  # the sandbox directory on the host
    image: Path | None  # root filesystem, or None for the host's system view
    workdir: str
    network: str
    etc: Path  # the /etc snapshot the sandbox sees
    host_ids: HostIds | None  # None: the sandbox user is the backend's own user

    @property
    def source(self) -> Path:
        return Path("/") if self.image is None else self.image

    @property
    def tmp(self) -> Path:
        return self.root / "fs" / "tmp"

    @property
    def home(self) -> Path:
        return self.root / "fs" / "home"

    @property
    def work(self) -> Path:
        return self.root / "fs" / "work"

    def writable(self) -> list[tuple[Path, str]]:
        """(host directory, sandbox path) pairs, parents before children."""
        pairs = [(self.tmp, "/tmp"), (self.home, HOME)]
        if not any(self.workdir == p or self.workdir.startswith(p + "/") for _, p in pairs):
            pairs.append((self.work, self.workdir))
        return pairs

    @functools.cached_property
    def view(self) -> list[tuple[str, str, str]]:
        """The read-only part of the filesystem view: (kind, name, symlink target) for each
        top-level entry, kind ``d`` (bind-mounted directory or file) or ``l`` (symlink).
        Mounting entries one by one over an empty root (rather than the whole image at /)
        leaves room to create the writable mount points."""
        return _view(self.source)

    @functools.cached_property
    def shims(self) -> list[tuple[str, str]]:
        """(path inside, symlink target) of the programs provided under another name."""
        return _shims(self.source)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """A command's environment: ours underneath, the caller's on top."""
        path = BASE_PATH + (":" + SHIM_DIR if self.shims else "")
        return {
            "PATH": path,
            "HOME": HOME,
            "USER": SANDBOX_USER,
            "LOGNAME": SANDBOX_USER,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            **env,
        }

    def host_path(self, path: str) -> str:
        """The host path that ``path`` (inside the sandbox) maps to, in unisolated mode."""
        for host, inside in reversed(self.writable()):
            if path == inside or path.startswith(inside + "/"):
                return str(host) + path[len(inside) :]
        return path


@functools.cache
def _view(source: Path) -> list[tuple[str, str, str]]:
    names = list(SYSTEM_DIRS) if source == Path("/") else sorted(os.listdir(source))
    entries = []
    for name in names:
        if source != Path("/") and name in PROVIDED:
            continue
        host = source / name
        if host.is_symlink():
            entries.append(("l", name, os.readlink(host)))
        elif host.exists():
            entries.append(("d", name, ""))
    return entries


@functools.cache
def _shims(source: Path) -> list[tuple[str, str]]:
    dirs = BASE_PATH.split(":")

    def find(name: str) -> str | None:
        for directory in dirs:
            candidate = directory + "/" + name
            if os.path.exists(str(source) + candidate) or (
                source != Path("/") and os.path.lexists(str(source) + candidate)
            ):
                return candidate
        return None

    python3 = find("python3")
    if find("python") is None and python3 is not None:
        return [(SHIM_DIR + "/python", python3)]
    return []


def prepare(layout: Layout, *, disk_mb: int | None = None, layered: bool = False) -> None:
    """Create a sandbox's directories on the host (synchronous). With ``disk_mb`` (root
    only), its writable areas share a tmpfs of that size: the disk quota. ``layered``: its
    writable areas will be an overlay (see ``_state``): ``fs`` is its mount point, and the
    sandbox's own layer (with the quota) goes in ``rw``."""
    layout.root.mkdir(mode=0o711)
    (layout.root / "view").mkdir()  # mount point for the native launcher
    fs = layout.root / "fs"
    fs.mkdir(mode=0o700)  # nobody else on the host looks inside a sandbox
    writable = fs
    if layered:
        writable = layout.root / "rw"
        writable.mkdir(mode=0o700)
    if disk_mb is not None:
        _mount(b"tmpfs", writable, b"tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0700")
    if not layered:
        populate(layout)


def populate(layout: Layout) -> None:
    """Create the (empty) writable areas in the sandbox's ``fs`` directory."""
    fs = layout.root / "fs"
    for directory in (layout.tmp, layout.home, layout.work):
        directory.mkdir(mode=0o755)
    layout.tmp.chmod(0o1777)
    if layout.host_ids is not None:
        for directory in (fs, layout.tmp, layout.home, layout.work):
            os.chown(directory, layout.host_ids.uid, layout.host_ids.gid)


MS_NOSUID, MS_NODEV = 2, 4


def _mount(source: bytes, target: Path, fstype: bytes, flags: int, data: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source, os.fsencode(target), fstype, ctypes.c_ulong(flags), data.encode()):
        err = ctypes.get_errno()
        raise OSError(err, f"mount a {data} tmpfs on {target}: {os.strerror(err)}")


def rmtree(path: Path) -> None:
    """Remove a tree a sandbox may have made hard to remove."""

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


# -- /etc --------------------------------------------------------------------------------

PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}::{HOME}:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
OWN = {"passwd": PASSWD, "group": GROUP, "hostname": "sandbox\n", "hosts": HOSTS}
# Files only root may read on the host stay out (/etc/shadow, private keys): a sandbox
# user could not read them through a view of the host's /etc either.
WORLD_READABLE = stat.S_IROTH


def etc_snapshot(parent: Path, source: Path) -> Path:
    """A private copy of ``source``/etc under ``parent``, with the sandbox's own user
    database, host name and hosts file; return its path.

    Taken once per backend (not per command), so that a host replacing ``/etc/passwd`` or
    ``/etc/resolv.conf`` by rename (``useradd``, package installs, configuration
    management) never races with a sandbox being set up. Only what any user may read is
    taken, as hard links where the filesystem allows (no space, no time), else as copies;
    symlinks stay symlinks, but those leading out of the sandbox's view (such as
    ``resolv.conf`` into ``/run``) are replaced by a copy of their target.
    """
    tag = hashlib.sha256(str(source).encode()).hexdigest()[:8]
    target = parent / f"{tag}-{uuid.uuid4().hex[:8]}"
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, mode=0o755)
    try:
        _copy_tree(source / "etc", partial, source)
        for name, content in OWN.items():
            path = partial / name
            if path.is_symlink() or path.exists():
                path.unlink()
            path.write_text(content)
            path.chmod(0o644)
        partial.chmod(0o755)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def _link_symlink(path: str, out: str, target: str) -> None:
    """``out``: the symlink ``path`` (to ``target``), as a hard link where the filesystem
    and the owner allow (no inode to make: hosts have hundreds in /etc, ``ssl/certs`` and
    ``alternatives``), else a new symlink to ``target``."""
    try:
        os.link(path, out, follow_symlinks=False)  # the symlink itself, not its target
    except OSError:
        os.symlink(target, out)
        return
    if os.readlink(out) != target:  # replaced on the host since it was read
        os.unlink(out)
        os.symlink(target, out)


def _copy_tree(src: Path, dst: Path, source: Path) -> None:
    visible = {"proc", "etc", *(name for _, name, _ in _view(source))}
    _copy_dir(str(src), str(dst), source, visible)


def _copy_dir(src: str, dst: str, source: Path, visible: set[str]) -> None:
    # (Paths as strings: a host's /etc has over a thousand entries, and pathlib's objects
    # cost more than the system calls.)
    with os.scandir(src) as entries:
        listing = list(entries)
    for entry in listing:
        path, out = entry.path, f"{dst}/{entry.name}"
        with contextlib.suppress(FileNotFoundError):  # removed while we copy
            if entry.is_symlink():
                target = os.readlink(path)
                top = target.lstrip("/").split("/", 1)[0]
                if not target.startswith("/") or top in visible:
                    _link_symlink(path, out, target)
                    continue
                resolved = source / target.lstrip("/") if source != Path("/") else Path(target)
                if resolved.is_file() and os.stat(resolved).st_mode & WORLD_READABLE:
                    shutil.copyfile(resolved, out)
                    os.chmod(out, 0o644)
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if not mode & WORLD_READABLE:
                continue
            if entry.is_dir(follow_symlinks=False):
                if mode & stat.S_IXOTH:
                    os.mkdir(out)
                    _copy_dir(path, out, source, visible)
                    os.chmod(out, stat.S_IMODE(mode))
            elif entry.is_file(follow_symlinks=False):
                if not mode & (stat.S_ISUID | stat.S_ISGID):
                    try:
                        os.link(path, out)  # free on the same filesystem; the host's
                        continue  # replacing the file by rename leaves this one as it was
                    except OSError:
                        pass
                with contextlib.suppress(PermissionError):
                    shutil.copyfile(path, out)
                    os.chmod(out, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))
