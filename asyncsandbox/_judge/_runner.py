"""The judge's runner: every test case of a judgement, run by one command in the sandbox.

Runs inside the sandbox, on the sandbox's own ``python3`` (3.8 or later, standard library
only): this file and :mod:`asyncsandbox._barrier` are sent as source, not imported
(:data:`BOOT` loads them; the barrier arrives as the global ``barrier``, and BOOT's
``read_at_least`` as a global too).

Each case runs in a fork of this process, in a session of its own, with its own stdin
(a memory file), stdout and stderr (pipes read here) and nothing else of ours. Then:

* ``"mode": "fork"`` (Python): the fork becomes ``python3 PROGRAM`` without starting an
  interpreter: ``__main__`` is a fresh module, ``sys.argv`` is ``[PROGRAM]``, the standard
  streams are the case's, uncaught exceptions print their traceback and exit 1,
  ``SystemExit`` exits as the interpreter does, and non-daemon threads, ``atexit``
  functions and the flush of the streams happen at the end. The program was compiled
  once, here, before the first fork (about 1 ms a case instead of an interpreter's start).
  What this process holds is moved out of the collector's reach before the first fork
  (``gc.freeze``): the program's collections, automatic or asked for, walk its own
  objects only, and leave ours (shared with this process until written) uncopied.
* ``"mode": "exec"``: the fork executes ``argv`` (a compiled program, an interpreter).

**A case ends when its main process ends.** Before anything of the program runs, the
fork installs the exit barrier (:mod:`asyncsandbox._barrier`), sends its listener to the
guard (:class:`guard.Guard`, a process of ours beside this one that does nothing else),
and becomes a child subreaper: what its descendants orphan stays below it. When the
program's main process asks to exit, it is held there and the guard kills the case's
process group, which nothing of the program can leave, so nothing the program left
behind can write after it ended, whatever it waits for (its parent to change, a
parent-death signal); the guard tells us the status it asked to exit with before the
kill, and that is its status. The exits of the case's other processes are held too (the
filter cannot tell them apart): the guard releases them at once. The case's time limit
counts from the program's own start (the guard's word that its listener came), and its
output is what is in its stdout and stderr once it ended (they are at their end then,
since nothing else holds them), of which stdout counts only what the program's main
process and the processes that ended before it wrote (:meth:`Runner.answer`): not what a
process still running when the main one asked to exit wrote, since it may have written
after (the guard's kill comes when the scheduler lets it). Where the kernel offers no
barrier, the rest of the case is killed as soon as its main process is reaped, all its
output counts, and the answers say so (``"barrier": false``).

Request, on stdin (read whole, with ``os.read``; ``sys.stdin`` is left to the cases): its
length in decimal and a newline, then a dict in :mod:`marshal`'s format (built in: no
import to pay for, and its basic types read the same on every Python 3) ``{"mode",
"program" (fork) or "argv" (exec), "directory", "file", "source", "parallel",
"output_limit", "cases": [{"time_limit", "memory_kb", "stdin": length}]}``, then the
program's source (``source`` bytes, written to the path ``file`` unless it is None), then
the cases' stdin bytes, concatenated. The runner works in ``directory`` (created if
missing; empty: where it started), where the file is written before anything runs.

Answers, on stdout (written with ``os.write``), one per case as it ends, in the order
they end: a JSON line ``{"case", "status", "signal", "timed_out", "seconds", "cpu_seconds",
"barrier", "stdout": length, "stderr": length, "stdout_truncated", "stderr_truncated",
"stdout_dropped": the bytes of stdout that did not count}``
followed by that many bytes of output; then ``{"end": true, "barrier"}``. The program's output is only ever
payload: it cannot end or forge an answer.

What a case cannot do: write to this process's stdout (its descriptors other than its own
three are closed before the program runs, and this process is not dumpable, so
``/proc/PPID/fd`` is closed to it), read the expected outputs (they never enter the
sandbox), see its result altered (status from ``waitpid`` or its held exit's notice,
output from its own stdout and stderr), escape the barrier (the kernel lets a filter
chain hold one listener only: the case's processes cannot make one of their own), or
reach this process or the guard, though they run as the same user (the barrier's filter
refuses signals, scheduling and limits aimed at them). Without the barrier it can kill
them: the answers then stop short of ``end`` (this process ends when the guard does),
and the host runs the cases without an answer again, each under a runner of its own.
"""

