"""The gVisor mechanism: each sandbox one gVisor sandbox (``runsc``), a second kernel in
the way.

Every other mechanism runs the command on the host's kernel, behind namespaces and a
seccomp filter: a kernel bug reachable through the calls we allow is a way out. Here the
command's system calls are served by gVisor's kernel (the *sentry*, a user-space kernel
in Go, itself confined by its own seccomp filter and namespaces); the host kernel sees
only the few calls the sentry makes.

Shape: one OCI bundle per sandbox (under its directory, ``gvisor/``) over the sandbox's
filesystem view, built of the same :class:`~._layout.Layout` as the other mechanisms' (the
system or image read-only, the writable areas bound read-write, the sandbox's ``/etc``),
run with ``runsc run``. Its first process is our launcher (``_launcher.contained``) as the
sandbox's resident executor, on the control socket runsc hands it as its stdin; so an
exec costs a message and a spawn inside the running gVisor sandbox, never a new kernel
(starting one costs ~200 ms, once per sandbox, or after ``executor_idle``).

Inside, the executor is the container's root (with the capabilities to give each command
a PID namespace of its own and to change uid: nothing more); each command runs under a
command init of its own PID namespace (never PID 1; killed whole with it), as the
sandbox's user (uid 1000, owning on the host the sandbox's own host uid, through the
bundle's user mappings), with no capabilities, ``no_new_privs`` and our seccomp filter
(loaded into gVisor's kernel). Its network is runsc's ``none`` (loopback only).

What this version of gVisor (Debian 12's 20221219) cannot give, and what we do instead:

* no mount namespace per command (``unshare(CLONE_NEWNS)`` changes nothing there): the
  command sees the sandbox's ``/proc`` (gVisor's own, holding the sandbox's processes
  only); the executor is kept from it by its uid (root: no signal, no ptrace, no
  ``/proc/1/fd``), and it is not dumpable;
* its ``statx`` and ``newfstatat`` refuse ``AT_NO_AUTOMOUNT``, which coreutils 9 passes:
  ``ls`` and ``stat`` of Debian 12 fail there with EINVAL (newer gVisor accepts the flag;
  nothing a filter can change, since it cannot rewrite arguments);
* one set of protocol counters (``/proc/net/snmp``: IP, ICMP, TCP, UDP) for all its
  network namespaces: a reset gives the next commands a new namespace (their sockets and
  interface counters fresh, as on the other mechanisms), but those counters still show
  the last episode's traffic; only a new gVisor sandbox starts them at zero;
* it needs root (``runsc`` without ``--rootless``: its rootless mode cannot give the
  sandbox's files a host uid of their own);
* limits: gVisor's processes are not the host's, so the sandbox's cgroup holds the whole
  gVisor sandbox (runsc, its kernel and file server; as Docker does with runsc):
  ``memory_mb`` bounds the sandbox's memory with its kernel's (tens of MiB), and a sandbox
  that exceeds it is ended whole (the host kills gVisor's kernel): the exec raises
  :class:`SandboxOOMKilled`, as Docker's does for a container killed for memory, not an
  exit status of 137. ``pids`` is not the cgroup's there (on the ptrace platform the
  kernel's own host threads count, and twelve concurrent pythons passed 512): gVisor's
  kernel enforces it, as the sandbox user's ``RLIMIT_NPROC`` (all the sandbox's commands
  run as that one user, so it bounds the sandbox's processes and threads, as ``pids.max``
  would); the cgroup's ``pids.max`` bounds gVisor as a whole on the host
  (:func:`host_pids`). ``cpus`` and the disk quota hold as elsewhere.
"""

from __future__ import annotations

import array
import json
import marshal
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import _seccomp
from ._isolation import (
    JOIN_CGROUPS,
    LAUNCHER,
    RESIDENT,
    SHM_SIZE,
    STARTED,
    IsolationUnavailable,
    Launch,
    Resident,
)
from ._layout import SANDBOX_UID, SHIM_DIR, Layout

PACKAGE_HINT = (
    "install gVisor's runsc (Debian/Ubuntu: apt-get install runsc; elsewhere see "
    "https://gvisor.dev/docs/user_guide/install/)"
)
# The executor's capabilities inside the sandbox: a PID namespace per command
# (CAP_SYS_ADMIN, which also remounts /dev/shm and makes new IPC and network namespaces
# for a reset), becoming the sandbox's user (CAP_SETUID, CAP_SETGID, CAP_SETPCAP to drop
# the bounding set first), killing commands of another uid (CAP_KILL). Commands hold none.
CAPABILITIES = ["CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"]
BOOT_PATH = "/.asyncsandbox/boot"
# The sandbox's python3 compiles the launcher and the resident executor itself (as
# _isolation.BOOT runs them): it may not be our interpreter's version (an image's), and
# marshalled code is only read by the version that wrote it.
BOOT = f"""import marshal, sys
with open({BOOT_PATH!r}, "rb") as f:
    (launcher_source, resident_source), spec = marshal.loads(f.read())
launcher = type(sys)("asyncsandbox._process._launcher")
exec(compile(launcher_source, "_launcher.py", "exec"), launcher.__dict__)
resident = type(sys)("asyncsandbox._process._resident")
resident.launcher = launcher
exec(compile(resident_source, "_resident.py", "exec"), resident.__dict__)
resident.main(spec)
"""

