"""The process backend's seccomp policy: one filter, compiled by libseccomp, for every
isolation mechanism (bubblewrap loads it with ``--seccomp``, the native launcher with
``prctl``).

Everything is allowed but the calls below, which fail with ``EPERM`` (``clone3`` with
``ENOSYS``, so that the C library falls back to ``clone``, whose flags a filter can see).
The list follows Docker's default profile where the two overlap, and adds what a sandbox
run as an unprivileged user in its own user namespace could still reach.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import tempfile

# Inspect other processes: a filter cannot tell whose tree a target is in, so none at all.
# (Without this, a command could stop or rewrite its namespace's init, e.g. bubblewrap's,
# which runs as the same user.)
PTRACE = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp")
# Change what the sandbox sees of the system: mounts, roots, namespaces.
MOUNT = (
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
)
KERNEL = (
    # the kernel keyring (not namespaced)
    "keyctl",
    "add_key",
    "request_key",
    # modules, kexec, reboot, swap, accounting, quotas
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    # clocks
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "adjtimex",
    "stime",
    # large kernel attack surface, rarely needed by programs
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "lookup_dcookie",
    "iopl",
    "ioperm",
    "syslog",
    "vhangup",
    "nfsservctl",
    "uselib",
    "_sysctl",
)
DENIED = PTRACE + MOUNT + KERNEL
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412  # push bytes into a terminal's input queue
TIOCLINUX = 0x541C


class SeccompUnavailable(Exception):
    """The filter cannot be built here; the message names what is missing."""


@functools.cache
def program() -> bytes:
    """The compiled BPF program (``struct sock_filter`` array) for this machine."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as exc:
        raise SeccompUnavailable(
            f"libseccomp cannot be loaded ({exc}); install it (Debian/Ubuntu: apt-get install "
            "libseccomp2, Fedora: dnf install libseccomp)"
        ) from exc
    eperm = seccomp.ERRNO(errno.EPERM)
    f = seccomp.SyscallFilter(seccomp.ALLOW)
    if platform.machine() == "x86_64":
        # Also the 32-bit and x32 entry points: a deny-list filter that leaves them out is
        # bypassed by making the same call through int 0x80.
        for arch in (seccomp.Arch.X86, seccomp.Arch.X32):
            f.add_arch(arch)
    for name in DENIED:
        _deny(f, eperm, name)
    _deny(f, seccomp.ERRNO(errno.ENOSYS), "clone3")
    nested = seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    _deny(f, eperm, "unshare", nested)
    # clone's flags are its first argument on x86 and arm; the filter checks them there.
    _deny(f, eperm, "clone", nested)
    for request in (TIOCSTI, TIOCLINUX):
        _deny(f, eperm, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        bpf = out.read()
    if not bpf or len(bpf) % 8:
        raise SeccompUnavailable(f"libseccomp produced an invalid program ({len(bpf)} bytes)")
    return bpf


def _deny(f: object, action: int, name: str, *args: object) -> None:
    try:
        f.add_rule(action, name, *args)  # type: ignore[attr-defined]
    except OSError as exc:
        # A call this architecture does not have (e.g. ``stime`` on x86-64 only exists for
        # the 32-bit entry point): nothing to deny.
        if exc.errno not in (errno.EINVAL, errno.EDOM, errno.EFAULT, errno.EOPNOTSUPP):
            raise
    except ValueError:
        pass


def pipe() -> int:
    """A file descriptor from which the program can be read once (for ``bwrap --seccomp``)."""
    read, write = os.pipe()
    try:
        os.write(write, program())  # a few KiB: fits in the pipe's buffer
    finally:
        os.close(write)
    return read
