"""Who used the CPUs during a measurement: the worker, the engine, or someone else.

The machine may be shared (tests running beside the bench). Each point records the share
of the machine's CPU time used by processes that are neither the measuring worker (its
session) nor the container engine (dockerd, containerd, the shims and everything under
them): a point measured while others were busy is flagged as contended, not silently
reported as slow. Before each job the orchestrator waits (bounded) for the machine to be
quiet.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
ENGINE = frozenset(
    {"dockerd", "containerd", "runc", "docker-init", "docker-untar", "set-ipv6", "exe"}
)  # "exe": dockerd re-executing itself (/proc/self/exe) for untar and network hooks
# Helpers the engine runs that outlive their parent (runc's hooks are reparented to init):
# libnetwork-setkey ("libnetwork-set", comm is 15 characters), runc's stages ("runc:[2:INIT]").
ENGINE_PREFIXES = ("containerd-shim", "libnetwork-set", "runc:")


@dataclass(frozen=True)
class Snapshot:
    at: float
    ticks: dict[str, int]
    """CPU ticks (user + system, including reaped children) by group: ours, engine, other."""


def _stat(pid: str) -> tuple[str, int, int, int] | None:
    """(comm, ppid, sid, ticks) of a process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    close = raw.rfind(b")")
    comm = raw[raw.find(b"(") + 1 : close].decode(errors="replace")
    fields = raw[close + 2 :].split()
    # fields[0] is the state (field 3); ppid 4, session 6, utime 14 .. cstime 17
    ppid, sid = int(fields[1]), int(fields[3])
    ticks = sum(int(x) for x in fields[11:15])
    return comm, ppid, sid, ticks


def snapshot(our_session: int | None) -> Snapshot:
    procs: dict[int, tuple[str, int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(entry)
            if stat is not None:
                procs[int(entry)] = stat
    groups = {"ours": 0, "engine": 0, "other": 0}
    memo: dict[int, str] = {}

    def group(pid: int, depth: int = 0) -> str:
        if pid in memo:
            return memo[pid]
        found = procs.get(pid)
        if found is None or pid <= 1 or depth > 64:
            return "other"
        comm, ppid, sid, _ = found
        if our_session is not None and sid == our_session:
            result = "ours"
        elif comm in ENGINE or comm.startswith(ENGINE_PREFIXES):
            result = "engine"
        else:
            result = group(ppid, depth + 1)
        memo[pid] = result
        return result

    for pid, (_, _, _, ticks) in procs.items():
        groups[group(pid)] += ticks
    return Snapshot(time.monotonic(), groups)


def shares(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Share of the machine's CPU capacity each group used between the snapshots (0..1).
    Processes that started and ended in between count only through a parent that reaped
    them, so this is an estimate."""
    seconds = after.at - before.at
    if seconds < 1.0:
        return {}  # clock ticks are 10 ms: a shorter window says nothing
    capacity = seconds * HZ * CORES
    return {
        name: round(min(1.0, max(0, after.ticks[name] - before.ticks.get(name, 0)) / capacity), 3)
        for name in after.ticks
    }


def wait_quiet(*, limit: float, threshold: float = 0.25, window: float = 3.0) -> float | None:
    """Wait until processes other than the engine use under ``threshold`` of the CPUs over
    ``window`` seconds, for at most ``limit`` seconds. Returns the last share measured when
    the machine never got quiet, None when it did."""
    if limit <= 0:
        return None
    deadline = time.monotonic() + limit
    while True:
        before = snapshot(None)
        time.sleep(window)
        busy = shares(before, snapshot(None))["other"]
        if busy < threshold:
            return None
        if time.monotonic() >= deadline:
            return busy