from __future__ import annotations

import _socket
import gc
import marshal
import os
import resource
import select
import sys
import time

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    import signal
    from typing import Any

    from asyncsandbox import _barrier as barrier  # sent beside this file (see BOOT)
    from asyncsandbox._judge import _guard as guard, _program as program

    def read_at_least(data: bytes, size: int) -> bytes:
        """``data`` and what stdin holds after it, until ``size`` bytes at least (BOOT's,
        given to this file as a global: one definition for both)."""
else:
    # signal's C module: the same calls and numbers, without the enums (whose import
    # costs a judgement a few milliseconds of its interpreter's start).
    import _signal as signal

SHIPPED = (
    ("barrier", "asyncsandbox/_barrier.py"),
    ("guard", "asyncsandbox/_judge/_guard.py"),
    ("program", "asyncsandbox/_judge/_program.py"),
    ("runner", "asyncsandbox/_judge/_runner.py"),
)
"""What the host sends the sandbox, in this order: (the global each module is to the ones
after it, its path from the package's parent). This module, last, is run."""

BOOT = """import marshal, os, sys, types
def read_at_least(data, size):
    while len(data) < size:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            raise SystemExit("the request ended early")
        data += chunk
    return data
data = b""
while b"\\n" not in data:
    data = read_at_least(data, len(data) + 1)
sizes, _, data = data.partition(b"\\n")
compiled, sources = map(int, sizes.split())
data = read_at_least(data, compiled + sources)
magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
shipped = %r
if sys.argv[1] == magic.hex():
    codes = marshal.loads(data[:compiled])
else:
    texts = data[compiled : compiled + sources].decode().split("\\0")
    codes = [compile(text, path, "exec") for text, (_, path) in zip(texts, shipped)]
del sys.argv[1:]
names = {"read_at_least": read_at_least}
for (name, _), code in zip(shipped[:-1], codes):
    module = types.ModuleType(name)
    module.__dict__.update(names)
    exec(code, module.__dict__)
    names[name] = module
runner = dict(names, __name__="asyncsandbox_judge_runner", PENDING=data[compiled + sources :])
exec(codes[-1], runner)
runner["main"]()
os._exit(0)
""" % (SHIPPED,)
"""``python3 -c BOOT MAGIC``, its stdin starting with ``COMPILED SOURCES\\n``, then
COMPILED bytes of the :data:`SHIPPED` modules compiled by the host and marshalled, then
SOURCES bytes of their sources (UTF-8, a NUL between them). The compiled code is loaded
where the sandbox's Python has the host's bytecode (its ``MAGIC`` number, in hex), which
saves the sandbox compiling them for each judgement; elsewhere the sources are compiled.
(In stdin, not the arguments: the interpreter decodes each argument as text, about 1.4 ms
of CPU for these.) Each module but this one becomes a module of its own, the ones before
it (and BOOT's ``read_at_least``) its globals; then this module's :func:`main` runs, the
rest of stdin (what BOOT read of it is ``PENDING``) being the request, and the
interpreter leaves without its finalisation (what it would tear down dies with the
process; every answer is written by then)."""

MAX_FD = 1 << 16
CREDENTIALS_SPACE = _socket.CMSG_SPACE(12)  # struct ucred: pid, uid, gid
PR_SET_DUMPABLE = 4
UNWRITABLE = 121
"""The runner's exit status when it cannot write the program (before answering anything:
``ERRNO STRERROR`` on stderr)."""
UNLAUNCHABLE = 122
"""The runner's exit status when the cases cannot be run as asked, found before any case
ran (the sandbox's doing, not the program's; why on stderr): the command of ``"exec"``
mode is not there to run, or a case's memory limit is above what the sandbox allows. Once
a case ran, its exit status (126, 127, 125...) is the program's own."""
GRACE = 1.0
"""Seconds a case's pipes may stay open after it ended (a process the kernel held in an
uninterruptible wait, past the barrier's kill): its output is then what it wrote by then."""
GUARD_FINISH = 10.0
"""Seconds the guard may take, once every case ended, to say the last it has to say."""


