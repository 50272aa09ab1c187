"""The exit barrier: a command's output ends when its main process ends.

A command owns what it starts: when its main process exits, whatever it left running is
killed. Killing after the exit is not enough: between the main process's exit and the
kill, a process it left behind learns of the exit (its parent changes, a
``PR_SET_PDEATHSIG`` signal arrives, a pipe closes) and can still write, and on a second
CPU it wins that race about half the time. A program judged on its output would then
earn a verdict with an answer it printed after it ended (a reward hack).

So the supervisor of a command (the judge's runner, :mod:`asyncsandbox._judge._runner`,
for every test case) holds the main process at its exit system call until every other
process of the command is dead: the command's process installs, before it runs
anything of the command, a seccomp filter (its own, stacked on the sandbox's) that turns
``exit_group`` and ``exit`` into a user notification to the supervisor (:func:`install`).
When the main process asks to exit, nothing of the exit has happened yet: no process has
been reparented or signalled, no descriptor closed. The supervisor kills every other
process of the command (:func:`kill`), then lets the exit proceed (:meth:`Listener.release`).
Everything in the command's pipes was then written before its main process ended.

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
    "prctl",
    "processes",
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


def _iowr(number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | number


NOTIF_RECV = _iowr(0, NOTIF.size)
NOTIF_SEND = _iowr(1, RESPONSE.size)

X32 = 0x40000000
# machine: [(audit arch, its exit calls)], the native ABI first, then the compatible ones
# the kernel also enters by (a filter that left one out would be bypassed by making the
# same call through it). x32 shares x86-64's audit arch, with a bit set in the number.
ABIS: "Dict[str, List[Tuple[int, Tuple[int, ...]]]]" = {
    "x86_64": [(0xC000003E, (60, 231, 60 | X32, 231 | X32)), (0x40000003, (1, 252))],
    "aarch64": [(0xC00000B7, (93, 94)), (0x40000028, (1, 248))],
    "riscv64": [(0xC00000F3, (93, 94))],
}
GROUP_EXITS = {231, 231 | X32, 252, 94, 248}  # exit_group in each ABI; the rest are exit
SECCOMP = {"x86_64": 317, "aarch64": 277, "riscv64": 277}  # the seccomp call's number

# Classic BPF, as seccomp runs it over struct seccomp_data (the call's number at offset 0,
# the arch at 4).
LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
RET = 0x06  # BPF_RET | BPF_K


def _program(machine: str) -> bytes:
    """The filter: ``exit`` and ``exit_group`` notify; all else is allowed (the sandbox's
    own filter still decides)."""
    abis = ABIS.get(machine)
    if abis is None:
        raise OSError(errno.ENOSYS, "no exit barrier on " + machine)
    # (code, k, label if true, label if false); a label is where an instruction jumps.
    code: List[Tuple[int, int, str, str]] = []
    labels: Dict[str, int] = {}
    for index, (arch, exits) in enumerate(abis):
        labels["abi%d" % index] = len(code)
        following = "abi%d" % (index + 1) if index + 1 < len(abis) else "allow"
        code.append((LD_ABS, 4, "", ""))  # the arch
        code.append((JEQ, arch, "", following))
        code.append((LD_ABS, 0, "", ""))  # the call's number
        code.extend((JEQ, number, "notify", "") for number in exits)
        code.append((RET, SECCOMP_RET_ALLOW, "", ""))
    for label, action in (("allow", SECCOMP_RET_ALLOW), ("notify", SECCOMP_RET_USER_NOTIF)):
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
    """A process (``tid``, of thread group ``pid``) held at ``exit`` or ``exit_group``."""

    __slots__ = ("group", "id", "pid", "tid")

    def __init__(self, id: int, tid: int, group: bool) -> None:
        self.id = id
        self.tid = tid
        self.group = group
        """``exit_group``: the whole process ends (else one thread does)."""
        self.pid = thread_group(tid)
        """The process (its thread group); 0 if it is gone already."""


class Listener:
    """The supervisor's end of a barrier: a descriptor that is readable when a process
    of the command is held at its exit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

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
        return Notice(fields[0], fields[1], fields[3] in GROUP_EXITS)

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
    select: "Callable[[Dict[int, int]], Iterable[int]]",
    within: float = 5.0,
    meanwhile: "Optional[Callable[[], None]]" = None,
) -> bool:
    """SIGKILL the processes ``select`` picks from the live ones (:func:`processes`), again
    and again (what they forked meanwhile is picked next time), until it picks none that
    lives; False if some still lived after ``within`` seconds (a process the kernel keeps
    in an uninterruptible wait). ``meanwhile`` runs between the rounds (a supervisor's
    other duties: every exit it holds is a program kept alive)."""
    deadline = time.monotonic() + within
    while True:
        targets = list(select(processes()))
        if not targets:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if meanwhile is not None:
            meanwhile()
        # A killed process is gone (or a zombie) within microseconds, unless the kernel
        # holds it: look again at once, then back off a little.
        time.sleep(0.0002)
