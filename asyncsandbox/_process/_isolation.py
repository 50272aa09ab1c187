"""Command lines that run a program inside a process sandbox.

Each command runs in fresh Linux namespaces (user, PID, network, IPC, UTS, mount) over the
sandbox's filesystem view: the host's system directories (or a root filesystem image)
read-only, and the sandbox's own writable ``/tmp``, home and workdir. The namespace's PID 1
is tied to our child process (``--die-with-parent``): killing that one process kills every
process of the command, daemons included, and when the command's main process exits the
namespace dies with it.

When running as root, the sandbox runs as an unprivileged host user (``nobody`` by
default): root-only host files stay unreadable even through the read-only view.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
HOME = "/home/sandbox"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Host directories forming the read-only system view (when no image is given).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
# Top-level entries of an image that the sandbox provides itself.
PROVIDED = frozenset({"proc", "dev", "sys", "tmp", "home", "run"})
READ_ONLY_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/etc", "/opt", "/proc", "/dev", "/sys")

# Runs inside the sandbox before the command: a bad cwd or a missing program exits like a
# shell would (126/127) instead of as a launcher error.
ENTRY = (
    'cd -- "$0" 2>/dev/null || { printf "cannot change to directory %s\\n" "$0" >&2; exit 126; }; '
    'exec "$@"'
)
# Runs on the host before isolation: join the sandbox's cgroups (so every process of the
# command is accounted and limited from its first instruction), then become the launcher.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class Layout:
    """Where a sandbox lives on the host, and how it looks from inside."""

    root: Path  # the sandbox directory on the host
    image: Path | None  # root filesystem, or None for the host's system view
    workdir: str
    network: str

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
        if self.image is None:
            source, names = Path("/"), list(SYSTEM_DIRS)
        else:
            source = self.image
            names = sorted(n for n in os.listdir(self.image) if n not in PROVIDED)
        entries = []
        for name in names:
            host = source / name
            if host.is_symlink():
                entries.append(("l", name, os.readlink(host)))
            elif host.exists():
                entries.append(("d", name, ""))
        return entries

    def host_path(self, path: str) -> str:
        """The host path that ``path`` (inside the sandbox) maps to, in unisolated mode."""
        for host, inside in reversed(self.writable()):
            if path == inside or path.startswith(inside + "/"):
                return str(host) + path[len(inside) :]
        return path


def base_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        "PATH": BASE_PATH,
        "HOME": HOME,
        "USER": SANDBOX_USER,
        "LOGNAME": SANDBOX_USER,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        **env,
    }


class Isolation:
    """Builds sandboxed command lines for one isolation mode."""

    name = "none"
    description = "none (commands run directly on the host)"

    def __init__(self, run_as: int | None) -> None:
        self.run_as = run_as  # host uid the sandbox runs as (when we are root)

    def _privilege_drop(self) -> list[str]:
        if self.run_as is None:
            return []
        setpriv = shutil.which("setpriv") or "setpriv"
        return [setpriv, f"--reuid={self.run_as}", f"--regid={self.run_as}", "--clear-groups"]

    def command(
        self, layout: Layout, argv: tuple[str, ...], *, cwd: str, env: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """(argv to spawn, environment to spawn it with)."""
        # Unisolated: only paths under the writable areas are mapped to the sandbox dir.
        full_env = base_env(env)
        full_env["HOME"] = layout.host_path(HOME)
        full_env["TMPDIR"] = layout.host_path("/tmp")
        return [
            *self._privilege_drop(),
            "/bin/sh",
            "-c",
            ENTRY,
            layout.host_path(cwd),
            *argv,
        ], full_env


class Bubblewrap(Isolation):
    name = "bwrap"
    description = "bubblewrap: user, PID, network, IPC, UTS and mount namespaces"

    def __init__(self, run_as: int | None, executable: str) -> None:
        super().__init__(run_as)
        self.executable = executable

    def command(
        self, layout: Layout, argv: tuple[str, ...], *, cwd: str, env: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        args = [
            *self._privilege_drop(),
            self.executable,
            "--unshare-user",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
        ]
        if layout.network == "none":
            args.append("--unshare-net")
        for key, value in base_env(env).items():
            args += ["--setenv", key, value]
        source = "/" if layout.image is None else str(layout.image)
        for kind, name, target in layout.view:
            if kind == "l":
                args += ["--symlink", target, f"/{name}"]
            else:
                args += ["--ro-bind", os.path.join(source, name), f"/{name}"]
        args += [
            "--ro-bind",
            str(layout.root / "passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(layout.root / "group"),
            "/etc/group",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ]
        for host_dir, inside in layout.writable():
            args += ["--bind", str(host_dir), inside]
        args += ["--", "/bin/sh", "-c", ENTRY, cwd, *argv]
        return args, {}


class Unshare(Isolation):
    """util-linux ``unshare`` plus a mount script, where bubblewrap is missing."""

    name = "unshare"
    description = "unshare: user, PID, network, IPC, UTS and mount namespaces"

    # Inside new user+mount namespaces (as the namespace's root): build the view under a
    # private tmpfs and chroot into it. $1: layout root, $2: source root (/ or the image),
    # $3: entries of Layout.view(), one per line, $4: workdir, $5: cwd; then the command.
    # Runs under `unshare --fork --pid`, so this shell is the namespace's PID 1 until it execs.
    SCRIPT = r"""
