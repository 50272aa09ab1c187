"""The isolation mechanisms of the process backend: how one command is launched into its
sandbox.

Every mechanism gives the same guarantees (README, "The process backend's isolation"):
fresh user, PID, mount, network, IPC, UTS and cgroup namespaces; the root switched with
``pivot_root`` and the host's detached; a private, read-only ``/proc`` and a minimal
private ``/dev``; the command as an unprivileged user (a distinct host uid per sandbox
when the backend runs as root), with no capabilities, ``no_new_privs`` and the seccomp
filter of :mod:`._seccomp`; never PID 1 (an init reaps, so a command killed by signal N
exits 128+N); its environment never in any process's argv.

* :class:`Bubblewrap` when ``bwrap`` is installed;
* :class:`Native`, our own launcher (``_launcher.py``, Python's standard library only),
  on any Linux with user namespaces;
* ``GVisor`` (``_gvisor.py``), only when asked for: a second kernel (gVisor's, in user
  space) between the sandbox and the host's, with the same launcher inside it;
* :class:`Unisolated` (``none``): only when asked for by name, with a warning.

One protocol for all, on the command's stderr: what the mechanism writes there before
:data:`STARTED` is its own (why the sandbox could not be set up); the marker is written
just before the command is started; everything after it is the command's. So a failure
to set up is told apart from any exit status the command could have.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import types
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from . import _layout, _seccomp
from ._layout import SANDBOX_UID, SHIM_DIR, Layout

Mode = Literal["auto", "bwrap", "native", "gvisor", "none"]
MODES: tuple[Mode, ...] = ("auto", "bwrap", "native", "gvisor", "none")

STARTED = b"\0asyncsandbox:started\0"  # keep in step with _launcher.STARTED
LAUNCHER = Path(__file__).with_name("_launcher.py")
RESIDENT = Path(__file__).with_name("_resident.py")  # shipped after it, to an executor only
# The native launcher's interpreter runs this: the launcher (and for an executor, the
# resident executor, which gets it as its global `launcher`), compiled once by us
# (compiling them would cost every launch milliseconds), and the spec, from the descriptor
# named; then the last one's main().
BOOT = """import marshal, os, sys
fd = int(sys.argv[1])
codes, spec = marshal.loads(os.pread(fd, os.fstat(fd).st_size, 0))
os.close(fd)
launcher = type(sys)("asyncsandbox._process._launcher")
exec(codes[0], launcher.__dict__)
if len(codes) > 1:
    resident = type(sys)("asyncsandbox._process._resident")
    resident.launcher = launcher
    exec(codes[1], resident.__dict__)
    launcher = resident
launcher.main(spec)
"""
SHM_SIZE = 64 << 20

# Runs inside the sandbox (bubblewrap) or on the host (none) before the command: the
# marker, then a bad cwd or a missing program exits like a shell would (126/127).
ENTRY = (
    "printf '\\000asyncsandbox:started\\000' >&2; "
    'cd -- "$0" 2>/dev/null || { printf "cannot change to directory %s\\n" "$0" >&2; exit 126; }; '
    'exec "$@"'
)
# Runs on the host before isolation: join the sandbox's cgroups (so every process of the
# command is accounted and limited from its first instruction), then become the launcher.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'

GUARANTEES = (
    "user, PID, mount, network, IPC, UTS and cgroup namespaces",
    "pivot_root, host root detached",
    "private read-only /proc, minimal private /dev with its own /dev/shm",
    "no capabilities, no_new_privs",
    (
        "seccomp filter (ptrace, mount, nested user namespaces, keyring, modules, clocks, "
        "bpf, perf, userfaultfd, io_uring denied)"
    ),
    "never PID 1 (self-signal exits 128+N)",
    "environment not in any argv",
)


LAUNCHER_OUTPUT_LIMIT = 64 * 1024  # what we keep of a failing launcher's messages


class ChunkSource(Protocol):
    async def receive(self) -> bytes | None:
        """A chunk, or None at end of stream."""


class LaunchOutput:
    """A launched command's stderr: first what the launcher says, up to :data:`STARTED`,
    then the command's own output (read it with :meth:`receive`)."""

    def __init__(self, source: ChunkSource) -> None:
        self._source = source
        self._rest = b""
        self.launcher_output = ""

    async def started(self) -> bool:
        """Read the launcher's part; True if the command started."""
        seen = bytearray()
        while (chunk := await self._source.receive()) is not None:
            seen += chunk
            before, marker, after = seen.partition(STARTED)
            if marker:
                self.launcher_output = before.decode(errors="replace")
                self._rest = bytes(after)
                return True
            if len(seen) > LAUNCHER_OUTPUT_LIMIT + len(STARTED):
                del seen[: len(seen) - LAUNCHER_OUTPUT_LIMIT - len(STARTED)]
        self.launcher_output = seen.decode(errors="replace")
        return False

    async def receive(self) -> bytes | None:
        if self._rest:
            rest, self._rest = self._rest, b""
            return rest
        return await self._source.receive()


