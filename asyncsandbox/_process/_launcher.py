"""asyncsandbox's own launcher: runs one command in fresh Linux namespaces, with the same
guarantees as the bubblewrap mechanism, using nothing but Python's standard library.

Never imported by the package: the backend compiles this file once and runs it in a fresh
interpreter of its own (``python -I -S -B -c BOOT FD``, see ``_isolation.Native``), which
reads the compiled module and the spec (one dict) from ``FD`` and calls :func:`main`, with
the command's stdin, stdout and stderr as fd 0, 1, 2.

With ``"serve"`` in the spec, init does not run one command: it stays, as the sandbox's
resident executor, and runs the commands the backend sends over a control socket (see
:func:`serve`); each command runs in PID and mount namespaces of its own (and so with its
own ``/proc``) inside the sandbox's, under an init of its own, so that it never sees the
executor nor other commands, is never PID 1, and dies whole with its init; an init whose
namespace is empty again runs the sandbox's next command.

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
import marshal
import os
import struct

TYPE_CHECKING = False  # not typing's: importing typing would cost milliseconds per command
if TYPE_CHECKING:
    import signal
    from typing import Any, NoReturn

    Spec = dict[str, Any]
else:
    import _signal as signal  # signal.py imports enum

LIBC = ctypes.CDLL(None, use_errno=True)

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


def main(spec: Spec) -> NoReturn:
    try:
        if spec.get("gvisor"):
            contained(spec)  # never returns
        launcher(spec)
    except BaseException as exc:  # noqa: BLE001 - report, never a traceback on stderr
        failed(exc)
    os._exit(SETUP_FAILED)


def launcher(spec: Spec) -> None:
    if spec.get("serve") is not None:
        # Imported now: after pivot_root the interpreter's library is out of reach.
        global resource, select
        import resource
        import select
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
        init(spec)  # never returns
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
    _, status = os.waitpid(pid, 0)
    os._exit(exit_code(status))


def exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def contained(spec: Spec) -> NoReturn:
    """The resident executor in a gVisor sandbox (``_gvisor.py``): runsc has built the view,
    the namespaces and the network; we are the container's first process (PID 1), its root
    (with the capabilities to give each command a PID namespace and to become the sandbox's
    user in it), behind gVisor's kernel, and the control socket is our stdin."""
    global resource, select
    import resource
    import select

    for signum in FORWARDED:
        signal.signal(signum, forward)
    control = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)  # 0 becomes /dev/null in serve()
    serve(spec, control)


# -- init (PID 1) ------------------------------------------------------------------------


