"""What the code interpreter's runner processes share: the frames of their channels,
``prctl``, and finding and killing children. Shipped with the runner (see
:data:`._engine.RUNNER`), on the sandbox's ``python3`` (3.8 or later, standard library only).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
FRAME = struct.Struct(">II")
MAX_HEADER = 1 << 20
MAX_CODE = 64 << 20
HIGH_WATER = 1 << 20
"""Bytes waiting for the host beyond which kernels' output is no longer read (their
writes block: backpressure instead of memory)."""
RESULT_SLACK = 1 << 16
OUTPUT_CHUNK = 1 << 15
"""Largest frame of output a kernel sends (below RESULT_SLACK: one is always accepted)."""
CHUNK = 1 << 16
MAX_FD = 1 << 16
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
TAG = "_asyncsandbox_call"  # the call a thread was started in


def prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(%d)" % option)


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return FRAME.pack(len(head), len(payload)) + head + payload


class Frames:
    """Frames parsed from a byte stream as it comes (bounded: a header over MAX_HEADER
    or a payload over ``max_payload`` is an error)."""

    def __init__(self, max_payload: int) -> None:
        self.buffer = bytearray()
        self.max_payload = max_payload

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= FRAME.size:
            head, size = FRAME.unpack_from(self.buffer)
            if head > MAX_HEADER or size > self.max_payload:
                raise ValueError("a frame of %d+%d bytes" % (head, size))
            end = FRAME.size + head + size
            if len(self.buffer) < end:
                break
            header = json.loads(bytes(self.buffer[FRAME.size : FRAME.size + head]))
            if not isinstance(header, dict):
                raise TypeError("a header that is not an object")
            frames.append((header, bytes(self.buffer[FRAME.size + head : end])))
            del self.buffer[:end]
        if len(self.buffer) > FRAME.size + MAX_HEADER + self.max_payload:
            raise ValueError("an unending frame")
        return frames


def read_some(fd: int) -> bytes | None:
    """What ``fd`` has now (``b""`` at its end), or None if nothing (non-blocking)."""
    try:
        return os.read(fd, CHUNK)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return b""
        raise


def children() -> list[int]:
    """This process's children (it is single-threaded)."""
    me = os.getpid()
    try:
        with open("/proc/self/task/%d/children" % me) as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        pass
    found = []  # without CONFIG_PROC_CHILDREN: every process's parent, from /proc
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def kill(pid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def describe(status: int) -> tuple[str, str]:
    """A dead kernel's wait status, as an error's name and value."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "signal %d" % signum
        why = "killed by %s" % name
        if signum == signal.SIGKILL:
            why += " (out of memory, or killed from outside)"
        return "InterpreterDied", "the interpreter was %s; its state is lost" % why
    return (
        "InterpreterDied",
        "the interpreter exited with status %d; its state is lost" % os.WEXITSTATUS(status),
    )