# Launcher failures that a new attempt may not meet (a host file replaced under the mount,
# a resource exhausted for a moment), as the C library words them.
_TRANSIENT = (
    "No such file or directory",
    "Device or resource busy",
    "Resource temporarily unavailable",
    "Cannot allocate memory",
    "Interrupted system call",
    "Stale file handle",
    "No space left on device",
    "Too many open files",
    # runsc, when the gVisor sandbox could not be made: it says no more of why (a file of
    # the sandbox's view missing, the machine short of something); the command never ran.
    "cannot create sandbox",
)


def transient(message: str) -> bool:
    """Whether a launcher's failure may pass (worth retrying)."""
    return any(text in message for text in _TRANSIENT)


class IsolationUnavailable(Exception):
    """A mechanism cannot run on this machine; the message says what is missing."""


@dataclass
class Launch:
    """How to spawn one command: argv and environment of the process to start, and file
    descriptors it inherits (the caller closes them once it is spawned)."""

    argv: list[str]
    env: dict[str, str]
    fds: list[int]
    stdin: int | None = None
    """A descriptor to be the process's stdin (else ``/dev/null``), not closed by us."""

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class Mechanism(ABC):
    """Launches commands into sandboxes in one way."""

    name: ClassVar[str]
    summary: ClassVar[str]
    isolated: ClassVar[bool] = True
    oom_ends_sandbox: ClassVar[bool] = False
    """Whether going over ``memory_mb`` ends the whole sandbox (gVisor: its kernel is in
    the cgroup) rather than one command, with 137."""

    promises: ClassVar[tuple[str, ...]] = GUARANTEES
    """What the mechanism guarantees (its seccomp entry dropped when seccomp is off)."""

    def __init__(self, *, seccomp: bool) -> None:
        self.seccomp = seccomp

    @abstractmethod
    def launch(
        self,
        layout: Layout,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        cgroups: Sequence[str],
    ) -> Launch:
        """The process to spawn to run ``argv`` in the sandbox of ``layout``."""

    def guarantees(self) -> list[str]:
        found = list(self.promises)
        if not self.seccomp:
            found = [g for g in found if not g.startswith("seccomp")]
        return found

    def describe(self, *, root: bool) -> str:
        uid = "a distinct host uid per sandbox" if root else "the backend's own uid"
        return f"{self.summary}: " + "; ".join([*self.guarantees(), f"runs as {uid}"])

    def probe(self, layout: Layout) -> str | None:
        """Run a check in a throwaway sandbox; return what is wrong, or None.

        Not only "does it start": the command must really be unprivileged, filtered, in its
        own namespaces, as the mechanism promises.
        """
        script = "id -u; readlink /proc/self/ns/user; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
        launch = self.launch(layout, ["/bin/sh", "-c", script], cwd="/", env={}, cgroups=())
        try:
            done = subprocess.run(
                launch.argv,
                env=launch.env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                pass_fds=launch.fds,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{self.name}: {exc}"
        finally:
            launch.close()
        prefix, marker, _ = done.stderr.partition(STARTED)
        if not marker or done.returncode != 0:
            message = prefix.decode(errors="replace").strip() or f"exit status {done.returncode}"
            return f"{self.name}: {message}"
        if not self.isolated:
            return None
        lines = done.stdout.decode(errors="replace").split("\n")
        status = dict(line.split(":\t", 1) for line in lines[2:] if ":\t" in line)
        host_userns = os.readlink("/proc/self/ns/user")
        problems = []
        if lines[0] != str(SANDBOX_UID):
            problems.append(f"the command runs as uid {lines[0]}")
        if lines[1] == host_userns:
            problems.append("the command is in the host's user namespace")
        if int(status.get("CapEff", "1"), 16):
            problems.append("the command holds capabilities")
        if status.get("NoNewPrivs") != "1":
            problems.append("no_new_privs is not set")
        if self.seccomp and status.get("Seccomp") != "2":
            problems.append("no seccomp filter is loaded")
        return f"{self.name}: {'; '.join(problems)}" if problems else None

    @staticmethod
    def _host_prefix(layout: Layout, cgroups: Sequence[str]) -> list[str]:
        """Join the cgroups and become the sandbox's host user (as root), then exec."""
        prefix: list[str] = []
        if cgroups:
            prefix = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *cgroups, "--"]
        if layout.host_ids is not None:
            setpriv = shutil.which("setpriv") or "setpriv"
            prefix += [
                setpriv,
                f"--reuid={layout.host_ids.uid}",
                f"--regid={layout.host_ids.gid}",
                "--clear-groups",
            ]
        return prefix


