"""The exit barrier: a command's output ends when its main process ends.

A command owns what it starts: when its main process exits, whatever it left running is
killed. Killing after the exit is not enough: between the main process's exit and the
kill, a process it left behind learns of the exit (its parent changes, a
``PR_SET_PDEATHSIG`` signal arrives, a pipe closes) and can still write, and on a second
CPU it wins that race about half the time. A program judged on its output would then
earn a verdict with an answer it printed after it ended (a reward hack).

So the command's main process is held at its exit system call, and the command killed
while it is held: the command's process installs, before it runs anything of the
command, a seccomp filter (its own, stacked on the sandbox's) that turns ``exit_group``
and ``exit`` into a user notification to a supervisor (:func:`install`). When the main
process asks to exit, nothing of the exit has happened yet: no process has been
reparented or signalled, no descriptor closed. The supervisor kills the command's process
group, the main process with it (the status it asked for is in the notice). The filter
keeps everything the command starts in that group and below the main process
(``setsid``, ``setpgid``, ``clone`` with ``CLONE_PARENT`` and unsetting the child
subreaper are refused), so one ``killpg`` kills it all at once, however many processes
it left.

The supervisor is the guard (:class:`Guard`): a process of its own, beside the judge's
runner (:mod:`asyncsandbox._judge._runner`), that does nothing but answer held exits, on
a short scheduler slice (:func:`hurry`), woken on the held process's own CPU. What is
still open is the moment between the main process's request and the guard's kill: a
process left behind that is running then can write. Measured on two cores, 16 cases 4 at
a time: a child that watched its main process enter ``exit_group`` and wrote 2 ms later
was accepted in 2-8 of 160 cases (20 of 80 when the runner answered exits between its
other work); one that wrote 0.2 s later, among 300 others (whose exits the kernel then
runs), in none of 128, beside 8 busy processes (``python -m bench.judge_races``).

Exits of the command's other processes and threads are notifications too; the
supervisor releases them at once (a thread's exit is the main process's end only when it
is the last thread: :func:`threads`). The command cannot slip out of the barrier: the
kernel lets one filter chain hold one listener only, so none of its processes can make a
listener of its own (``EBUSY``), and a filter of its own that fails or kills its exit
makes it die by a signal, never exit with a status. A main process that exits with a
status without having been held (which the above rules out) is reported killed by
``SIGSYS`` (:data:`HIDDEN_EXIT`), never with its own status.

(A plain ``exec`` kills what its command left after the exit, as every backend can: the
race above is open there. Verdicts are formed by the judge, whose runner closes it.)

This module is shipped into sandboxes as source, beside the programs that use it, and
runs on the sandbox's own ``python3`` (3.6 or newer: no newer syntax; standard library
only; nothing is imported that a supervisor does not use). On an architecture or kernel
without user notifications (Linux 5.5+ for what is used here) :func:`install` raises
:class:`OSError` and the supervisor falls back to killing after the exit.
"""

import _ctypes
import _socket
import errno
import fcntl
import os
import select
import struct
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any, Callable, Dict, Iterable, List, NoReturn, Optional, Set, Tuple
else:
    # signal's C module: the same calls and numbers, without the enums (whose import
    # costs each judgement's runner a few milliseconds of its start).
    import _signal as signal

__all__ = (
    "HIDDEN_EXIT",
    "Listener",
    "Notice",
    "install",
    "kill",
    "prctl",
    "processes",
    "subreaper",
    "thread_alive",
    "threads",
)

HIDDEN_EXIT = int(signal.SIGSYS)
"""The signal a main process that hid its exit from the barrier is reported killed by."""

# seccomp(2) and its user notifications (linux/seccomp.h).
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
PR_SET_NO_NEW_PRIVS = 38
NOTIF = struct.Struct("=QII" + "iIQ6Q")  # id, pid, flags; seccomp_data: nr, arch, ip, args
RESPONSE = struct.Struct("=QqiI")  # id, val, error, flags


def _iowr(number: int, size: int, direction: int = 3) -> int:
    return (direction << 30) | (size << 16) | (ord("!") << 8) | number


NOTIF_RECV = _iowr(0, NOTIF.size)
NOTIF_SET_FLAGS = _iowr(4, 8, direction=1)  # _IOW: Linux 6.6+
SYNC_WAKE_UP = 1
NOTIF_SEND = _iowr(1, RESPONSE.size)

