"""The host's processes: those of every backend's sandboxes are visible from the host, and
a marker on their command line tells ours apart (the machine is shared)."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

from ._waiting import eventually_async


def unique_marker() -> str:
    """A number that is a valid ``sleep`` argument and unique on this host: processes
    whose command line carries it are ours (the machine is shared)."""
    return f"1000.{uuid.uuid4().int % 10**9}"


def processes_with(marker: str) -> list[str]:
    """``"pid: command line"`` of every host process whose command line contains
    ``marker`` (the processes of every backend's sandboxes are visible from the host; a
    zombie's command line is empty: it runs no more)."""
    found = []
    needle = marker.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(f"{pid}: " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def running(program: str, marker: str) -> int:
    """How many host processes run ``program`` with ``marker`` among its arguments (not
    those that merely carry it, such as a shell whose script names it)."""
    return sum(line.split(": ", 1)[1].startswith(program + " ") for line in processes_with(marker))


async def processes_gone(marker: str, *, within: float) -> list[str]:
    """Wait up to ``within`` seconds for the processes carrying ``marker`` to be gone;
    return those still there (the caller asserts on them, with what they are)."""
    with contextlib.suppress(AssertionError):
        await eventually_async(lambda: not processes_with(marker), within=within)
    return processes_with(marker)


def runsc_processes(carried: str) -> dict[int, str]:
    """The host's runsc processes of one gVisor sandbox (``runsc run`` or the runtime's
    shim, and the sandbox's kernel and file server: ``runsc-sandbox``, ``runsc-gofer``), by
    pid, with their program: those whose command line carries ``carried`` (the process
    backend: the sandbox's runsc state directory; Docker: the container's full id)."""
    found = {}
    for line in processes_with(carried):
        pid, _, command = line.partition(": ")
        program = Path(command.split(" ", 1)[0]).name
        if "runsc" in program:
            found[int(pid)] = program
    return found


def wedge_gvisor(carried: str) -> list[int]:
    """Stop (SIGSTOP) the kernel and the file server of the gVisor sandbox whose runsc
    processes carry ``carried``, as a gVisor sandbox that hangs: nothing inside answers
    any more. Their pids (SIGKILL them to end the wedge)."""
    found = runsc_processes(carried)
    stopped = [pid for pid, name in found.items() if name in ("runsc-sandbox", "runsc-gofer")]
    assert len(stopped) == 2, found
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    return stopped
