"""The sandbox's resident executor: the init of a process sandbox that stays, and runs the
commands the backend sends over a control socket (see :func:`serve`); each command runs in
PID and mount namespaces of its own (and so with its own ``/proc``) inside the sandbox's,
under an init of its own, so that it never sees the executor nor other commands, is never
PID 1, and dies whole with its init; an init whose namespace is empty again runs the
sandbox's next command.

Shipped after the launcher (``_launcher.py``), which is its global ``launcher``, by the
same boot code (``_isolation.BOOT``; ``_gvisor.BOOT`` in a gVisor sandbox), and only for a
sandbox's executor: :func:`main` starts the launcher with :func:`serve`, the launcher and
init build the sandbox as for one command, then init serves. Imported here, before the
filesystem is switched: afterwards the interpreter's own library is out of reach.
"""

from __future__ import annotations

import _socket
import ctypes
import marshal
import os
import resource
import select
import struct

TYPE_CHECKING = False  # not typing's: importing typing would cost milliseconds per start
if TYPE_CHECKING:
    import signal
    from typing import Any, NoReturn

    from asyncsandbox._process import _launcher as launcher  # shipped before this file

    Spec = dict[str, Any]
else:
    import _signal as signal  # signal.py imports enum


def main(spec: Spec) -> NoReturn:
    """The sandbox built as the launcher builds it for one command; then its init serves."""
    launcher.main(spec, serve)


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
    launcher.prctl(launcher.PR_SET_DUMPABLE, 0, "make the executor undumpable")
    control = _socket.socket(fileno=control_fd)
    os.set_inheritable(control_fd, False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    for signum in launcher.FORWARDED:
        signal.signal(signum, signal.SIG_IGN)
    # Ready: the backend reads this marker; our own stdio is done with.
    os.write(2, launcher.STARTED)
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
            raise launcher.SetupError(
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
            launcher.check(
                launcher.LIBC.setns(own_pid_ns, launcher.CLONE_NEWPID),
                "return to the sandbox's PID namespace",
            )
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
                            answer({"id": init.request, "exit": launcher.exit_code(status)})
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
                except (OSError, launcher.SetupError) as exc:
                    answer({"id": request["id"], "error": str(exc)})
                else:
                    answer({"id": request["id"], "exit": 0})
                continue
            try:
                run(request, fds)
            except (OSError, launcher.SetupError) as exc:
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
    flags = launcher.CLONE_NEWIPC | (launcher.CLONE_NEWNET if own_network else 0)
    launcher.check(launcher.LIBC.unshare(flags), "create fresh IPC and network namespaces")
    # gVisor's kernel makes a network namespace with its loopback up (and answers the
    # interface ioctls there with ENOTTY: runsc 20221219).
    if own_network and not spec.get("gvisor"):
        launcher.loopback_up()
    launcher.check(launcher.LIBC.umount2(b"/dev/shm", launcher.MNT_DETACH), "detach /dev/shm")
    launcher.mount(
        "tmpfs",
        "/dev/shm",
        "tmpfs",
        launcher.MS_NOSUID | launcher.MS_NODEV,
        f"mode=1777,size={spec['shm_size']}",
    )


def fork_command(
    spec: Spec, request: dict[str, Any], fds: list[int], ours: tuple[int, ...]
) -> tuple[int, Any]:
    """Fork a command init, in a fresh PID namespace, to run this command first; return
    its pid and our end of its channel."""
    launcher.check(
        launcher.LIBC.unshare(launcher.CLONE_NEWPID), "create the command's PID namespace"
    )
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
        launcher.failed(exc)


def command_init(spec: Spec, request: dict[str, Any], fds: list[int], channel: Any) -> NoReturn:
    """PID 1 of a command's namespaces, with its own ``/proc``: run the command, then,
    once nothing of it is left, tell its status on ``channel`` and wait there for the next
    (an end of file: exit)."""
    install(fds)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for signum in launcher.FORWARDED:
        signal.signal(signum, launcher.forward)
    if spec.get("gvisor"):
        # gVisor's mount namespaces are the sandbox's (unshare(CLONE_NEWNS) changes
        # nothing there): the command sees the sandbox's /proc (gVisor's, holding only the
        # sandbox's processes), and is kept from the executor by its uid instead.
        launcher.become(spec)
    else:
        launcher.check(
            launcher.LIBC.unshare(launcher.CLONE_NEWNS), "create the command's mount namespace"
        )
        launcher.mount(None, "/", None, launcher.MS_REC | launcher.MS_PRIVATE)
        launcher.mount(
            "proc", "/proc", "proc", launcher.MS_NOSUID | launcher.MS_NODEV | launcher.MS_NOEXEC
        )
        launcher.remount(
            "/proc",
            launcher.MS_RDONLY | launcher.MS_NOSUID | launcher.MS_NODEV | launcher.MS_NOEXEC,
        )
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    launcher.shed(spec)
    pristine = scheduling(), limits()
    while True:
        code, cpu = launcher.launch({**spec, **request}), None
        if code is None:
            code, cpu = launcher.reap(usage=True)  # the namespace holds no process but us now
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
    number = launcher.SYS_IOPRIO_GET.get(launcher.MACHINE)
    io = None if number is None else launcher.LIBC.syscall(number, launcher.IOPRIO_WHO_PROCESS, 0)
    number = launcher.SYS_SCHED_GETATTR.get(launcher.MACHINE)
    attr = None
    if number is not None:
        buffer = ctypes.create_string_buffer(launcher.SCHED_ATTR_SIZE)
        if launcher.LIBC.syscall(number, 0, buffer, launcher.SCHED_ATTR_SIZE, 0) == 0:
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