GUARANTEES = (
    "gVisor's user-space kernel between the command and the host's (runsc, ptrace platform)",
    "PID, mount, network (none: loopback only), IPC and UTS namespaces of gVisor's kernel",
    "gVisor's own /proc (the sandbox's processes only) and /dev, with its own /dev/shm",
    "no capabilities, no_new_privs",
    "seccomp filter inside gVisor (as on every mechanism)",
    "never PID 1 (each command under an init of its own PID namespace)",
    "environment not in any argv",
)


def host_pids(pids: int) -> int:
    """The host pids cgroup's bound on a gVisor sandbox whose user asked for ``pids``:
    gVisor's own threads at rest, and its host tasks per task of the sandbox. Measured with
    runsc 20221219 (ptrace) on this backend: a fork bomb held at 64 tasks by gVisor's
    kernel peaked at 985-1,248 host tasks (no host bound; about 18 per task), and at
    256 + 8 per task, the Docker backend's bound for a runsc container, gVisor could not
    make its threads and the sandbox's executor died. Twice the peak seen."""
    return 1024 + 24 * pids


class GVisor(Resident):
    name = "gvisor"
    summary = "gVisor (runsc: a user-space kernel per sandbox, the resident executor inside)"
    oom_ends_sandbox = True
    promises = GUARANTEES

    def __init__(self, *, seccomp: bool, executable: str) -> None:
        super().__init__(seccomp=seccomp)
        self.executable = executable
        self.cap_last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())

    @classmethod
    def find(cls, *, seccomp: bool) -> GVisor | IsolationUnavailable:
        """The mechanism, or why this machine cannot run it."""
        executable = shutil.which("runsc")
        if executable is None:
            return IsolationUnavailable(f"gvisor: runsc is not installed ({PACKAGE_HINT})")
        if os.geteuid() != 0:
            return IsolationUnavailable(
                "gvisor: runsc needs root here (its rootless mode cannot give a sandbox's "
                "files a host uid of their own); run the backend as root"
            )
        return cls(seccomp=seccomp, executable=executable)

    def launch(
        self,
        layout: Layout,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        cgroups: Sequence[str],
    ) -> Launch:
        # One gVisor sandbox per command would boot a kernel per command; the backend never
        # chooses a launcher per command with this mechanism.
        raise NotImplementedError("gVisor runs commands through the sandbox's executor only")

    def executor(
        self, layout: Layout, *, control: int, cgroups: Sequence[str], nproc: int | None = None
    ) -> Launch:
        bundle = self._bundle(layout, nproc)
        prefix = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *cgroups, "--"] if cgroups else []
        container = f"asyncsandbox-{layout.root.name}-{uuid.uuid4().hex[:8]}"
        argv = [
            *prefix,
            self.executable,
            "--root",
            str(bundle / "state"),
            "--network=none",
            # Our cgroups (joined above) hold the whole gVisor sandbox; runsc makes none.
            "--ignore-cgroups",
            "run",
            "--bundle",
            str(bundle),
            container,
        ]
        return Launch(argv, {}, [], stdin=control)

    def _bundle(self, layout: Layout, nproc: int | None) -> Path:
        """Write the sandbox's OCI bundle (its ``config.json`` and the executor's boot
        file) and the symlinks of its root; return its directory."""
        bundle = layout.root / "gvisor"
        bundle.mkdir(mode=0o700, exist_ok=True)
        rootfs = layout.root / "view"  # empty: runsc mounts the view's entries over it
        for kind, name, target in layout.view:
            if kind == "l" and not (rootfs / name).is_symlink():
                os.symlink(target, rootfs / name)
        if layout.shims:
            (rootfs / SHIM_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for inside, target in layout.shims:
                if not (rootfs / inside.lstrip("/")).is_symlink():
                    os.symlink(target, rootfs / inside.lstrip("/"))
        spec = {
            "gvisor": True,
            "uid": SANDBOX_UID,
            "shm_size": str(SHM_SIZE),
            "cap_last_cap": self.cap_last_cap,
            "seccomp": _seccomp.program() if self.seccomp else None,
            "cwd": "/",
            "argv": [],
            "env": layout.env({}),
            "network": "none",
            "nproc": nproc,
        }
        boot = bundle / "boot"
        boot.unlink(missing_ok=True)
        fd = os.open(boot, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps(((LAUNCHER.read_text(), RESIDENT.read_text()), spec)))
        (bundle / "config.json").write_text(json.dumps(self._config(layout, boot)))
        return bundle

    def _config(self, layout: Layout, boot: Path) -> dict[str, object]:
        mounts: list[dict[str, object]] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "nodev", "mode=1777", f"size={SHM_SIZE}"],
            },
        ]
        # The read-only system (or image) is this sandbox's alone to cache: nothing changes
        # it on the host while the sandbox lives. gVisor revalidates every lookup in a
        # bind mount with the host (its file server) unless told so (runsc's default for
        # mounts is "shared"): a `python3 -c` start, whose imports look up hundreds of
        # paths, took ~1.5x the CPU (ptrace, here). A mount hint of share "container"
        # makes one such mount exclusive; the writable areas stay revalidated (a reset or
        # a snapshot's restore rewrites them from the host).
        annotations: dict[str, str] = {}
        for kind, name, _ in layout.view:
            if kind == "d":
                source = layout.etc if name == "etc" else layout.source / name
                mounts.append(_bind(str(source), f"/{name}", "ro"))
                hint = f"dev.gvisor.spec.mount.system-{name}."
                annotations |= {hint + "source": str(source), hint + "type": "bind"}
                annotations[hint + "share"] = "container"
        for host, inside in layout.writable():
            mounts.append(_bind(str(host), inside, "rw"))
        mounts.append(_bind(str(boot), BOOT_PATH, "ro"))
        namespaces: list[dict[str, str]] = [
            {"type": kind} for kind in ("pid", "network", "ipc", "uts", "mount")
        ]
        linux: dict[str, object] = {"namespaces": namespaces}
        ids = layout.host_ids
        if ids is not None:
            # The sandbox's user owns, on the host, the sandbox's own uid (its files there);
            # the executor (root) is the host's root as runsc sees it (it makes no files).
            namespaces.append({"type": "user"})
            linux["uidMappings"] = [
                {"containerID": 0, "hostID": 0, "size": 1},
                {"containerID": SANDBOX_UID, "hostID": ids.uid, "size": 1},
            ]
            linux["gidMappings"] = [
                {"containerID": 0, "hostID": 0, "size": 1},
                {"containerID": SANDBOX_UID, "hostID": ids.gid, "size": 1},
            ]
        env = layout.env({})
        return {
            "ociVersion": "1.0.0",
            "process": {
                "user": {"uid": 0, "gid": 0},
                "args": ["python3", "-I", "-S", "-B", "-c", BOOT],
                "env": [f"{key}={value}" for key, value in env.items()],
                "cwd": "/",
                "capabilities": dict.fromkeys(("bounding", "effective", "permitted"), CAPABILITIES),
                "noNewPrivileges": True,
            },
            "root": {"path": str(layout.root / "view"), "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": linux,
            "annotations": annotations,
        }

    def probe(self, layout: Layout) -> str | None:
        """Start the executor in a throwaway sandbox and run a check through it: the
        command must be the sandbox's user, hold nothing, be filtered, and see gVisor's
        kernel, not the host's."""
        # (gVisor's /proc/self/status has no NoNewPrivs line: asked of prctl instead.)
        script = (
            "id -u; cat /proc/version; grep -E '^(CapEff|Seccomp):' /proc/self/status; "
            'python3 -c \'import ctypes; print("NoNewPrivs:\\t%d" % ctypes.CDLL(None)'
            ".prctl(39, 0, 0, 0, 0))'"
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            launch = self.executor(layout, control=theirs.fileno(), cgroups=())
            process = subprocess.Popen(
                launch.argv,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            return f"{self.name}: {exc}"
        finally:
            theirs.close()
        out_r, out_w = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        answer: dict[str, object] = {}
        try:
            request = {
                "op": "run",
                "id": 1,
                "argv": ["/bin/sh", "-c", script],
                "env": layout.env({}),
                "cwd": "/",
            }
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null, out_w, null]))]
            ours.sendmsg([marshal.dumps(request)], rights)
            os.close(out_w)
            out_w = -1
            ours.settimeout(60)
            data = ours.recv(1 << 16)
            if data:
                answer = marshal.loads(data)
            with os.fdopen(out_r, "rb") as f:
                out_r = -1
                output = f.read().decode(errors="replace")
        except OSError as exc:
            return f"{self.name}: {exc}"
        finally:
            for fd in (out_r, out_w, null):
                if fd >= 0:
                    os.close(fd)
            ours.close()  # the executor exits, and runsc with it
            try:
                _, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
        said = err.partition(STARTED)[0].decode(errors="replace").strip()
        if answer.get("exit") != 0:
            why = answer.get("error") or said or f"runsc exited with status {process.returncode}"
            return f"{self.name}: {why}"
        lines = output.split("\n")
        status = dict(line.split(":\t", 1) for line in lines[2:] if ":\t" in line)
        problems = []
        if lines[0] != str(SANDBOX_UID):
            problems.append(f"the command runs as uid {lines[0]}")
        if lines[1] == Path("/proc/version").read_text().strip():
            problems.append("the command sees the host's kernel")
        if int(status.get("CapEff", "1"), 16):
            problems.append("the command holds capabilities")
        if status.get("NoNewPrivs") != "1":
            problems.append("no_new_privs is not set")
        if self.seccomp and status.get("Seccomp") != "2":
            problems.append("no seccomp filter is loaded")
        return f"{self.name}: {'; '.join(problems)}" if problems else None


def _bind(source: str, destination: str, mode: str) -> dict[str, object]:
    options = ["rbind", mode, "nosuid"] + (["nodev"] if mode == "rw" else [])
    return {"destination": destination, "type": "bind", "source": source, "options": options}
