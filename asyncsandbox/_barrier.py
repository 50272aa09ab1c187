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

The supervisor is the guard (:class:`asyncsandbox._judge._guard.Guard`): a process of its own, beside the judge's
runner (:mod:`asyncsandbox._judge._runner`), that does nothing but answer held exits, on
a short scheduler slice (:func:`hurry`), woken on the held process's own CPU. Still, it
answers when the scheduler lets it: a process left behind that runs between the main
process's request and the guard's kill can write. Measured on two cores, 16 cases 4 at a
time, when a case's output was whatever it held once it ended: a child that watched its
main process enter ``exit_group`` and wrote at once was accepted in 6-8 of 80 cases; 2 ms
later, 2-8 of 160; 50 ms later, beside the whole test suite, 14 of 480; and CI once saw
one write 0.2 s later counted (``python -m bench.judge_races``). No guard answers in a
bounded time on a loaded machine, so what closes this is order, not speed:

* The exits reach the guard in the order they were asked for (one listener per command,
  first in first out). A process whose own exit (``exit_group``, or its last thread's
  ``exit``) comes before the main process's ended before the main process asked to exit
  (:data:`asyncsandbox._judge._guard.EXITED`); any other process of the command was still running then, or died by
  a signal, at a moment nobody can place.
* The command's stdout tells who wrote each part (the judge's runner gives it a Unix
  socket, whose receiver learns each sender's pid from the kernel). Its output is what
  its main process wrote and what the processes that ended before it wrote; whatever a
  process still running wrote, early or late, does not count. So no process left behind
  can add to the answer, however late the guard is.

What order cannot place is a thread. A thread of the main process that writes while the
main process is held counts as the main process: it is the program itself, alive, and
the command's measured time runs until the kill. A thread of another process that asked
to exit before the main process did, writing while that exit is held (or before the
kernel has stopped it), counts as that process, which ended before the main one: if the
main process asks to exit meanwhile, that write can come after it, by as much as the
guard's delay (an open window; order cannot close it without ordering every write).
That delay is the scheduler's only: the filter keeps the guard, the runner and their
process group out of the command's reach (it cannot stop, starve or pin them:
:func:`program`), and the guard never waits for anything of a command.

