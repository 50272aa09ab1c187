"""asyncsandbox's own launcher: runs one command in fresh Linux namespaces, with the same
guarantees as the bubblewrap mechanism, using nothing but Python's standard library.

Never imported by the package: the backend compiles this file once and runs it in a fresh
interpreter of its own (``python -I -S -B -c BOOT FD``, see ``_isolation.Native``), which
reads the compiled module and the spec (one dict) from ``FD`` and calls :func:`main`, with
the command's stdin, stdout and stderr as fd 0, 1, 2.

With ``"serve"`` in the spec, init does not run one command: it stays, as the sandbox's
resident executor (``_resident.py``, shipped after this file in that case, which starts
through its own ``main`` and hands this one its ``serve``), and runs the commands the
backend sends over a control socket.

Like every mechanism of the backend, it speaks one protocol on stderr: whatever it writes
there before :data:`STARTED` is its own (why the sandbox could not be set up, exit status
125); the marker is init's last write before it spawns the command, so everything after
it is the command's.

Three processes, each with one job::

    launcher (host PID namespace)          joins the cgroups, drops to the sandbox's host
      |                                    uid, creates the namespaces, waits, exits with
      |                                    the command's status
      +-- init (PID 1 of the new namespace) builds the filesystem view, pivot_root()s into
            |                              it, sheds every capability, sets no_new_privs
            |                              and the seccomp filter, spawns the command;
            |                              then reaps, forwards signals, and kills whatever
            |                              the command left once it exits
            +-- command (PID 2)            inherits all that: its own session, default
                                           signal dispositions, then the program

The launcher and init are not dumpable (the command cannot ptrace them, read their memory
or open their file descriptors) and ``/proc`` is mounted read-only. The exit status is the
command's: its code, or 128+N if signal N killed it.

Everything is imported before the filesystem is switched: afterwards the interpreter's
own library is out of reach.
"""

from __future__ import annotations

# Only modules that are cheap to import (no json, enum, socket or contextlib: each would
# cost milliseconds on every command).
import _socket
import ctypes
import errno
import fcntl
import os
import struct

TYPE_CHECKING = False  # not typing's: importing typing would cost milliseconds per command
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable
    from typing import Any, NoReturn

    Spec = dict[str, Any]
    Serve = Callable[[Spec, int], NoReturn]
else:
    import _signal as signal  # signal.py imports enum

LIBC = ctypes.CDLL(None, use_errno=True)
resource: Any = None  # imported by contained() (gVisor), for become()

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
MOUNT_OPTIONS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522

SYS_PIVOT_ROOT = {
    "x86_64": 155,
    "aarch64": 41,
    "riscv64": 41,
    "loongarch64": 41,
    "ppc64le": 203,
    "ppc64": 203,
    "s390x": 217,
    "i686": 217,
    "i386": 217,
    "armv7l": 218,
}
SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "riscv64": 31, "loongarch64": 31}
SYS_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275, "riscv64": 275, "loongarch64": 275}
SCHED_ATTR_SIZE = 56  # struct sched_attr up to its utilisation clamps (SCHED_ATTR_SIZE_VER1)
MACHINE = os.uname().machine
IOPRIO_WHO_PROCESS = 1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

SETUP_FAILED = 125  # our exit status when the command never started
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
DEFAULT_SIGNALS = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
STARTED = b"\0asyncsandbox:started\0"  # keep in step with _isolation.STARTED


class SetupError(Exception):
    def __init__(self, what: str, err: int | None = None) -> None:
        self.err = err
        super().__init__(what if err is None else f"{what}: {os.strerror(err)}")


def check(result: int, what: str) -> None:
    if result != 0:
        raise SetupError(what, ctypes.get_errno())


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    check(
        LIBC.mount(
            None if source is None else source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            None if data is None else data.encode(),
        ),
        f"mount {source or fstype or ''} on {target}",
    )


def prctl(option: int, value: int, what: str) -> None:
    check(LIBC.prctl(option, ctypes.c_ulong(value), 0, 0, 0), what)


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def report(message: str) -> None:
    """Tell the backend why the sandbox could not be set up (the command never ran)."""
    try:
        os.write(2, f"asyncsandbox launcher: {message}\n".encode(errors="replace")[:4000])
    except OSError:
        pass


