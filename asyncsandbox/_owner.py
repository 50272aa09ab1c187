"""Who owns a sandbox, and whether that owner is still alive.

Every sandbox carries labels naming the process that created it (host, boot, pid and the
pid's start time, so a recycled pid is not mistaken for the owner) and when it expires.
The garbage collector (``asyncsandbox gc``, and each Session on start) removes sandboxes
whose owner is provably dead or whose lifetime is over: a crash of the owner (SIGKILL, OOM,
power loss) leaves nothing behind for long.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Mapping

import msgspec

LABEL_PREFIX = "asyncsandbox."
OWNER = "asyncsandbox.owner"
SESSION = "asyncsandbox.session"
CREATED = "asyncsandbox.created"
EXPIRES = "asyncsandbox.expires"
TAG_PREFIX = "asyncsandbox.tag."


class Owner(msgspec.Struct, frozen=True):
    host: str
    boot_id: str
    pid: int
    start_time: int

    def label(self) -> str:
        return f"{self.host}/{self.boot_id}/{self.pid}/{self.start_time}"

    @classmethod
    def parse(cls, label: str) -> Owner | None:
        parts = label.rsplit("/", 3)
        if len(parts) != 4:
            return None
        host, boot_id, pid, start = parts
        try:
            return cls(host, boot_id, int(pid), int(start))
        except ValueError:
            return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _start_time(pid: int) -> int | None:
    """The pid's start time in clock ticks after boot; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return -1  # exists, but unreadable: treat as alive
    # The command name (field 2) may contain spaces and parentheses; fields follow the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


@functools.cache
def _this_host() -> tuple[str, str]:
    return socket.gethostname(), _boot_id()


def current_owner() -> Owner:
    """The owner identity of this process (recomputed after fork)."""
    host, boot = _this_host()
    pid = os.getpid()
    return Owner(host, boot, pid, _start_time(pid) or 0)


def owner_alive(label: str) -> bool | None:
    """True/False when that can be told from this machine; None for other hosts or boots."""
    owner = Owner.parse(label)
    if owner is None:
        return None
    if (owner.host, owner.boot_id) != _this_host():
        return None
    start = _start_time(owner.pid)
    if start is None:
        return False
    return start in (-1, owner.start_time)


def runtime_labels(
    *, session_id: str, tags: tuple[str, ...], max_lifetime: float | None
) -> dict[str, str]:
    now = time.time()
    labels = {
        OWNER: current_owner().label(),
        SESSION: session_id,
        CREATED: f"{now:.3f}",
        EXPIRES: "" if max_lifetime is None else f"{now + max_lifetime:.3f}",
    }
    labels.update({TAG_PREFIX + tag: "" for tag in tags})
    return labels


def tag_labels(tags: tuple[str, ...]) -> dict[str, str]:
    return {TAG_PREFIX + tag: "" for tag in tags}


def tags_of(labels: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(key[len(TAG_PREFIX) :] for key in labels if key.startswith(TAG_PREFIX))


def garbage_reason(labels: Mapping[str, str], *, now: float | None = None) -> str | None:
    """Why a sandbox with these labels should be removed (None: keep it)."""
    if OWNER not in labels:
        return None  # not ours
    expires = labels.get(EXPIRES, "")
    if expires:
        try:
            if float(expires) < (time.time() if now is None else now):
                return "max lifetime exceeded"
        except ValueError:
            pass
    if owner_alive(labels[OWNER]) is False:
        return "owner process is gone"
    return None