X32 = 0x40000000
# machine: [(audit arch, {what: its calls})], the native ABI first, then the compatible
# ones the kernel also enters by (a filter that left one out would be bypassed by making
# the same call through it). x32 shares x86-64's audit arch, with a bit set in the number.
ABIS: "Dict[str, List[Tuple[int, Dict[str, Tuple[int, ...]]]]]" = {
    "x86_64": [
        (
            0xC000003E,
            {
                "exit": (60, 231, 60 | X32, 231 | X32),
                "prctl": (157, 157 | X32),
                "group": (109, 112, 109 | X32, 112 | X32),  # setpgid, setsid
                "clone": (56, 56 | X32),
                "clone3": (435, 435 | X32),
            },
        ),
        (
            0x40000003,
            {
                "exit": (1, 252),
                "prctl": (172,),
                "group": (57, 66),
                "clone": (120,),
                "clone3": (435,),
            },
        ),
    ],
    "aarch64": [
        (
            0xC00000B7,
            {
                "exit": (93, 94),
                "prctl": (167,),
                "group": (154, 157),
                "clone": (220,),
                "clone3": (435,),
            },
        ),
        (
            0x40000028,
            {
                "exit": (1, 248),
                "prctl": (172,),
                "group": (57, 66),
                "clone": (120,),
                "clone3": (435,),
            },
        ),
    ],
    "riscv64": [
        (
            0xC00000F3,
            {
                "exit": (93, 94),
                "prctl": (167,),
                "group": (154, 157),
                "clone": (220,),
                "clone3": (435,),
            },
        ),
    ],
}
GROUP_EXITS = {231, 231 | X32, 252, 94, 248}  # exit_group in each ABI; the rest are exit
SECCOMP = {"x86_64": 317, "aarch64": 277, "riscv64": 277}  # the seccomp call's number
SCHED_SETATTR = {"x86_64": 314, "aarch64": 274, "riscv64": 274}
SCHED_ATTR = struct.Struct("=IIQiIQQQ")  # size, policy, flags, nice, priority, runtime...

# Classic BPF, as seccomp runs it over struct seccomp_data (the call's number at offset 0,
# the arch at 4).
LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET = 0x06  # BPF_RET | BPF_K
SECCOMP_RET_ERRNO = 0x00050000
# struct seccomp_data: the call's number at offset 0, the arch at 4, then (after the
# instruction pointer) its arguments, 64 bits each, at 16, 24...: their low halves
# there, their high halves 4 bytes on (every machine here is little-endian).
NR, ARCH, ARG0, ARG1, ARG1_HIGH = 0, 4, 16, 24, 28
PR_SET_CHILD_SUBREAPER = 36
CLONE_PARENT = 0x8000


def _program(machine: str) -> bytes:
    """The filter: ``exit`` and ``exit_group`` notify. What the command starts cannot leave
    its process group (``setsid`` and ``setpgid`` fail with ``EPERM``) or the tree below
    its main process (``clone`` with ``CLONE_PARENT``, a sibling of the main process, and
    ``prctl(PR_SET_CHILD_SUBREAPER, 0)``, the main process letting go of its orphans, fail
    with ``EPERM``; ``clone3``, whose flags a filter cannot read, with ``ENOSYS``, which
    makes the C library fall back to ``clone``). All else is allowed (the sandbox's own
    filter still decides)."""
    abis = ABIS.get(machine)
    if abis is None:
        raise OSError(errno.ENOSYS, "no exit barrier on " + machine)
    # (code, k, label if true, label if false); a label is where an instruction jumps.
    code: List[Tuple[int, int, str, str]] = []
    labels: Dict[str, int] = {}
    for index, (arch, calls) in enumerate(abis):
        labels["abi%d" % index] = len(code)
        following = "abi%d" % (index + 1) if index + 1 < len(abis) else "allow"
        code.append((LD_ABS, ARCH, "", ""))
        code.append((JEQ, arch, "", following))
        code.append((LD_ABS, NR, "", ""))
        for what, label in (
            ("exit", "notify"),
            ("prctl", "prctl"),
            ("group", "eperm"),
            ("clone", "clone"),
            ("clone3", "enosys"),
        ):
            code.extend((JEQ, number, label, "") for number in calls[what])
        code.append((RET, SECCOMP_RET_ALLOW, "", ""))
    labels["prctl"] = len(code)  # PR_SET_CHILD_SUBREAPER with a zero (64-bit) value
    code.append((LD_ABS, ARG0, "", ""))
    code.append((JEQ, PR_SET_CHILD_SUBREAPER, "", "allow"))
    code.append((LD_ABS, ARG1, "", ""))
    code.append((JEQ, 0, "", "allow"))
    code.append((LD_ABS, ARG1_HIGH, "", ""))
    code.append((JEQ, 0, "eperm", "allow"))
    labels["clone"] = len(code)
    code.append((LD_ABS, ARG0, "", ""))  # the flags, on every ABI here
    code.append((JSET, CLONE_PARENT, "eperm", "allow"))
    for label, action in (
        ("allow", SECCOMP_RET_ALLOW),
        ("notify", SECCOMP_RET_USER_NOTIF),
        ("eperm", SECCOMP_RET_ERRNO | errno.EPERM),
        ("enosys", SECCOMP_RET_ERRNO | errno.ENOSYS),
    ):
        labels[label] = len(code)
        code.append((RET, action, "", ""))
    out = b""
    for i, (op, k, true, false) in enumerate(code):
        jt = labels[true] - i - 1 if true else 0
        jf = labels[false] - i - 1 if false else 0
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out