def failed(exc: BaseException) -> NoReturn:
    """Report why the sandbox could not be set up, then exit: the command never ran."""
    report(str(exc) if isinstance(exc, SetupError) else f"{type(exc).__name__}: {exc}")
    os._exit(SETUP_FAILED)


# -- the launcher (host PID namespace) ---------------------------------------------------


def main(spec: Spec, serve: Serve | None = None) -> NoReturn:
    """Run ``spec``'s command; or, given the resident executor's ``serve`` (its ``main``
    passes it), be the sandbox's executor."""
    try:
        if spec.get("gvisor"):
            contained(spec, serve)  # never returns
        launcher(spec, serve)
    except BaseException as exc:  # noqa: BLE001 - report, never a traceback on stderr
        failed(exc)
    os._exit(SETUP_FAILED)


def launcher(spec: Spec, serve: Serve | None) -> None:
    parent = os.getppid()
    for procs in spec["cgroups"]:  # before anything else: every process is accounted
        write_file(procs, str(os.getpid()))
    if spec["host_uid"] is not None:  # root: become the sandbox's own host user
        os.setgroups([])
        os.setresgid(spec["host_gid"], spec["host_gid"], spec["host_gid"])
        os.setresuid(spec["host_uid"], spec["host_uid"], spec["host_uid"])
        # Changing uid made us undumpable, which leaves /proc/self/uid_map to root.
        prctl(PR_SET_DUMPABLE, 1, "make the launcher dumpable")
    # After the uid change, which clears it: die with the backend.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "set the parent-death signal")
    if os.getppid() != parent:  # the backend died before we armed the signal
        os._exit(SETUP_FAILED)
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        raise SetupError("refusing to map the sandbox user to the host's root")
    check(LIBC.unshare(CLONE_NEWUSER), "create a user namespace")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{spec['uid']} {uid} 1\n")
    write_file("/proc/self/gid_map", f"{spec['uid']} {gid} 1\n")
    prctl(PR_SET_DUMPABLE, 0, "make the launcher undumpable")
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    if spec["network"] == "none":
        flags |= CLONE_NEWNET
    check(LIBC.unshare(flags), "create the namespaces")
    pid = os.fork()
    if pid == 0:
        init(spec, serve)  # never returns
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
    _, status = os.waitpid(pid, 0)
    os._exit(exit_code(status))


def exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def contained(spec: Spec, serve: Serve | None) -> NoReturn:
    """The resident executor in a gVisor sandbox (``_gvisor.py``): runsc has built the view,
    the namespaces and the network; we are the container's first process (PID 1), its root
    (with the capabilities to give each command a PID namespace and to become the sandbox's
    user in it), behind gVisor's kernel, and the control socket is our stdin."""
    global resource
    import resource  # for the sandbox's nproc limit (see become)

    if serve is None:
        raise SetupError("the resident executor was not shipped")
    for signum in FORWARDED:
        signal.signal(signum, forward)
    control = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)  # 0 becomes /dev/null in serve()
    serve(spec, control)


# -- init (PID 1) ------------------------------------------------------------------------


def init(spec: Spec, serve: Serve | None) -> NoReturn:
    # Before anything can signal us: a signal to init is forwarded to the command (and
    # ignored while there is none), never raised here as KeyboardInterrupt.
    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "set the parent-death signal")
        view = spec["root"] + "/view"
        build_view(spec, view)
        enter(view)
        check(LIBC.sethostname(b"sandbox", 7), "set the host name")
        if spec["network"] == "none":
            loopback_up()
        if spec.get("serve") is not None:
            if serve is None:
                raise SetupError("the resident executor was not shipped")
            serve(spec, spec["serve"])  # never returns
        start(spec)
    except BaseException as exc:  # noqa: BLE001 - anything here means "not started"
        failed(exc)
    os._exit(reap()[0])