class Resident(Mechanism):
    """A mechanism that can run a sandbox's resident executor (the fast path)."""

    @abstractmethod
    def executor(
        self, layout: Layout, *, control: int, cgroups: Sequence[str], nproc: int | None = None
    ) -> Launch:
        """The sandbox's resident executor, serving commands on the socket ``control``
        (the caller passes it to the spawned process too, and keeps it; see ``_executor``).
        ``nproc``: the pids limit where the mechanism enforces it itself (gVisor), not by
        the cgroup."""


class Unisolated(Mechanism):
    name = "none"
    summary = "none: commands run directly on the host (unsafe for untrusted code)"
    isolated = False
    promises = ()

    def describe(self, *, root: bool) -> str:
        return self.summary

    def launch(
        self,
        layout: Layout,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        cgroups: Sequence[str],
    ) -> Launch:
        # Only paths under the writable areas are mapped to the sandbox directory.
        full_env = layout.env(env)
        full_env["HOME"] = layout.host_path(_layout.HOME)
        full_env["TMPDIR"] = layout.host_path("/tmp")
        command = ["/bin/sh", "-c", ENTRY, layout.host_path(cwd), *argv]
        return Launch([*self._host_prefix(layout, cgroups), *command], full_env, [])


class Bubblewrap(Mechanism):
    name = "bwrap"
    summary = "bubblewrap"

    def __init__(self, *, seccomp: bool, executable: str) -> None:
        super().__init__(seccomp=seccomp)
        self.executable = executable
        self.disable_userns = "--disable-userns" in _help(executable)
        self.default_signals = _default_signals()

    def launch(
        self,
        layout: Layout,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        cgroups: Sequence[str],
    ) -> Launch:
        uid = str(SANDBOX_UID)
        args = ["--unshare-user", "--uid", uid, "--gid", uid, "--unshare-pid", "--unshare-ipc"]
        args += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if self.disable_userns:
            args.append("--disable-userns")
        if layout.network == "none":
            args.append("--unshare-net")
        fds = []
        try:
            if self.seccomp:
                fds.append(_seccomp.pipe())
                args += ["--seccomp", str(fds[-1])]
            # Through --args, not argv: the environment (API keys) never shows in `ps`.
            args.append("--clearenv")
            for key, value in layout.env(env).items():
                args += ["--setenv", key, value]
            for kind, name, target in layout.view:
                if kind == "l":
                    args += ["--symlink", target, f"/{name}"]
                else:
                    source = layout.etc if name == "etc" else layout.source / name
                    args += ["--ro-bind", str(source), f"/{name}"]
            args += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
            args += ["--perms", "1777", "--size", str(SHM_SIZE), "--tmpfs", "/dev/shm"]
            for host_dir, inside in layout.writable():
                args += ["--bind", str(host_dir), inside]
            if layout.shims:
                args += ["--dir", SHIM_DIR]
            for inside, target in layout.shims:
                args += ["--symlink", target, inside]
            args += ["--remount-ro", "/"]
            fds.append(_pipe_with(b"".join(a.encode() + b"\0" for a in args)))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        # The command itself must follow on the command line (bwrap takes it from there).
        command = [*self.default_signals, self.executable, "--args", str(fds[-1]), "--"]
        command += ["/bin/sh", "-c", ENTRY]
        command += [cwd, *argv]
        return Launch([*self._host_prefix(layout, cgroups), *command], {}, fds)