set -e
root=$1 source=$2 entries=$3 workdir=$4 cwd=$5; shift 5
view=$root/view
mount -t tmpfs -o mode=755 tmpfs "$view"
hostname sandbox 2>/dev/null || true
echo "$entries" | while read -r kind name target; do
  [ -n "$name" ] || continue
  if [ "$kind" = l ]; then ln -s "$target" "$view/$name"
  else
    if [ -d "$source/$name" ]; then mkdir "$view/$name"; else : > "$view/$name"; fi
    mount --rbind "$source/$name" "$view/$name"; mount -o remount,bind,ro "$view/$name"
  fi
done
mount --bind "$root/passwd" "$view/etc/passwd"; mount --bind "$root/group" "$view/etc/group"
mkdir -p "$view/proc" "$view/dev" "$view/tmp" "$view/home/sandbox" 2>/dev/null || true
mount -t proc proc "$view/proc"
mount --rbind /dev "$view/dev"
mount --bind "$root/fs/tmp" "$view/tmp"
mount --bind "$root/fs/home" "$view/home/sandbox"
case "$workdir" in /tmp|/tmp/*|/home/sandbox|/home/sandbox/*) ;; *)
  mkdir -p "$view$workdir" 2>/dev/null || true; mount --bind "$root/fs/work" "$view$workdir";;
esac
set +e
exec chroot "$view" /bin/sh -c 'cd -- "$0" 2>/dev/null || { echo "cannot change to directory $0" >&2; exit 126; }; exec "$@"' "$cwd" "$@"
"""

    def __init__(self, run_as: int | None, executable: str) -> None:
        super().__init__(run_as)
        self.executable = executable

    def command(
        self, layout: Layout, argv: tuple[str, ...], *, cwd: str, env: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        args = [
            *self._privilege_drop(),
            self.executable,
            "--user",
            "--map-root-user",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--ipc",
            "--uts",
            "--propagation",
            "private",
        ]
        if layout.network == "none":
            args.append("--net")
        source = "/" if layout.image is None else str(layout.image)
        entries = "\n".join(" ".join(entry).strip() for entry in layout.view)
        args += ["/bin/sh", "-c", self.SCRIPT, "sh", str(layout.root), source, entries]
        args += [layout.workdir, cwd, *argv]
        return args, base_env(env)


def probe(isolation: Isolation, scratch: Path) -> str | None:
    """Run ``true`` in a throwaway sandbox; return an error message if that fails."""
    from ._backend import prepare_layout

    layout = Layout(scratch, None, "/workspace", "none")
    prepare_layout(layout, isolation.run_as)
    argv, env = isolation.command(layout, ("true",), cwd="/workspace", env={})
    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
    return None