Exits of the command's other processes and threads are notifications too; the
supervisor releases them at once (a thread's exit is the main process's end only when it
is the last thread: :func:`live_threads`). The command cannot slip out of the barrier: the
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
import errno
import fcntl
import os
import struct
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple
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
    "live_threads",
    "prctl",
    "processes",
    "program",
    "subreaper",
    "thread_alive",
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
# the same call through it). x32 shares x86-64's audit arch, with a bit set in the number
# (and numbers of its own, from 512 on, for the calls whose arguments differ).
# "reach0" and "reach1": calls whose first (second) argument names a process (or a process
# group, or -1: every process it may signal); "reach01": both. "priority": setpriority.
GENERIC: "Dict[str, Tuple[int, ...]]" = {  # asm-generic's numbers: aarch64, riscv64
    "exit": (93, 94),
    "prctl": (167,),
    "group": (154, 157),
    "clone": (220,),
    "clone3": (435,),
    "reach0": (129, 130, 138, 118, 119, 122, 274, 261, 434),
    "reach01": (131, 240),
    "reach1": (117,),
    "priority": (140,),
    "fcntl": (25,),
    "signal": (424,),
}
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
                # kill, tkill, rt_sigqueueinfo, sched_setparam, sched_setscheduler,
                # sched_setaffinity, sched_setattr, prlimit64, pidfd_open
                "reach0": (
                    *(62, 200, 129, 142, 144, 203, 314, 302, 434),
                    *(62 | X32, 200 | X32, 524 | X32, 142 | X32, 144 | X32),
                    *(203 | X32, 314 | X32, 302 | X32, 434 | X32),
                ),
                "reach01": (234, 234 | X32, 297, 536 | X32),  # tgkill, rt_tgsigqueueinfo
                "reach1": (101, 521 | X32),  # ptrace
                "priority": (141, 141 | X32),
                "fcntl": (72, 72 | X32),
                "signal": (424, 424 | X32),  # pidfd_send_signal
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
                "reach0": (37, 238, 178, 154, 156, 241, 351, 340, 434),
                "reach01": (270, 335),
                "reach1": (26,),
                "priority": (97,),
                "fcntl": (55, 221),
                "signal": (424,),
            },
        ),
    ],
    "aarch64": [
        (
            0xC00000B7,
            GENERIC,
        ),
        (
            0x40000028,
            {
                "exit": (1, 248),
                "prctl": (172,),
                "group": (57, 66),
                "clone": (120,),
                "clone3": (435,),
                "reach0": (37, 238, 178, 154, 156, 241, 380, 369, 434),
                "reach01": (268, 363),
                "reach1": (26,),
                "priority": (97,),
                "fcntl": (55, 221),
                "signal": (424,),
            },
        ),
    ],
    "riscv64": [
        (
            0xC00000F3,
            GENERIC,
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
PRIO_USER = 2
F_SETSIG = 10


def program(machine: str, protected: "Iterable[int]" = ()) -> bytes:
    """The filter: ``exit`` and ``exit_group`` notify. What the command starts cannot leave
    its process group (``setsid`` and ``setpgid`` fail with ``EPERM``) or the tree below
    its main process (``clone`` with ``CLONE_PARENT``, a sibling of the main process, and
    ``prctl(PR_SET_CHILD_SUBREAPER, 0)``, the main process letting go of its orphans, fail
    with ``EPERM``; ``clone3``, whose flags a filter cannot read, with ``ENOSYS``, which
    makes the C library fall back to ``clone``).

    Nor can it reach the processes that answer for it (``protected``: their pids, and
    their process group): signalling them (``kill``, ``tkill``, ``tgkill``, the
    ``sigqueue`` calls, ``kill(-1)`` and ``kill(-GROUP)``, ``pidfd_open`` of them), slowing
    them (``setpriority``, ``sched_setaffinity``, ``sched_setscheduler``,
    ``sched_setparam``, ``sched_setattr``, ``prlimit``) and tracing them fail with
    ``EPERM``. A stopped or starved guard would leave a held exit unanswered while what
    the command left behind writes. So do what reaches them without naming them:
    ``setpriority`` of every process of the user, ``pidfd_send_signal`` (whose pidfd may
    be a ``/proc`` directory) and ``fcntl(F_SETSIG)`` (a chosen signal on a descriptor's
    I/O, sent to its owner). All else is allowed (the sandbox's own filter still
    decides)."""
    abis = ABIS.get(machine)
    if abis is None:
        raise OSError(errno.ENOSYS, "no exit barrier on " + machine)
    targets = sorted({pid & 0xFFFFFFFF for p in protected for pid in (p, -p)} | {0xFFFFFFFF})
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
            ("reach0", "reach0"),
            ("reach01", "reach01"),
            ("reach1", "reach1"),
            ("priority", "priority"),
            ("fcntl", "fcntl"),
            ("signal", "eperm"),
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
    labels["fcntl"] = len(code)
    code.append((LD_ABS, ARG1, "", ""))  # the command
    code.append((JEQ, F_SETSIG, "eperm", "allow"))
    labels["priority"] = len(code)
    code.append((LD_ABS, ARG0, "", ""))  # which: a process, a group (then who), a user
    code.append((JEQ, PRIO_USER, "eperm", "reach1"))
    # A pid or group argument is an int: the kernel reads the low half of the register.
    labels["reach0"] = len(code)
    code.append((LD_ABS, ARG0, "", ""))
    code.extend((JEQ, target, "eperm", "") for target in targets)
    code.append((RET, SECCOMP_RET_ALLOW, "", ""))
    labels["reach01"] = len(code)
    code.append((LD_ABS, ARG0, "", ""))
    code.extend((JEQ, target, "eperm", "") for target in targets)
    labels["reach1"] = len(code)
    code.append((LD_ABS, ARG1, "", ""))
    code.extend((JEQ, target, "eperm", "") for target in targets)
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
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise OSError(errno.E2BIG, "the exit barrier's filter: a jump too far")
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


def install(insns: bytes) -> int:
    """In the process that is to become the command (before anything of the command runs):
    set ``no_new_privs`` and install the barrier's filter (``insns``, from :func:`program`)
    on the calling thread (and so on every process and thread it starts from now on);
    return the listener's descriptor, which the supervisor must hold (pass it over a Unix
    socket) and this process must close. Raise :class:`OSError` where the kernel cannot
    (the supervisor then kills after the exit instead)."""
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

    def process(self, main: int) -> int:
        """The process the thread is one of (its thread group); 0 if it is gone. Read from
        nothing for ``main``'s first thread: the case that has to be answered fastest."""
        return main if self.tid == main else thread_group(self.tid)


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


def live_threads(pid: int) -> "Set[int]":
    """The threads of process ``pid`` that have not ended (none: it is gone)."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return set()
    return {int(tid) for tid in tasks if thread_alive(pid, int(tid))}


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