@functools.cache
def _default_signals() -> tuple[str, ...]:
    """A prefix that starts the command with every signal at its default: bubblewrap and
    the shell pass on what the caller ignores (a trainer started under ``nohup``, or in the
    background of a script, ignores SIGHUP, SIGINT and SIGQUIT), and a shell cannot undo
    it. ``env --default-signal`` (coreutils 8.31+); nothing where it is missing."""
    env = shutil.which("env")
    if env is None:
        return ()
    try:
        probe = subprocess.run(
            [env, "--default-signal", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (env, "--default-signal") if probe.returncode == 0 else ()


class Native(Resident):
    name = "native"
    summary = "native launcher (Linux namespaces through Python's own system calls)"

    def __init__(self, *, seccomp: bool) -> None:
        super().__init__(seccomp=seccomp)
        self.cap_last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())

    def executor(
        self, layout: Layout, *, control: int, cgroups: Sequence[str], nproc: int | None = None
    ) -> Launch:
        return self.launch(layout, [], cwd="/", env={}, cgroups=cgroups, serve=control)

    def launch(
        self,
        layout: Layout,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        cgroups: Sequence[str],
        serve: int | None = None,
    ) -> Launch:
        ids = layout.host_ids
        spec = {
            "root": str(layout.root),
            "source": str(layout.source),
            "etc": str(layout.etc),
            "entries": [list(entry) for entry in layout.view],
            "writable": [[str(host), inside] for host, inside in layout.writable()],
            "shims": [list(shim) for shim in layout.shims],
            "network": layout.network,
            "host_uid": None if ids is None else ids.uid,
            "host_gid": None if ids is None else ids.gid,
            "uid": SANDBOX_UID,
            "cgroups": list(cgroups),
            "shm_size": str(SHM_SIZE),
            "cap_last_cap": self.cap_last_cap,
            "seccomp": _seccomp.program() if self.seccomp else None,
            "cwd": cwd,
            "argv": list(argv),
            "env": layout.env(env),
            "serve": serve,
        }
        import marshal

        fd = os.memfd_create("asyncsandbox-launch")  # close-on-exec, but where passed
        try:
            codes = _launcher_codes() if serve is not None else _launcher_codes()[:1]
            data = memoryview(marshal.dumps((codes, spec)))
            while data:
                data = data[os.write(fd, data) :]
        except BaseException:
            os.close(fd)
            raise
        argv_ = [sys.executable, "-I", "-S", "-B", "-c", BOOT, str(fd)]
        return Launch(argv_, {}, [fd])


@functools.cache
def _launcher_codes() -> tuple[types.CodeType, types.CodeType]:
    """The launcher's code and the resident executor's (see :data:`BOOT`)."""
    launcher, resident = (compile(p.read_bytes(), str(p), "exec") for p in (LAUNCHER, RESIDENT))
    return launcher, resident


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe holding ``data`` (written whole: it must fit the buffer)."""
    read, write = os.pipe()
    try:
        if len(data) > 65536:
            import fcntl

            try:
                fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, len(data))
            except OSError as exc:
                os.close(read)
                raise ValueError(
                    f"the command's arguments and environment take {len(data)} bytes, more "
                    "than fits a pipe on this machine (/proc/sys/fs/pipe-max-size)"
                ) from exc
        os.write(write, data)
    finally:
        os.close(write)
    return read


@functools.cache
def _help(executable: str) -> str:
    try:
        done = subprocess.run([executable, "--help"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.decode(errors="replace")