def build_view(spec: Spec, view: str) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", view, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    source = spec["source"]
    readonly = []
    for kind, name, target in spec["entries"]:
        path = f"{view}/{name}"
        if kind == "l":
            os.symlink(target, path)
            continue
        host = spec["etc"] if name == "etc" else f"{source}/{name}"
        if os.path.isdir(host):
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        mount(host, path, None, MS_BIND | MS_REC)
        readonly.append(os.path.realpath(path))
    restrict(readonly, MS_RDONLY)
    for name in ("proc", "dev", "tmp", "home/sandbox"):
        makedirs(f"{view}/{name}")
    # A private /proc of the new PID namespace, read-only: /proc/1/mem and the like cannot
    # be opened for writing even where permissions would allow it.
    mount("proc", f"{view}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    remount(f"{view}/proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    build_dev(f"{view}/dev", spec["shm_size"])
    writable = []
    for host, inside in spec["writable"]:
        makedirs(view + inside)
        mount(host, view + inside, None, MS_BIND | MS_REC)
        writable.append(os.path.realpath(view + inside))
    restrict(writable, MS_NODEV)
    for name, target in spec["shims"]:
        makedirs(os.path.dirname(view + name))
        os.symlink(target, view + name)
    remount(view, MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_dev(dev: str, shm_size: str) -> None:
    """A minimal private /dev: the harmless devices bound from the host, its own /dev/shm
    and pseudo-terminals, nothing else."""
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        path = f"{dev}/{name}"
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
        mount(f"/dev/{name}", path, None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={shm_size}")
    os.mkdir(f"{dev}/pts")
    # Pseudo-terminals where the kernel allows devpts in a user namespace; none otherwise.
    try:
        mount(
            "devpts",
            f"{dev}/pts",
            "devpts",
            MS_NOSUID | MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=620",
        )
    except SetupError:
        pass
    remount(dev, MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def restrict(points: list[str], flags: int) -> None:
    """Add ``flags`` and nosuid to every mount at or under ``points``, keeping the flags
    the kernel locks in a user namespace (a bind mount does not apply flags to submounts,
    and a remount that dropped a locked flag such as the host's noexec would fail)."""
    with open("/proc/self/mountinfo", "rb") as f:
        table = [
            (unescape(fields[4]), fields[5].decode().split(",")) for fields in map(bytes.split, f)
        ]
    for top in points:
        below = [(p, o) for p, o in table if p == top or p.startswith(top + "/")]
        if not any(p == top for p, _ in below):
            raise SetupError(f"{top} is not a mount point after binding it")
        for point, options in below:
            wanted = flags | MS_NOSUID
            for option in options:
                wanted |= MOUNT_OPTIONS.get(option, 0)
            if not wanted & (MS_NOATIME | MS_RELATIME):
                wanted |= MS_STRICTATIME
            try:
                remount(point, wanted)
            except SetupError as exc:
                # A submount we cannot even look into cannot be reached from inside either.
                if point == top or exc.err != errno.EACCES:
                    raise


def unescape(raw: bytes) -> str:
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 3 < len(raw):  # \ooo
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return os.fsdecode(bytes(out))


def remount(path: str, flags: int) -> None:
    mount(None, path, None, MS_REMOUNT | MS_BIND | flags)


def makedirs(path: str) -> None:
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise SetupError(f"create {path}", exc.errno) from None


def enter(view: str) -> None:
    """Make ``view`` the root, with the host's root detached (not merely hidden, as chroot
    would leave it)."""
    os.chdir(view)
    number = SYS_PIVOT_ROOT.get(MACHINE)
    if number is None:
        raise SetupError(f"pivot_root: unknown system call number on {MACHINE}")
    check(LIBC.syscall(number, b".", b"."), "pivot_root")
    check(LIBC.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def loopback_up() -> None:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    finally:
        s.close()


COMMAND = [0]  # the command's pid, once forked


def start(spec: Spec) -> None:
    """Shed every privilege, then spawn the command (or exit as a shell would have)."""
    shed(spec)
    code = launch(spec)
    if code is not None:
        os._exit(code)


def shed(spec: Spec) -> None:
    """Shed every privilege, for good.

    init sheds them itself, before the command exists (nothing it does afterwards, reaping
    and killing in its own namespace, needs one), and the command inherits that state: so
    the command is spawned (``posix_spawn``: no copy of this interpreter, as a ``fork``
    would make) with only its session, signal dispositions and mask to set. (As every
    ``posix_spawn`` of the GNU C library leaves them, the command starts with the library's
    two reserved signals, 32 and 33, ignored; its threads library takes them over when it
    needs them.)
    """
    prctl(PR_SET_DUMPABLE, 0, "make init undumpable")
    drop_capabilities(spec["cap_last_cap"])
    prctl(PR_SET_NO_NEW_PRIVS, 1, "set no_new_privs")
    if spec["seccomp"] is not None:
        load_seccomp(spec["seccomp"])  # last: the filter also binds what we do from here on


def launch(spec: Spec) -> int | None:
    """Say :data:`STARTED`, then spawn the command: None once it runs, else the exit
    status a shell would give for why it could not (after saying why on its stderr)."""
    os.write(2, STARTED)
    # From here on, what happens is the command's outcome, reported as a shell would.
    argv, env = spec["argv"], spec["env"]
    try:
        os.chdir(spec["cwd"])
    except OSError:
        os.write(2, f"cannot change to directory {spec['cwd']}\n".encode(errors="replace"))
        return 126
    pid, error = spawnvpe(argv, env)
    if pid is None:
        code = 127 if error in (errno.ENOENT, errno.ENOTDIR) else 126
        reason = "not found" if code == 127 else os.strerror(error)
        os.write(2, f"{argv[0]}: {reason}\n".encode(errors="replace"))
        return code
    COMMAND[0] = pid
    return None


def spawnvpe(argv: list[str], env: dict[str, str]) -> tuple[int | None, int]:
    """Spawn ``argv[0]`` found on the environment's PATH, in a session of its own with
    every signal at its default and none blocked, as the C library's execvpe would find
    it: ``(pid, 0)``, or ``(None, errno)`` if it cannot be run."""
    name = argv[0]
    if "/" in name:
        candidates = [name]
    else:
        path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        candidates = [f"{d or '.'}/{name}" for d in path.split(":")]
    error = errno.ENOENT
    for candidate in candidates:
        try:
            os.stat(candidate)  # a missing one costs a stat, not a failed spawn
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            pass
        try:
            return os.posix_spawn(
                candidate, argv, env, setsid=True, setsigdef=DEFAULT_SIGNALS, setsigmask=()
            ), 0
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                error = exc.errno or errno.EACCES  # remembered, as execvp does
    return None, error


def become(spec: Spec) -> None:
    """Leave the executor's root for the sandbox's user, for good (gVisor: a command init
    is forked by the executor, the container's root; the command must not share its uid,
    or it could signal it)."""
    drop_capabilities(spec["cap_last_cap"], bounding_only=True)  # needs CAP_SETPCAP: first
    uid = spec["uid"]
    if spec.get("nproc") is not None:  # the sandbox's pids limit (see _gvisor)
        resource.setrlimit(resource.RLIMIT_NPROC, (spec["nproc"], spec["nproc"]))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # clears the permitted and effective sets


def drop_capabilities(cap_last: int, *, bounding_only: bool = False) -> None:
    for cap in range(cap_last + 1):
        if LIBC.prctl(PR_CAPBSET_READ, ctypes.c_ulong(cap), 0, 0, 0) == 0:
            continue  # not in the set (dropped already, as become() does)
        failed = LIBC.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0
        if failed and ctypes.get_errno() != errno.EINVAL:  # EINVAL: the kernel lacks it
            raise SetupError(f"drop capability {cap}", ctypes.get_errno())
    if bounding_only:
        return
    LIBC.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two of {effective, permitted, inheritable}, all empty
    check(LIBC.capset(header, data), "drop capabilities")


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def load_seccomp(bpf: bytes) -> None:
    program = ctypes.create_string_buffer(bpf, len(bpf))
    prog = SockFprog(len(bpf) // 8, ctypes.addressof(program))
    check(
        LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0),
        "load the seccomp filter",
    )


def reap(*, usage: bool = False) -> tuple[int, float | None]:
    """Reap until the command exits; then kill what it left and return its status, and
    (``usage``) the CPU seconds of the command and of the children it waited for
    (``wait4``, whose result needs the ``resource`` module: the resident executor imports
    it before ``pivot_root``)."""
    pid, code, cpu = COMMAND[0], None, None
    while code is None:
        try:
            if usage:
                child, status, rusage = os.wait4(-1, 0)
            else:
                child, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return SETUP_FAILED, None  # cannot happen: the command is our child
        if child == pid:
            code = exit_code(status)
            if usage:
                cpu = rusage.ru_utime + rusage.ru_stime
    COMMAND[0] = 0
    # The command owns what it started: background jobs and daemons die with it.
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return code, cpu


def forward(signum: int, frame: object) -> None:
    if COMMAND[0]:
        try:
            os.kill(COMMAND[0], signum)
        except ProcessLookupError:
            pass
