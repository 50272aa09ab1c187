"""The raylet a node agent lives by: when it exits, the node is gone (see
:class:`~asyncsandbox_ray._node.NodeAgent`)."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path


class Raylet:
    """The raylet of this worker's node (``RAY_RAYLET_PID``, set by Ray for every worker),
    watched through a pidfd: it becomes readable when the raylet exits, whether or not
    anything reaps it. Without a pidfd (Linux < 5.3) ``/proc`` is read instead."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = pid is None
        if pid is not None:
            try:
                self._fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._gone = True
            except (AttributeError, OSError):
                self._fd = None  # no pidfd here: /proc it is

    @classmethod
    def of_this_worker(cls) -> Raylet | None:
        pid = os.environ.get("RAY_RAYLET_PID", "")
        return cls(int(pid)) if pid.isdigit() else None

    def gone(self) -> bool:
        """Has the raylet exited? (A syscall: cheap enough for every call.)"""
        if not self._gone:
            if self._fd is not None:
                poller = select.poll()
                poller.register(self._fd, select.POLLIN)
                self._gone = bool(poller.poll(0))
            else:
                self._gone = not _running(self.pid)
        return self._gone

    def wait(self) -> None:
        """Block until the raylet exits (run in a thread of its own)."""
        if self._fd is not None:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            while not poller.poll():
                pass
            self._gone = True
            return
        while not self.gone():
            time.sleep(1.0)


def _running(pid: int | None) -> bool:
    """``pid`` exists and is not a zombie (``/proc/<pid>/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] not in (b"Z", b"X")
