"""Kernel plumbing for copy-on-write sandboxes (root only): idmapped bind mounts of
snapshot layers, the overlay that stacks them under a sandbox's own writable layer, and
unmounting whatever is mounted under a sandbox directory.

Snapshot layers are stored owned by one host uid (the layer owner), while each live
sandbox is its own host uid. An idmapped mount (Linux >= 5.12; overlayfs accepts idmapped
layers since 5.19) shows a layer to the overlay as owned by the sandbox's uid, so the
sandbox can change the files it inherited (copy-up writes them to its own layer as its own
uid) and the layer itself is never written.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and arm64 alike
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MOUNT_ATTR_IDMAP = 0x100000
CLONE_NEWUSER = 0x10000000
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4
# Upper layers must hold whole files, so that a snapshot's copy of one is complete
# (metacopy would leave data in the lower layers), and renames of lower directories must
# not leave redirects to them.
OVERLAY_OPTIONS = "redirect_dir=off,metacopy=off,index=off"


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _user_namespace(inside: int, outside: int) -> int:
    """A descriptor of a user namespace mapping uid and gid ``inside`` to ``outside``."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only unshares and waits
        try:
            # Only its own two ends: other threads fork helpers too, and a helper holding
            # another's write end would keep that one waiting (and it this one) forever.
            low, high = sorted((ready_w, done_r))
            os.closerange(0, low)
            os.closerange(low + 1, high)
            os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
            ok = _libc.unshare(CLONE_NEWUSER) == 0
            os.write(ready_w, b"1" if ok else b"0")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("could not create a user namespace for an idmapped mount")
        for kind in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{kind}", "w") as f:
                f.write(f"{inside} {outside} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)


def idmapped_bind(source: Path, target: Path, *, owner: int, uid: int) -> None:
    """Bind ``source`` read-only at ``target``, its files of ``owner`` shown as ``uid``."""
    userns = _user_namespace(owner, uid)
    try:
        fd = _check(
            _libc.syscall(
                SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
            ),
            f"open_tree {source}",
        )
        try:
            attr = _MountAttr(
                MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                0,
                0,
                userns,
            )
            _check(
                _libc.syscall(
                    SYS_MOUNT_SETATTR,
                    fd,
                    b"",
                    AT_EMPTY_PATH,
                    ctypes.byref(attr),
                    ctypes.sizeof(attr),
                ),
                f"idmap {source}",
            )
            _check(
                _libc.syscall(
                    SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH
                ),
                f"move_mount to {target}",
            )
        finally:
            os.close(fd)
    finally:
        os.close(userns)


def mount_overlay(lower: Sequence[Path], upper: Path, work: Path, target: Path) -> None:
    """Stack ``lower`` (top first) under ``upper`` at ``target``."""
    options = (
        f"lowerdir={':'.join(str(p) for p in lower)},upperdir={upper},workdir={work},"
        + OVERLAY_OPTIONS
    )
    if len(options) >= 4096:
        raise OSError(f"overlay options too long ({len(options)} bytes): flatten the layers")
    _check(
        _libc.mount(
            b"overlay",
            os.fsencode(target),
            b"overlay",
            ctypes.c_ulong(MS_NOSUID | MS_NODEV),
            options.encode(),
        ),
        f"mount an overlay on {target}",
    )


def unmount(path: Path) -> None:
    _check(_libc.umount2(os.fsencode(path), MNT_DETACH), f"unmount {path}")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (deepest first), from this process's mount table."""
    prefix = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_under(path: Path) -> None:
    """Detach everything mounted at or below ``path``; raise if anything stays (then its
    directory must not be deleted: it may be a layer other sandboxes use)."""
    for point in mounts_under(path):
        with contextlib.suppress(OSError):
            unmount(point)
    left = mounts_under(path)
    if left:
        raise OSError(f"still mounted under {path}: {', '.join(map(str, left))}")


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 0 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