# The C library's calls, made with ctypes' C module: what ``ctypes.CDLL(None,
# use_errno=True).NAME`` makes, without importing ctypes (about 2.5 ms of CPU at each
# judgement's start, for these three calls).
class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "i"


class _Char(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "c"


class _Call(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Libc:
    """What a function of ``_Call((name, _Libc))`` is looked up in: the program and the
    libraries it loaded, the C library among them (``dlopen(NULL)``)."""

    _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type]


def _libc(name: str) -> "Callable[..., int]":
    call: Callable[..., int] = _Call((name, _Libc))  # type: ignore[arg-type]
    return call


def prctl(option: int, value: int) -> None:
    """``prctl(option, value, 0, 0, 0)``; raise :class:`OSError` if it fails."""
    if _libc("prctl")(option, value, 0, 0, 0) != 0:
        raise OSError(_ctypes.get_errno(), "prctl(%d)" % option)


def subreaper() -> None:
    """Become a child subreaper where the kernel can (gVisor's cannot: there a case's
    orphans go to the sandbox's init, and its process group, which the kill reaches all
    the same, is what holds them)."""
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass


def hurry(slice_seconds: float = 0.0001) -> bool:
    """Ask the scheduler for a short slice for the calling thread (Linux 6.12+: a fair
    task's ``sched_runtime``), so that a supervisor woken by a held exit runs at once, not
    once the task running on its CPU has used up its own slice (1.5 ms or more on a busy
    machine: time enough for what the command left behind to write). False where the
    kernel cannot."""
    number = SCHED_SETATTR.get(os.uname().machine)
    if number is None:
        return False
    attr = SCHED_ATTR.pack(
        SCHED_ATTR.size, 0, 0, os.getpriority(os.PRIO_PROCESS, 0), 0, int(slice_seconds * 1e9), 0, 0
    )
    return _libc("syscall")(number, 0, attr, 0) == 0


def install() -> int:
    """In the process that is to become the command (before anything of the command runs):
    set ``no_new_privs`` and install the barrier's filter on the calling thread (and so on
    every process and thread it starts from now on); return the listener's descriptor,
    which the supervisor must hold (pass it over a Unix socket) and this process must
    close. Raise :class:`OSError` where the kernel cannot (the supervisor then kills after
    the exit instead)."""
    insns = _program(os.uname().machine)
    buffer: Any = type("Filter", (_ctypes.Array,), {"_type_": _Char, "_length_": len(insns)})
    program: Any = buffer.from_buffer_copy(insns)  # held until the filter is installed
    fprog = struct.pack("=HxxxxxxQ", len(insns) // 8, _ctypes.addressof(program))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    number = SECCOMP[os.uname().machine]
    # fprog as a bytes object: passed as a pointer to its bytes, as ctypes.c_char_p does.
    fd = _libc("syscall")(number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, fprog)
    if fd < 0:
        raise OSError(_ctypes.get_errno(), "seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER)")
    return int(fd)


class Notice:
    """A thread (``tid``) held at ``exit`` or ``exit_group``."""

    __slots__ = ("group", "id", "status", "tid")

    def __init__(self, id: int, tid: int, group: bool, status: int) -> None:
        self.id = id
        self.tid = tid
        self.group = group
        """``exit_group``: the whole process ends (else one thread does)."""
        self.status = status & 0xFF
        """The status it asked to exit with."""

    def of(self, pid: int) -> bool:
        """Whether the thread is one of process ``pid``'s (its first thread, read from
        nothing: the case that has to be answered fastest)."""
        return self.tid == pid or thread_group(self.tid) == pid


class Listener:
    """The supervisor's end of a barrier: a descriptor that is readable when a process
    of the command is held at its exit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # A held process gives its CPU to the supervisor it wakes (it waits anyway): the
        # exit is answered at once, not when a CPU is free (Linux 6.6+; else as before).
        try:
            fcntl.ioctl(fd, NOTIF_SET_FLAGS, SYNC_WAKE_UP)
        except OSError:
            pass

    def fileno(self) -> int:
        return self.fd

    def receive(self) -> "Optional[Notice]":
        """The next process held at its exit; None if there was none after all (it was
        killed meanwhile) or the command has no process left."""
        buffer = bytearray(NOTIF.size)
        try:
            fcntl.ioctl(self.fd, NOTIF_RECV, buffer)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
                return None
            raise
        fields = NOTIF.unpack(buffer)
        return Notice(fields[0], fields[1], fields[3] in GROUP_EXITS, fields[6])

    def release(self, notice: Notice) -> None:
        """Let the held process exit."""
        response = RESPONSE.pack(notice.id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE)
        try:
            fcntl.ioctl(self.fd, NOTIF_SEND, bytearray(response))
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # killed while held: it is going anyway
                raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def thread_group(tid: int) -> int:
    """The process (thread group id) of thread ``tid``; 0 if it is gone."""
    try:
        with open("/proc/%d/status" % tid, "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def threads(pid: int) -> int:
    """How many threads of process ``pid`` have not ended (0: it is gone)."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    return sum(thread_alive(pid, int(tid)) for tid in tasks)


def thread_alive(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of process ``pid`` has not ended (a zombie has)."""
    try:
        with open("/proc/%d/task/%d/stat" % (pid, tid), "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] not in (b"Z", b"X")


def processes() -> "Dict[int, int]":
    """Every live process visible here (zombies left out), with its parent: pid -> ppid."""
    found: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Field 2 (the command) may hold spaces and parentheses; the state follows the
        # last ')', then the parent.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X"):
            found[int(name)] = int(fields[1])
    return found


def descendants(roots: "Iterable[int]", table: "Dict[int, int]") -> "Set[int]":
    """The processes of ``table`` (see :func:`processes`) below any of ``roots``."""
    children: Dict[int, List[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    found: Set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def kill(
    pick: "Callable[[Dict[int, int]], Iterable[int]]",
    within: float = 5.0,
) -> bool:
    """SIGKILL the processes ``pick`` picks from the live ones (:func:`processes`), again
    and again (what they forked meanwhile is picked next time), until it picks none that
    lives; False if some still lived after ``within`` seconds (a process the kernel keeps
    in an uninterruptible wait)."""
    deadline = time.monotonic() + within
    while True:
        targets = list(pick(processes()))
        if not targets:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        # A killed process is gone (or a zombie) within microseconds, unless the kernel
        # holds it: look again at once, then back off a little.
        time.sleep(0.0002)


# -- the guard: the supervisor of many commands ----------------------------------------

STARTED, UNGUARDED, ENDED, DONE = b"s", b"u", b"e", b"d"
NEWS = struct.Struct("=cidi")
"""What the guard tells the runner: (what, the pid of a case's main process, when, the
status it asked to exit with). ``STARTED``: its program starts now, behind the barrier;
``UNGUARDED``: the kernel has no barrier for it; ``ENDED``: its main process asked to
exit, and the case is killed now (said before the kill, so the runner hears it before it
reaps); ``DONE``: the guard read the runner's ``FINISH`` and ends (it said all it had to)."""
HANDSHAKE = struct.Struct("=ic")
"""A case's fork to the guard: its pid, then ``L`` (with the listener) or ``!`` (and why
it has none); or the runner's ``FINISH`` (pid 0), once every case ended."""
FINISH = b"F"
THREAD_GRACE = 1.0  # seconds a thread that was let go may take to be gone


class Guarded:
    """A case, as the guard sees it."""

    def __init__(self, pid: int, listener: "Listener") -> None:
        self.pid = pid
        self.listener = listener


class Guard:
    """Answers every exit the barrier holds, in a process of its own that does nothing
    else, so that a case's end is answered the moment its notice arrives, whatever the
    runner is doing (forking the next case, reading output): what the program left
    behind is killed before it can write. (The runner answering between its other work,
    a daemon that answered 1 ms after it saw its main process in ``exit_group`` was
    accepted in 20 of 80 cases, 4 at a time on two cores.)

    A case's end is answered with one system call: ``killpg`` of the case's process
    group, which nothing of the case can leave (the barrier's filter refuses ``setsid``
    and ``setpgid``: see :func:`install`). The main process goes with it, held at
    its exit: the status it asked to exit with is in the notice, and the runner reports
    that (told before the kill, so it knows before it reaps).

    Each case's fork sends the guard its pid and the listener of its barrier before the
    program starts (:func:`hand_over`); the guard tells the runner (:data:`NEWS`).
    It ends on the runner's ``FINISH``, once it has told all, or when the runner is gone
    (its end of the news socket closes)."""

    def __init__(self, handshakes: "Any", news: "Any") -> None:
        self.handshakes = handshakes
        self.news = news
        self.cases: Dict[int, Guarded] = {}  # by the fd of its listener

    def run(self) -> "NoReturn":
        hurry()
        self.handshakes.setblocking(False)
        while True:
            poller = select.poll()
            poller.register(self.handshakes, select.POLLIN)
            poller.register(self.news, 0)  # its hang-up: the runner is gone
            for fd in self.cases:
                poller.register(fd, select.POLLIN)
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            for fd, events in ready:
                case = self.cases.get(fd)
                if fd == self.news.fileno():
                    os._exit(0)
                elif fd == self.handshakes.fileno():
                    self.welcome()
                elif case is not None and events & select.POLLIN:
                    self.answer(case)
                elif case is not None:  # hung up: no process of the case is left to hold
                    self.forget(case)

    def welcome(self) -> None:
        """Take the listeners the cases' forks sent."""
        while True:
            try:
                said, ancillary, _, _ = self.handshakes.recvmsg(512, _socket.CMSG_SPACE(4))
            except BlockingIOError:
                return
            pid, kind = HANDSHAKE.unpack(said[: HANDSHAKE.size])
            fds = [
                struct.unpack("i", payload[:4])[0]
                for level, what, payload in ancillary
                if level == _socket.SOL_SOCKET and what == _socket.SCM_RIGHTS
            ]
            if kind == FINISH:  # after every case's word: nothing is left unsaid
                self.tell(DONE, 0)
                os._exit(0)
            elif kind == b"L" and fds:
                self.cases[fds[0]] = Guarded(pid, Listener(fds[0]))
                self.tell(STARTED, pid)
            else:
                self.tell(UNGUARDED, pid)

    def tell(self, what: bytes, pid: int, status: int = 0) -> None:
        self.news.sendall(NEWS.pack(what, pid, time.monotonic(), status))

    def answer(self, case: "Guarded") -> None:
        """A process of ``case`` is held at its exit: let it go at once, unless it is the
        case's end (its main process's last thread): then end the case."""
        notice = case.listener.receive()
        if notice is None:
            return
        if not notice.of(case.pid):
            case.listener.release(notice)  # at once: see the module docstring
            return
        if notice.group or threads(case.pid) <= 1:
            self.tell(ENDED, case.pid, notice.status)
            kill_group(case.pid)
            self.forget(case)  # what was killed exits without asking
            return
        # One thread of several: the program goes on. Wait until the thread is gone, so
        # that the next thread's exit sees the true number of threads left.
        case.listener.release(notice)
        deadline = time.monotonic() + THREAD_GRACE
        while thread_alive(case.pid, notice.tid) and time.monotonic() < deadline:
            time.sleep(0.0001)

    def forget(self, case: "Guarded") -> None:
        del self.cases[case.listener.fileno()]
        case.listener.close()


def kill_group(pgid: int) -> None:
    """SIGKILL a case's process group, its processes made the least of the CPU's claims
    first: each one killed still has its exit to run (its memory to free, about 0.3 ms
    here for a fork of a Python program), and a program that left a hundred would
    otherwise have those exits take the CPUs from the guard for tens of milliseconds,
    the time another case's leftovers need to answer after it ended."""
    try:
        os.setpriority(os.PRIO_PGRP, pgid, 19)
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def hand_over(sock: "Any") -> None:
    """In a command's process, before anything of the command runs: install the barrier,
    and send the guard (over ``sock``, a datagram socket) its pid and the barrier's
    listener (or, where the kernel has none, why not)."""
    me = os.getpid()
    try:
        fd = install()
    except OSError as exc:
        sock.send(HANDSHAKE.pack(me, b"!") + ("%s" % exc).encode(errors="replace")[:400])
        return
    rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", fd))]
    sock.sendmsg([HANDSHAKE.pack(me, b"L")], rights)
    os.close(fd)
