"""The probe: a small stdlib-only Python program the conformance suite runs inside
sandboxes (as ``python3 -c PROBE MODE ARGS...``), so one suite exercises every backend with
the same, precisely known behaviour. The FakeBackend emulates it.

Modes: ``echo`` (stdin to stdout), ``env NAME``, ``pwd``, ``exit N``,
``emit STREAM NBYTES`` (16-byte lines holding their own offset), ``binary``,
``heartbeat FILE`` (append a byte every 20 ms), ``tree DIR`` (a child ignoring SIGTERM and a
setsid'd double-forked daemon, both heartbeating into DIR; once both have beaten, print
``ready``, mark it with the file DIR/ready, and sleep), ``spawn-and-exit DIR``
(leave a daemon holding stdout open, heartbeating, and exit), ``sleep SECONDS``,
``cat FILE``, ``write FILE TEXT``, ``mode FILE`` (permission bits in octal).
"""

from __future__ import annotations

import functools

PROBE = r"""
import os, signal, sys, time
mode, args = sys.argv[1], sys.argv[2:]
out = sys.stdout.buffer

def beat(path):
    while True:
        with open(path, "ab") as f:
            f.write(b".")
        time.sleep(0.02)

def daemon(path):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            beat(path)
        os._exit(0)

if mode == "echo":
    out.write(sys.stdin.buffer.read())
elif mode == "env":
    out.write(os.environ.get(args[0], "<unset>").encode())
elif mode == "pwd":
    out.write(os.getcwd().encode())
elif mode == "exit":
    sys.exit(int(args[0]))
elif mode == "emit":
    stream = out if args[0] == "stdout" else sys.stderr.buffer
    total = int(args[1])
    for start in range(0, total, 1 << 16):
        stream.write(b"".join(b"%015d\n" % i for i in range(start, min(start + (1 << 16), total), 16)))
    stream.flush()
elif mode == "binary":
    out.write(bytes(range(256)) * 4)
    sys.stderr.buffer.write(b"invalid \xff\xfe utf-8")
elif mode == "heartbeat":
    beat(args[0])
elif mode == "tree":
    beats = [os.path.join(args[0], name) for name in ("child.hb", "daemon.hb")]
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        beat(beats[0])
    daemon(beats[1])
    while not all(map(os.path.exists, beats)):  # ready: both beat
        time.sleep(0.005)
    out.write(b"ready\n")
    out.flush()
    open(os.path.join(args[0], "ready"), "wb").close()
    time.sleep(3600)
elif mode == "spawn-and-exit":
    daemon(os.path.join(args[0], "bg.hb"))
    out.write(b"parent done\n")
elif mode == "sleep":
    time.sleep(float(args[0]))
elif mode == "cat":
    with open(args[0], "rb") as f:
        out.write(f.read())
elif mode == "write":
    with open(args[0], "wb") as f:
        f.write(args[1].encode())
elif mode == "mode":
    out.write(b"%o" % (os.stat(args[0]).st_mode & 0o777))
else:
    sys.exit("unknown probe mode " + mode)
"""
"""The probe's source: a stdlib-only program the conformance suite runs in sandboxes as
``python3 -c PROBE MODE ARGS...`` (:func:`probe` makes that argv). Its modes: ``echo``,
``env NAME``, ``pwd``, ``exit N``, ``emit STREAM NBYTES``, ``binary``, ``heartbeat FILE``,
``tree DIR``, ``spawn-and-exit DIR``, ``sleep SECONDS``, ``cat FILE``, ``write FILE TEXT``,
``mode FILE``."""


def probe(mode: str, *args: object) -> list[str]:
    """The argv that runs the probe in ``mode``."""
    return ["python3", "-c", PROBE, mode, *map(str, args)]


def emitted(total: int, start: int = 0) -> bytes:
    """What ``emit`` writes for ``total`` bytes (a multiple of 16), from offset ``start``
    (a multiple of 16) on.

    Built a digit column at a time, not a line at a time: with no object per line, the
    FakeBackend's ``emit`` costs little even under ``tracemalloc`` (which the output-cap
    check runs while 24 MiB go by)."""
    out = bytearray(total - start)
    out[15::16] = b"\n" * ((total - start) // 16)
    columns = _low_digits()
    position = start
    while position < total:  # the high nine digits are the same up to the next million
        high, low = divmod(position, 1_000_000)
        stop = min(total, (high + 1) * 1_000_000)
        lines, at = (stop - position) // 16, position - start
        for j, digit in enumerate(b"%09d" % high):
            out[at + j : at + lines * 16 : 16] = bytes((digit,)) * lines
        for j, column in enumerate(columns):
            out[at + 9 + j : at + lines * 16 : 16] = column[low // 16 : low // 16 + lines]
        position = stop
    return bytes(out)


@functools.cache
def _low_digits() -> tuple[bytes, ...]:
    """The six low digits of every multiple of 16 below a million, a column per digit."""
    lows = b"".join(b"%06d" % low for low in range(0, 1_000_000, 16))
    return tuple(lows[j::6] for j in range(6))