def init(spec: Spec) -> NoReturn:
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
    (``wait4``, whose result needs the ``resource`` module: the executor imports it
    before ``pivot_root``)."""
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


# -- the resident executor (serve mode) ----------------------------------------------------

select: Any = None  # imported by the launcher in serve mode only
resource: Any = None  # likewise (and by contained(), gVisor)


KEEP_IDLE = 4  # command inits kept, idle, for the sandbox's next commands


class CommandInit:
    """The executor's handle on one command init: PID 1 of a PID namespace of its own,
    which runs one command at a time and, once the namespace is empty again, the next one
    it is handed."""

    __slots__ = ("channel", "doomed", "pid", "request")

    def __init__(self, pid: int, channel: Any, request: int) -> None:
        self.pid = pid
        self.channel = channel  # our end of its socket pair; None once closed
        self.request: int | None = request  # the request it runs; None while idle
        self.doomed = False  # killed (or being): never handed another command

    @property
    def idle(self) -> bool:
        return self.request is None and not self.doomed and self.channel is not None

    def kill(self) -> None:
        self.doomed = True
        try:
            os.kill(self.pid, signal.SIGKILL)  # the whole command: its namespace dies
        except ProcessLookupError:
            pass


def serve(spec: Spec, control_fd: int) -> NoReturn:
    """Run commands sent by the backend until it goes away.

    Requests (marshal, one per SOCK_SEQPACKET record): ``{"op": "run", "id", "argv",
    "env", "cwd"}`` with the command's stdin, stdout and stderr attached (SCM_RIGHTS);
    ``{"op": "kill", "id"}``; ``{"op": "reset", "id"}`` (see :func:`reset`: answered
    ``{"id", "exit": 0}`` once done). Answers: ``{"id", "exit": status, "cpu": seconds}``
    (``cpu``: what its init's ``wait4`` said, None if it never ran) once a command's
    namespace is empty (its init says so on its channel, so the answer never waits for a
    namespace to be torn down; an init that dies without saying it is answered for when it
    is reaped), or ``{"id", "error": message}`` if it could not be handed to an init. A
    command's own setup failures speak the stderr protocol (before :data:`STARTED`).

    Each command runs under a command init (:func:`command_init`) of its own PID and mount
    namespaces. An init whose command ended, and whose namespace is empty again, waits for
    the next command (up to :data:`KEEP_IDLE` of them do): a command then costs a message to
    it and a ``posix_spawn``, not a copy of this interpreter and a new namespace.
    When the backend closes the socket (or dies), every command is killed and we exit.
    """
    prctl(PR_SET_DUMPABLE, 0, "make the executor undumpable")
    control = _socket.socket(fileno=control_fd)
    os.set_inheritable(control_fd, False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_IGN)
    # Ready: the backend reads this marker; our own stdio is done with.
    os.write(2, STARTED)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    # Our own PID namespace: each command's namespace is made by unshare(), which then
    # leaves pid_ns_for_children pointing at it; setns() back to ours before the next one
    # (the kernel refuses a second unshare otherwise).
    # (gVisor has no setns(), and needs none: there, unshare() always makes the new PID
    # namespace a child of the caller's own.)
    contained = bool(spec.get("gvisor"))
    own_pid_ns = -1 if contained else os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    inits: dict[int, CommandInit] = {}  # by pid, until reaped
    channels: dict[int, CommandInit] = {}  # by the descriptor of their channel, while open
    poller = select.poll()
    poller.register(control_fd, select.POLLIN)
    poller.register(wake_r, select.POLLIN)

    def answer(message: dict[str, Any]) -> None:
        try:
            control.send(marshal.dumps(message))
        except OSError:
            shut_down()

    def shut_down() -> NoReturn:
        for init in inits.values():
            init.kill()
        os._exit(0)  # we are PID 1: every process of the sandbox dies with us

    def close_channel(init: CommandInit) -> None:
        if init.channel is not None:
            fd = init.channel.fileno()
            poller.unregister(fd)
            del channels[fd]
            init.channel.close()
            init.channel = None

    def ended(init: CommandInit, said: bytes) -> None:
        if init.request is not None:
            code, cpu = map(int, said.split())
            answer({"id": init.request, "exit": code, "cpu": None if cpu < 0 else cpu / 1e6})
            init.request = None
        if init.idle and sum(i.idle for i in inits.values()) > KEEP_IDLE:
            init.kill()

    def run(request: dict[str, Any], fds: list[int]) -> None:
        if len(fds) != 3:
            raise SetupError(
                f"a command needs stdin, stdout and stderr, got {len(fds)} descriptors"
            )
        for init in inits.values():
            if init.idle:
                try:
                    send_fds(init.channel, marshal.dumps(request), fds)
                except OSError:  # it died meanwhile: answered for once reaped
                    init.kill()
                    continue
                init.request = request["id"]
                return
        if not contained:
            check(LIBC.setns(own_pid_ns, CLONE_NEWPID), "return to the sandbox's PID namespace")
        ours = (control_fd, wake_r, wake_w, *([] if contained else [own_pid_ns]), *channels)
        pid, channel = fork_command(spec, request, fds, ours)
        init = inits[pid] = CommandInit(pid, channel, request["id"])
        channels[channel.fileno()] = init
        poller.register(channel.fileno(), select.POLLIN)

    while True:
        try:
            ready = poller.poll()
        except InterruptedError:
            continue
        for fd, _ in ready:
            if fd == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    init = inits.pop(pid, None)
                    if init is not None:
                        close_channel(init)
                        if init.request is not None:
                            answer({"id": init.request, "exit": exit_code(status)})
                continue
            if fd != control_fd:
                init = channels.get(fd)  # None: closed since poll() said it was ready
                if init is not None:
                    try:
                        said = init.channel.recv(64, _socket.MSG_DONTWAIT)
                    except BlockingIOError:  # a new channel that took a closed one's number
                        continue
                    except OSError:
                        said = b""
                    if said:
                        ended(init, said)
                    else:  # it died: answered for once reaped
                        close_channel(init)
                continue
            try:
                data, fds = recv_fds(control)
            except OSError:
                shut_down()
            if not data:
                shut_down()
            request = marshal.loads(data)
            if request["op"] == "kill":
                for init in inits.values():
                    if init.request == request["id"]:
                        init.kill()
                continue
            if request["op"] == "reset":
                for pid, init in list(inits.items()):
                    init.kill()
                    os.waitpid(pid, 0)  # it is PID 1 of its namespace: all in it died too
                    del inits[pid]
                    close_channel(init)
                    if init.request is not None:
                        answer({"id": init.request, "exit": 128 + signal.SIGKILL})
                try:
                    reset(spec)
                except (OSError, SetupError) as exc:
                    answer({"id": request["id"], "error": str(exc)})
                else:
                    answer({"id": request["id"], "exit": 0})
                continue
            try:
                run(request, fds)
            except (OSError, SetupError) as exc:
                answer({"id": request["id"], "error": str(exc)})
            finally:
                for fd in fds:
                    os.close(fd)


def reset(spec: Spec) -> None:
    """Give the sandbox's next commands what a fresh executor would (its commands are all
    gone already): a new IPC namespace (System V objects and POSIX message queues of the
    old one die with it), a new network namespace with its loopback up, as at the start,
    where the sandbox has one of its own (what outlives a command there: its traffic
    counters in ``/proc/net``, its TCP connections in TIME_WAIT; the old namespace dies
    with the last of them), and an empty ``/dev/shm``. Its files are the backend's to
    restore; nothing else of it can a command change (no capability, so no host name, no
    route, no sysctl; no mount, no ``setns``, no keyring)."""
    own_network = spec["network"] == "none"
    flags = CLONE_NEWIPC | (CLONE_NEWNET if own_network else 0)
    check(LIBC.unshare(flags), "create fresh IPC and network namespaces")
    # gVisor's kernel makes a network namespace with its loopback up (and answers the
    # interface ioctls there with ENOTTY: runsc 20221219).
    if own_network and not spec.get("gvisor"):
        loopback_up()
    check(LIBC.umount2(b"/dev/shm", MNT_DETACH), "detach /dev/shm")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={spec['shm_size']}")


def fork_command(
    spec: Spec, request: dict[str, Any], fds: list[int], ours: tuple[int, ...]
) -> tuple[int, Any]:
    """Fork a command init, in a fresh PID namespace, to run this command first; return
    its pid and our end of its channel."""
    check(LIBC.unshare(CLONE_NEWPID), "create the command's PID namespace")
    channel, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)  # close-on-exec
    try:
        pid = os.fork()
    except BaseException:
        channel.close()
        theirs.close()
        raise
    if pid:
        theirs.close()
        return pid, channel
    try:
        signal.set_wakeup_fd(-1)
        for fd in ours:
            os.close(fd)
        channel.close()
        command_init(spec, request, fds, theirs)
    except BaseException as exc:  # noqa: BLE001 - anything here means "not started"
        failed(exc)


def command_init(spec: Spec, request: dict[str, Any], fds: list[int], channel: Any) -> NoReturn:
    """PID 1 of a command's namespaces, with its own ``/proc``: run the command, then,
    once nothing of it is left, tell its status on ``channel`` and wait there for the next
    (an end of file: exit)."""
    install(fds)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for signum in FORWARDED:
        signal.signal(signum, forward)
    if spec.get("gvisor"):
        # gVisor's mount namespaces are the sandbox's (unshare(CLONE_NEWNS) changes
        # nothing there): the command sees the sandbox's /proc (gVisor's, holding only the
        # sandbox's processes), and is kept from the executor by its uid instead.
        become(spec)
    else:
        check(LIBC.unshare(CLONE_NEWNS), "create the command's mount namespace")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        remount("/proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    shed(spec)
    pristine = scheduling(), limits()
    while True:
        code, cpu = launch({**spec, **request}), None
        if code is None:
            code, cpu = reap(usage=True)  # the namespace holds no process but us now
        for fd in (0, 1, 2):  # the command's pipes: at their end once we let go of them
            os.dup2(null, fd)
        if (scheduling(), limits()) != pristine:  # the command meddled with us (reniced us,
            os._exit(code)  # lowered our limits): the next command would inherit it
        try:  # its status, and its CPU time in microseconds (-1: it never ran)
            channel.send(b"%d %d" % (code, -1 if cpu is None else round(cpu * 1e6)))
            data, fds = recv_fds(channel)
        except OSError:
            os._exit(0)  # the executor is gone; so are we, in a moment
        if not data:
            os._exit(0)
        request = marshal.loads(data)
        install(fds)


def scheduling() -> tuple[object, ...]:
    """How the kernel schedules us: what a process of the same user may change for us
    without any capability or access to our memory (niceness, policy, CPUs, I/O
    priority, the rest of ``sched_attr``: a fair task's time slice, Linux 6.12+), and a
    command would inherit from us."""
    number = SYS_IOPRIO_GET.get(MACHINE)
    io = None if number is None else LIBC.syscall(number, IOPRIO_WHO_PROCESS, 0)
    number = SYS_SCHED_GETATTR.get(MACHINE)
    attr = None
    if number is not None:
        buffer = ctypes.create_string_buffer(SCHED_ATTR_SIZE)
        if LIBC.syscall(number, 0, buffer, SCHED_ATTR_SIZE, 0) == 0:
            attr = buffer.raw
    return (
        os.getpriority(os.PRIO_PROCESS, 0),
        os.sched_getscheduler(0),
        os.sched_getaffinity(0),
        io,
        attr,
    )


def limits() -> tuple[tuple[int, int], ...]:
    """Our resource limits, every one the kernel has: a process of the same user may lower
    them (``prlimit``: no capability, nor access to our memory, needed), and a command
    inherits them from us."""
    return tuple(resource.getrlimit(number) for number in range(RLIM_NLIMITS))


RLIM_NLIMITS = 16
"""How many resource limits Linux has (numbered from 0, on every architecture)."""


def send_fds(sock: Any, data: bytes, fds: list[int]) -> None:
    """Send one message with descriptors (``socket.send_fds``, whose module costs every
    executor milliseconds to import)."""
    rights = struct.pack(f"{len(fds)}i", *fds)
    sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])


def recv_fds(sock: Any) -> tuple[bytes, list[int]]:
    """One message and the descriptors that came with it: three at most (any more are
    never installed: the kernel drops what does not fit)."""
    data, ancillary, _, _ = sock.recvmsg(1 << 20, _socket.CMSG_SPACE(3 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
    return data, fds


def install(fds: list[int]) -> None:
    """Make ``fds`` our stdin, stdout and stderr (the command's, once spawned)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
