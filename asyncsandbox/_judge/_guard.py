"""The guard: the supervisor of every case of a judgement, beside the judge's runner.

It answers the exits that the barrier (:mod:`asyncsandbox._barrier`) holds, in a process
of its own that does nothing else, and tells the runner (:mod:`._runner`) what happened,
in order (:data:`NEWS`). Shipped into the sandbox as source with the barrier and the
runner, and run on the sandbox's own ``python3`` (3.6 or newer, standard library only; the
barrier arrives as the global ``barrier``: see the runner's ``BOOT``).
"""

import _socket
import os
import select
import struct
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any, Dict, NoReturn, Set

    from asyncsandbox import _barrier as barrier  # sent beside this file (see BOOT)
else:
    import _signal as signal  # signal's C module: the calls, without the enums' import

STARTED, UNGUARDED, EXITED, ENDED, DONE = b"s", b"u", b"x", b"e", b"d"
NEWS = struct.Struct("=cidi")
"""What the guard tells the runner: (what, the pid of a case's main process, when, a
number). ``STARTED``: its program starts now, behind the barrier; ``UNGUARDED``: the
kernel has no barrier for it; ``EXITED``: another process of the case (the number: its
pid) asked to exit, as a whole (``exit_group``, or its last thread's ``exit``), before
its main process did; ``ENDED``: its main process asked to exit (the number: the status
it asked for), and the case is killed now (said before the kill, so the runner hears it
before it reaps); ``DONE``: the guard read the runner's ``FINISH`` and ends (it said all
it had to).

The exits of a case's processes reach the guard in the order they were asked for (one
listener, first in first out), so ``EXITED`` says of a process that it ended before the
main process asked to exit, whatever the guard's delay: what it wrote is the program's.
What a process still running then wrote is not: it may have written after, and the
runner tells them apart by who wrote (its output's sender, as the kernel says)."""
HANDSHAKE = struct.Struct("=ic")
"""A case's fork to the guard: its pid, then ``L`` (with the listener) or ``!`` (and why
it has none); or the runner's ``FINISH`` (pid 0), once every case ended."""
FINISH = b"F"


class Guarded:
    """A case, as the guard sees it."""

    def __init__(self, pid: int, listener: "barrier.Listener") -> None:
        self.pid = pid
        self.listener = listener
        # Of each of its processes, the threads let go at their exit (maybe not gone yet).
        self.let_go: Dict[int, Set[int]] = {}


class Guard:
    """Answers every exit the barrier holds, in a process of its own that does nothing
    else, so that a case's end is answered the moment its notice arrives, whatever the
    runner is doing (forking the next case, reading output): what the program left
    behind is killed before it can write. (The runner answering between its other work,
    a daemon that answered 1 ms after it saw its main process in ``exit_group`` was
    accepted in 20 of 80 cases, 4 at a time on two cores.)

    A case's end is answered with one system call: ``killpg`` of the case's process
    group, which nothing of the case can leave (the barrier's filter refuses ``setsid``
    and ``setpgid``: see :func:`barrier.program`). The main process goes with it, held at
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
        barrier.hurry()
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
                self.cases[fds[0]] = Guarded(pid, barrier.Listener(fds[0]))
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
        process = notice.process(case.pid)
        ends = notice.group or (process and self.last_thread(case, process, notice.tid))
        if process != case.pid:
            # At once (see the module docstring), once the runner knows, where it is a
            # process's end, that the process ended before the main one asked to.
            if process and ends:
                case.let_go.pop(process, None)
                self.tell(EXITED, case.pid, process)
            case.listener.release(notice)
        elif ends:
            self.tell(ENDED, case.pid, notice.status)
            kill_group(case.pid)
            self.forget(case)  # what was killed exits without asking
        else:
            case.listener.release(notice)

    @staticmethod
    def last_thread(case: "Guarded", process: int, tid: int) -> bool:
        """Whether thread ``tid``, held at its ``exit``, is the last of ``process``: not
        counting the threads let go before it (gone, or going: a thread let go cannot
        return to the program). Never waited for: a guard that waited for a thread the
        kernel keeps in its exit would leave every other exit unanswered meanwhile."""
        alive = barrier.live_threads(process)
        let_go = case.let_go.setdefault(process, set())
        let_go &= alive
        if alive - let_go - {tid}:
            let_go.add(tid)
            return False
        return True

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


def hand_over(sock: "Any", insns: "bytes | OSError") -> None:
    """In a command's process, before anything of the command runs: install the barrier
    (``insns``: its filter, or why there is none here), and send the guard (over ``sock``,
    a datagram socket) its pid and the barrier's listener (or, where the kernel has none,
    why not)."""
    me = os.getpid()
    try:
        if isinstance(insns, OSError):
            raise insns
        fd = barrier.install(insns)
    except OSError as exc:
        sock.send(HANDSHAKE.pack(me, b"!") + ("%s" % exc).encode(errors="replace")[:400])
        return
    rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", fd))]
    sock.sendmsg([HANDSHAKE.pack(me, b"L")], rights)
    os.close(fd)