def read_request() -> tuple[dict[str, Any], int]:
    """The request (the program's source written), and a memory file holding every
    case's stdin: kept out of this process's memory, which each fork inherits (and a
    memory limit counts)."""
    head: bytes = globals().get("PENDING", b"")  # what BOOT read past the code
    while b"\n" not in head:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            raise SystemExit("the request ended early")
        head += chunk
    length, _, rest = head.partition(b"\n")
    rest = read_at_least(rest, int(length))
    request: dict[str, Any] = marshal.loads(rest[: int(length)])
    rest = read_at_least(rest[int(length) :], request["source"])
    source, rest = rest[: request["source"]], rest[request["source"] :]
    try:
        if request["directory"]:
            os.makedirs(request["directory"], exist_ok=True)
            os.chdir(request["directory"])
        if request["file"] is not None:
            with open(request["file"], "wb") as file:
                file.write(source)
    except OSError as exc:
        os.write(2, ("%d %s\n" % (exc.errno or 0, exc.strerror)).encode(errors="replace"))
        os._exit(UNWRITABLE)
    inputs = os.memfd_create("inputs")
    while rest:
        write_all(inputs, rest)
        rest = os.read(0, 1 << 20)
    offset = 0
    for case in request["cases"]:
        case["stdin"], offset = (offset, case["stdin"]), offset + case["stdin"]
    return request, inputs


def json_line(fields: dict[str, Any]) -> bytes:
    """``fields`` (names, and finite numbers, booleans or None) as one line of JSON
    (json's import would cost each judgement a few milliseconds)."""
    return (
        "{%s}\n" % ", ".join('"%s": %s' % (k, json_word(v)) for k, v in fields.items())
    ).encode()


def json_word(value: object) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    return repr(value)


def case_stdin(inputs: int, offset: int, size: int) -> int:
    stdin = os.memfd_create("stdin")
    while size:
        chunk = os.pread(inputs, min(size, 1 << 20), offset)
        write_all(stdin, chunk)
        offset, size = offset + len(chunk), size - len(chunk)
    os.lseek(stdin, 0, os.SEEK_SET)
    return stdin


def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- a case, as the runner sees it -------------------------------------------------------


class Output:
    """What a case wrote to one of its streams: for stdout, who wrote each part."""

    def __init__(self) -> None:
        self.parts: list[tuple[int, bytearray]] = []  # (the writer's pid, or 0), in order
        self.socket: Any = None  # where it is read from, if a socket (stdout: see start)
        self.size = 0
        self.truncated = False

    def add(self, writer: int, data: bytes) -> None:
        if self.parts and self.parts[-1][0] == writer:
            self.parts[-1][1].extend(data)
        elif data:
            self.parts.append((writer, bytearray(data)))
        self.size += len(data)

    def by(self, writers: set[int] | None) -> tuple[bytes, int]:
        """What ``writers`` wrote (None: anyone), and how many bytes others wrote."""
        kept = b"".join(data for who, data in self.parts if writers is None or who in writers)
        return kept, self.size - len(kept)


class Case:
    def __init__(self, index: int, spec: dict[str, Any]) -> None:
        self.index = index
        self.spec = spec
        self.pid = 0
        self.started = self.deadline = self.ended = 0.0
        self.guarded = False  # its program runs behind the barrier (the guard said so)
        self.held: int | None = None  # the status its main process asked to exit with
        # (the guard held it at its exit, then killed the case)
        self.open: dict[int, Output] = {}  # its pipes not at their end yet
        self.exited: set[int] = set()  # its processes that ended before its main one
        self.outputs = {"stdout": Output(), "stderr": Output()}
        self.status: int | None = None
        self.cpu = 0.0  # CPU seconds of its main process and the children it waited for
        self.timed_out = False

    def done(self) -> bool:
        return self.status is not None and not self.open


# -- the runner --------------------------------------------------------------------------


class GuardGone(Exception):
    """The guard died (a case killed it: same user): no case can be answered for now."""


