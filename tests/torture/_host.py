"""What the torture suite observes on the host: processes, directories, containers,
memory, disk space — the evidence that nothing escaped, leaked or was touched."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio

from .._support import processes_with

CGROUP_ROOT = Path("/sys/fs/cgroup")
DOCKER_CLI_DEADLINE = 60


# -- processes ----------------------------------------------------------------------------


def kill_processes(marker: str) -> None:
    """SIGKILL what carries ``marker`` (cleanup after a failed check)."""
    for line in processes_with(marker):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(line.split(":", 1)[0]), 9)


def signal_processes(marker: str, signum: int) -> int:
    """Send ``signum`` to every process carrying ``marker``; return how many got it."""
    sent = 0
    for line in processes_with(marker):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(line.split(":", 1)[0]), signum)
            sent += 1
    return sent


# -- memory and disk ----------------------------------------------------------------------


def _status_kib(field: str, path: str = "/proc/self/status") -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rss() -> int:
    """Resident memory of this process, in bytes."""
    return _status_kib("VmRSS") * 1024


def reset_peak_rss() -> bool:
    """Restart the peak-RSS count of this process (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss() -> int:
    """Peak resident memory of this process since the last reset, in bytes."""
    return _status_kib("VmHWM") * 1024


def mem_available() -> int:
    return _status_kib("MemAvailable", "/proc/meminfo") * 1024


def disk_free(path: str | Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def disk_used(path: str | Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@contextlib.contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A size-capped tmpfs at ``path`` (root only): filling it cannot fill a real disk."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0711", "tmpfs", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            path.rmdir()


def can_mount() -> bool:
    return os.geteuid() == 0


# -- files ----------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (itself included) with its kind, size, mode, mtime and,
    for files, a digest of the content: compare two snapshots to prove nothing changed."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name) if name != "." else dirpath
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            rel = os.path.relpath(path, root)
            desc = f"{stat.filemode(st.st_mode)} {st.st_size} {st.st_mtime_ns}"
            if stat.S_ISLNK(st.st_mode):
                desc += " -> " + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                desc += " " + hashlib.sha256(Path(path).read_bytes()).hexdigest()
            out[rel] = desc
    return out


def escaping_links(dest: Path) -> list[str]:
    """Symlinks under ``dest`` whose real target lies outside ``dest``."""
    real = os.path.realpath(dest)
    bad = []
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if target != real and not target.startswith(real + os.sep):
                    bad.append(f"{os.path.relpath(path, dest)} -> {os.readlink(path)} = {target}")
    return bad


# -- cgroups (process backend) -------------------------------------------------------------


def cgroups_of(sandbox_ids: set[str]) -> list[str]:
    """Cgroup directories the process backend made for these sandboxes that still exist."""
    bases = [*CGROUP_ROOT.glob("*/asyncsandbox"), CGROUP_ROOT / "asyncsandbox"]
    left = [str(b / i) for b in bases for i in sorted(sandbox_ids) if (b / i).exists()]
    return left


# -- Docker ---------------------------------------------------------------------------------


def docker(*args: str, check: bool = True) -> str:
    """The docker CLI, synchronously, with a deadline."""
    done = subprocess.run(
        ["docker", *args], capture_output=True, timeout=DOCKER_CLI_DEADLINE, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode(errors="replace")


async def adocker(*args: str, check: bool = True) -> str:
    """The docker CLI without blocking the event loop."""
    with anyio.fail_after(DOCKER_CLI_DEADLINE):
        done = await anyio.run_process(["docker", *args], check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode(errors="replace")


def containers(label: str) -> list[str]:
    """Ids of containers (any state) carrying ``label`` — only ours: every container this
    suite creates carries its run's unique tag label."""
    return docker("ps", "-aq", "--no-trunc", "--filter", f"label={label}").split()


def remove_containers(label: str) -> None:
    """Remove the containers carrying ``label`` (ours only: see ``containers``)."""
    ids = containers(label)
    if ids:
        docker("rm", "-f", *ids, check=False)
