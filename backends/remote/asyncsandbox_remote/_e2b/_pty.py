"""A PTY session inside an E2B sandbox of ``asyncsandbox serve`` (envd's ``Start`` with
``pty``).

Runs in the sandbox as ``python3 -I -S -c <this file> ROWS COLS CONTROL ARGV...`` (stdlib
only, Python >= 3.6; never imported by the server): ARGV runs on a new pseudo-terminal of
ROWS x COLS as its controlling terminal; what it writes there comes out on our stdout,
what comes in on our stdin (the session's input) goes to it. A line ``ROWS COLS`` in the
FIFO CONTROL resizes the terminal (the kernel signals SIGWINCH to its foreground group).
When ARGV exits we exit with its status (128+N after signal N).
"""

import errno
import fcntl
import os
import pty
import select
import struct
import sys
import termios


def resize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    rows, cols, control = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    argv = sys.argv[4:]
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
    sources = [master, 0, ctl]
    status = None
    while master in sources:
        ready, _, _ = select.select(sources, [], [], 0.2)
        if master in ready:
            try:
                data = os.read(master, 65536)
            except OSError as exc:
                if exc.errno != errno.EIO:  # EIO: the terminal's last user is gone
                    raise
                data = b""
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
        if not ready and status is None:
            pid, waited = os.waitpid(child, os.WNOHANG)
            if pid:
                # It ended; what it left behind may hold the terminal open: stop once
                # what it wrote is read.
                status = waited
                sources = [s for s in sources if s == master]
    if status is None:
        _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


main()