class Runner:
    """Runs the cases, ``parallel`` at a time, and answers for each as it ends."""

    def __init__(self, request: dict[str, Any], inputs: int, runs: program.Program) -> None:
        self.request = request
        self.inputs = inputs
        self.program = runs
        self.me = os.getpid()
        self.running: dict[int, Case] = {}  # by the pid of its main process
        self.readers: dict[int, Case] = {}  # by the fd of one of its pipes
        self.outbox = bytearray()  # answers that stdout has not taken yet
        self.barrier = True  # every case so far had one
        self.guard = 0
        self.news: Any = None  # from the guard
        self.handshakes: Any = None  # to the guard: each case's fork has it until it wrote
        self.filter: bytes | OSError = b""  # the barrier's, for every case
        self.heard = bytearray()
        self.guard_done = False

    def start_guard(self) -> None:
        news, guards_news = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        handshakes, guards_handshakes = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        pid = os.fork()
        if pid == 0:
            try:  # nothing of ours but its two sockets: the request, the answers
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)
                low, high = sorted((guards_handshakes.fileno(), guards_news.fileno()))
                for start, stop in ((3, low), (low + 1, high), (high + 1, MAX_FD)):
                    os.closerange(start, stop)
                guard.Guard(guards_handshakes, guards_news).run()
            finally:
                os._exit(1)
        guards_news.close()
        guards_handshakes.close()
        news.setblocking(False)
        self.guard, self.news, self.handshakes = pid, news, handshakes
        try:  # out of the cases' reach: the guard, this process, and their group
            self.filter = barrier.program(os.uname().machine, (pid, self.me, os.getpgrp()))
        except OSError as exc:
            self.filter = exc

    # -- starting a case --

    def start(self, case: Case) -> None:
        """Fork the case. Its program starts once its fork has handed the guard its
        listener (the guard's news says when); its time counts from the fork until then.

        Its stdout is a Unix stream socket, not a pipe: the kernel says who sent each part
        of it (``SO_PASSCRED``: the sender's pid, never glued to another sender's), so that
        what a process still running when the main one asked to exit wrote is told apart
        (see :meth:`answer`); and, unlike a pipe, it cannot be opened again through
        ``/proc``. Its stderr is a pipe (it earns nothing)."""
        stdin = case_stdin(self.inputs, *case.spec["stdin"])
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        ours.setsockopt(_socket.SOL_SOCKET, _socket.SO_PASSCRED, 1)
        ours.shutdown(_socket.SHUT_WR)  # nothing for the case to read
        out_r, out_w = ours.fileno(), theirs.detach()
        case.outputs["stdout"].socket = ours
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.setsid()
                os.dup2(stdin, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                guard.hand_over(self.handshakes, self.filter)
                barrier.subreaper()  # what it orphans stays below it
                os.closerange(3, MAX_FD)  # ours: the request, the other cases' pipes
            except BaseException:  # noqa: BLE001
                os._exit(125)
            self.program.become(case.spec["memory_kb"])
        for fd in (stdin, out_w, err_w):
            os.close(fd)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        case.pid = pid
        case.open = {out_r: case.outputs["stdout"], err_r: case.outputs["stderr"]}
        self.readers.update((fd, case) for fd in case.open)
        case.started = time.monotonic()
        case.deadline = case.started + case.spec["time_limit"]
        self.running[pid] = case

    def hear(self) -> None:
        """All the guard said since last time, without waiting for more."""
        try:
            while True:
                self.hear_once()
        except BlockingIOError:
            pass

    def hear_once(self) -> None:
        """What the guard says next (as the news socket is set: at once, or waiting)."""
        chunk = self.news.recv(1 << 16)
        if not chunk:
            raise GuardGone
        self.heard += chunk
        whole = len(self.heard) - len(self.heard) % guard.NEWS.size
        for offset in range(0, whole, guard.NEWS.size):
            what, pid, when, status = guard.NEWS.unpack_from(self.heard, offset)
            case = self.running.get(pid)
            if what == guard.UNGUARDED:  # whenever it comes: a case ran without one
                self.barrier = False
            elif what == guard.DONE:
                self.guard_done = True
            elif case is None or case.status is not None:  # killed before its news came
                continue
            elif what == guard.STARTED:  # its program starts now: its time counts from here
                case.guarded = True
                case.started = when
                case.deadline = when + case.spec["time_limit"]
            elif what == guard.EXITED:
                case.exited.add(status)
            elif what == guard.ENDED:
                case.held = status
                case.ended = when
        del self.heard[:whole]

    def finish_guard(self) -> None:
        """Every case ended: hear all the guard has to say (a case's word may reach it
        last: its fork wrote first, but the guard runs when it runs), and let it end."""
        self.handshakes.send(guard.HANDSHAKE.pack(0, guard.FINISH))
        self.news.setblocking(True)
        self.news.settimeout(GUARD_FINISH)
        try:
            while not self.guard_done:
                self.hear_once()
        except OSError:  # its time out: it is stuck (or stopped): say so
            raise GuardGone from None
        os.waitpid(self.guard, 0)

    # -- ending a case --

    def rest_of(self, case: Case, table: dict[int, int]) -> set[int]:
        """Every live process of ``case`` but its main one: its descendants, and any
        orphan that reached us (its case's main process died by a signal, so nothing the
        orphan writes can earn a verdict; nobody can tell its case, so it goes with the
        first case that ends)."""
        unknown = {
            pid
            for pid, ppid in table.items()
            if ppid == self.me and pid not in self.running and pid != self.guard
        }
        roots = {case.pid} | unknown
        found = barrier.descendants(roots, table) | unknown
        found.discard(case.pid)
        return found

    def kill(self, case: Case) -> None:
        """Kill the whole case (its time or output limit is reached, or its main process
        was reaped): its process group, which nothing of it can leave behind the barrier
        (the group outlives its leader while a process is in it, so it cannot be another
        case's); without the barrier, every process below it too (:meth:`rest_of`)."""
        for send in (os.kill, os.killpg):  # without the barrier, it may have left its group
            try:
                send(case.pid, signal.SIGKILL)
            except OSError:
                pass
        if not case.guarded:
            barrier.kill(lambda table: self.rest_of(case, table))

    def reaped(self, pid: int, status: int, usage: Any) -> None:
        if pid == self.guard:
            raise GuardGone
        case = self.running.get(pid)
        if case is None:  # an orphan that reached us (killed with a case's end)
            return
        self.hear()  # the guard told us of its end before it let the exit go
        if not case.ended:
            case.ended = time.monotonic()
        if case.held is not None:  # killed by the guard, held at its exit
            status = (case.held & 0xFF) << 8  # as if it had exited so
        elif case.guarded and os.WIFEXITED(status):
            # It ended with a status of its own without passing the barrier: hidden from
            # it, it is reported killed as seccomp would have killed it.
            status = barrier.HIDDEN_EXIT
        case.status = status
        case.cpu = usage.ru_utime + usage.ru_stime
        self.kill(case)  # what it left, if it was not killed with it

    # -- the loop --

    def run(self) -> None:
        try:
            self.loop()
        except GuardGone:
            # Nothing can be answered for: what was answered stays, the rest run again,
            # each under a runner of its own (the host's doing), and none ends here.
            for case in self.running.values():
                self.kill(case)
            os.set_blocking(1, True)
            write_all(1, self.outbox)
            os.write(2, b"the judge's guard died\n")
            os._exit(1)

    def loop(self) -> None:
        request = self.request
        limit = request["output_limit"]
        self.start_guard()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(wake_w)
        pending = [Case(i, spec) for i, spec in enumerate(request["cases"])]
        pending.reverse()
        # Ours, out of the collector's reach before the first fork: a collection in a case
        # would otherwise walk (and so copy) every page of this interpreter's objects.
        # About 2 ms of CPU a case, measured in a process sandbox on a HumanEval program.
        gc.freeze()
        os.set_blocking(1, False)
        while pending or self.running:
            while pending and len(self.running) < request["parallel"]:
                self.start(pending.pop())
            now = time.monotonic()
            wake = min(
                c.deadline if c.status is None else c.ended + GRACE for c in self.running.values()
            )
            poller = select.poll()
            poller.register(wake_r, select.POLLIN)
            if self.outbox:
                poller.register(1, select.POLLOUT)
            for fd in (*self.readers, self.news.fileno()):
                poller.register(fd, select.POLLIN)
            try:
                ready = poller.poll(max(0.0, wake - now) * 1000)
            except InterruptedError:
                ready = []
            for fd, _ in ready:
                if fd == self.news.fileno():
                    self.hear()
                elif fd == 1:
                    self.flush()
                elif fd == wake_r:
                    drain(wake_r)
                elif fd in self.readers:
                    self.read(fd, limit)
            while True:
                try:
                    pid, status, usage = os.wait4(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                self.reaped(pid, status, usage)
            now = time.monotonic()
            for case in list(self.running.values()):
                if case.status is None and now >= case.deadline:
                    case.timed_out = True
                    self.kill(case)
                elif case.status is not None and case.open and now >= case.ended + GRACE:
                    for fd in list(case.open):
                        self.close(case, fd)
                if case.done():
                    del self.running[case.pid]
                    self.outbox += self.answer(case)
                    self.flush()  # now: a case started next may kill us before the poll
        self.finish_guard()
        os.set_blocking(1, True)
        end = {"end": True, "barrier": self.barrier}
        write_all(1, self.outbox + json_line(end))

    def flush(self) -> None:
        """Write what stdout takes of the answers now (never waiting for it)."""
        try:
            del self.outbox[: os.write(1, self.outbox)]
        except BlockingIOError:
            pass

    def read(self, fd: int, limit: int) -> None:
        case = self.readers[fd]
        output = case.open[fd]
        writer = 0
        try:
            sock = output.socket
            if sock is None:
                chunk = os.read(fd, 1 << 16)
            else:  # one sender's bytes at a time, and who sent them
                chunk, ancillary, _, _ = sock.recvmsg(1 << 16, CREDENTIALS_SPACE)
                for level, kind, data in ancillary:
                    if level == _socket.SOL_SOCKET and kind == _socket.SCM_CREDENTIALS:
                        writer = int.from_bytes(data[:4], sys.byteorder, signed=True)
        except BlockingIOError:
            return
        if not chunk:
            self.close(case, fd)
            return
        room = limit - output.size
        output.add(writer, chunk[: max(room, 0)])
        if len(chunk) > room and not output.truncated:
            output.truncated = True
            self.kill(case)  # its verdict is settled: output limit

    def close(self, case: Case, fd: int) -> None:
        sock = case.open[fd].socket
        if sock is None:
            os.close(fd)
        else:
            sock.close()
        del self.readers[fd], case.open[fd]

    def answer(self, case: Case) -> bytes:
        """The case's answer. Its stdout is what its main process wrote and what its
        processes that ended before the main one asked to exit wrote (the guard's
        ``EXITED``: in the order the kernel held their exits): a process still running
        then (or gone by a signal, whose end nobody can place) may have written after,
        and nothing written after the program ended counts. Without the barrier, all."""
        status = case.status
        assert status is not None
        writers = {case.pid} | case.exited if case.guarded else None
        out, dropped = case.outputs["stdout"].by(writers)
        err, _ = case.outputs["stderr"].by(None)
        meta = {
            "case": case.index,
            "status": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "timed_out": case.timed_out,
            "seconds": case.ended - case.started,
            "cpu_seconds": case.cpu,
            "barrier": case.held is not None or not os.WIFEXITED(status),
            "stdout": len(out),
            "stderr": len(err),
            "stdout_truncated": case.outputs["stdout"].truncated,
            "stderr_truncated": case.outputs["stderr"].truncated,
            "stdout_dropped": dropped,
        }
        return json_line(meta) + out + err


def drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def launchable(name: str) -> bool:
    """``name`` is a file ``execvp`` could run (searched on ``PATH`` as it would)."""
    if "/" in name:
        candidates = [name]
    else:
        path = os.environ.get("PATH", os.defpath).split(os.pathsep)
        candidates = [os.path.join(directory or ".", name) for directory in path]
    return any(os.path.isfile(c) and os.access(c, os.X_OK) for c in candidates)


def main() -> None:
    barrier.prctl(PR_SET_DUMPABLE, 0)  # first: before anything of ours can be read through /proc
    barrier.subreaper()  # what a case orphans comes to us, to be killed
    request, inputs = read_request()
    argv = request.get("argv")
    why = None  # before any case: nothing of the program ran yet
    if argv is not None and not launchable(argv[0]):
        why = "%s: not found or not executable" % argv[0]
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    for case in request["cases"]:
        if case["memory_kb"] is not None and 0 <= hard < case["memory_kb"] * 1024:
            why = "cannot limit memory to %d KiB: the sandbox allows %d" % (
                case["memory_kb"],
                hard // 1024,
            )
    if why is not None:
        os.write(2, (why + "\n").encode(errors="replace"))
        os._exit(UNLAUNCHABLE)
    Runner(request, inputs, program.Program(request)).run()
