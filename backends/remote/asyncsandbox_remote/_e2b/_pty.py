"""A PTY session inside an E2B sandbox of ``asyncsandbox serve`` (envd's ``Start`` with
``pty``).

Runs in the sandbox as ``python3 -I -S -c <this file> ROWS COLS CONTROL ARGV...`` (stdlib
only, Python >= 3.6; never imported by the server): ARGV runs on a new pseudo-terminal of
ROWS x COLS as its controlling terminal; what it writes there comes out on our stdout,
what comes in on our stdin (the session's input) goes to it. A line ``ROWS COLS`` in the
FIFO CONTROL resizes the terminal (the kernel signals SIGWINCH to its foreground group).
When ARGV exits we exit with its status (128+N after signal N), once what it wrote is read,
however busy the terminal still is with what it left running.
"""

import errno
import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios

LEFT = 1 << 20


def resize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def main() -> None:
    rows, cols, control = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    argv = sys.argv[4:]
    # Its end wakes us (SIGCHLD, through a pipe), however busy the terminal is: set up
    # before it exists, so that no end comes before we listen.
    ended, ended_w = os.pipe()  # (not inherited: both close on exec)
    os.set_blocking(ended, False)
    os.set_blocking(ended_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(ended_w)
    child, master = pty.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, ("%s: %s\n" % (argv[0], exc.strerror)).encode())
        os._exit(127)
    resize(master, rows, cols)
    # Opened for reading and writing, so that it never reads end of file between writers.
    ctl = os.open(control, os.O_RDWR | os.O_NONBLOCK)
    pending = b""
    sources = [master, 0, ctl, ended]
    status = None
    while status is None and master in sources:
        ready, _, _ = select.select(sources, [], [])
        if master in ready:
            data = read_terminal(master)
            if not data:
                sources.remove(master)
            else:
                write_all(1, data)
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:
                sources.remove(0)  # the session's input ended; the terminal goes on
            else:
                write_all(master, data)
        if ctl in ready:
            pending += os.read(ctl, 4096)
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                size = line.split()
                if len(size) == 2 and size[0].isdigit() and size[1].isdigit():
                    resize(master, int(size[0]), int(size[1]))
        if ended in ready:
            drain(ended)
            pid, waited = os.waitpid(child, os.WNOHANG)
            if pid:
                status = waited
    if status is None:
        _, status = os.waitpid(child, 0)
    elif master in sources:
        # It ended; what it left running may keep the terminal open and busy: what it
        # wrote is what the terminal holds now (a read first passes on what the kernel
        # still queues for it), and that is all we pass on (bounded: a terminal holds
        # far less than LEFT, however fast what is left writes).
        os.set_blocking(master, False)
        left = LEFT
        try:
            while left > 0:
                data = read_terminal(master)
                if not data:
                    break
                write_all(1, data)
                left -= len(data)
        except BlockingIOError:
            pass
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


def read_terminal(master: int) -> bytes:
    """What the terminal has (b"" at its end: EIO once its last user is gone)."""
    try:
        return os.read(master, 65536)
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        return b""


main()
