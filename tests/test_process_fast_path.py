"""The process backend's fast path: a resident executor per sandbox, whose commands each
run in namespaces of their own and leave nothing to the next; it stops when idle, the next
command starts one, and it leaks no descriptors."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import Session
from asyncsandbox._process import ProcessAttributes

from . import _process_support as process
from ._process_support import fast_session
from ._support import eventually_async, processes_with

# The process family's fixture (tests/_process_support.py), this module's by name.
anyio_backend = process.anyio_backend


async def test_fast_path_commands_live_in_namespaces_of_their_own(process_root: Path) -> None:
    """Each command runs in a PID namespace of its own, under an init of its own, with its
    own /proc: it sees neither the executor nor the sandbox's other commands (but their
    files, as one episode), and is never PID 1. An init whose command ended runs the next
    one only once nothing of the last is left (a daemon it started included)."""
    marker = f"1000.{uuid.uuid4().int % 10**8}"
    listing = "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    mine = "import os; print([1, os.getpid()])"
    async with fast_session(process_root) as s, s.sandbox() as sb:
        assert sb.extra(ProcessAttributes.fast_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sb.exec, ["sh", "-c", f"echo shared > /tmp/f; exec sleep {marker}"])
            # The sleep itself, not its shell (whose command line holds the marker too, before
            # it wrote the file).
            await eventually_async(
                lambda: any(
                    p.split(": ", 1)[1].startswith("sleep ") for p in processes_with(marker)
                ),
                what="the first command runs",
            )
            shared = await sb.exec(["cat", "/tmp/f"])
            # A daemon that keeps forking: all of it is gone before the exec returns. The
            # exec returns once the daemon has forked (it says so in a file).
            spawner = f"sleep {marker}.5 & touch forking; while :; do sleep {marker}.5 & done"
            started = "while [ ! -e forking ]; do sleep 0.01; done"
            daemon = await sb.exec(["sh", "-c", f"setsid sh -c '{spawner}' & {started}; echo $$"])
            assert processes_with(f"{marker}.5") == []
            seen = [await sb.exec(["python3", "-c", f"{listing}; {mine}"]) for _ in range(3)]
            tg.cancel_scope.cancel()
    assert shared.stdout == b"shared\n"
    assert daemon.stdout.strip() not in (b"", b"1"), daemon
    for each in seen:
        procs, expected, _ = each.stdout.split(b"\n")
        assert procs == expected, each  # its init and itself
        assert procs != b"[1, 1]"
    assert processes_with(marker) == []


async def test_a_command_cannot_leave_its_scheduling_to_the_next(process_root: Path) -> None:
    """A command may renice its init, or pin it to one CPU (same user: no capability
    needed); the next command must not inherit that from an init it shares."""
    # Commands start at the test's own niceness (under `nice -n 10`, 10): a command may
    # only raise it, so the meddling raises it by 7.
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    meddle = (
        f"import os; os.setpriority(os.PRIO_PROCESS, 1, {min(niceness + 7, 19)});"
        " os.sched_setaffinity(1, {min(os.sched_getaffinity(1))})"
    )
    look = "import os; print(os.getpriority(os.PRIO_PROCESS, 0), len(os.sched_getaffinity(0)))"
    cpus = len(os.sched_getaffinity(0))
    async with fast_session(process_root) as s, s.sandbox() as sb:
        for _ in range(3):
            done = await sb.exec(["python3", "-c", meddle])
            assert done.returncode == 0, done
            seen = await sb.exec(["python3", "-c", look])
            assert seen.stdout == f"{niceness} {cpus}\n".encode(), seen


SCHED_ATTR = "=IIQiIQQQII"  # struct sched_attr, as sched_getattr(2) fills it
SCHED_CALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "riscv64": (274, 275)}


async def test_a_command_cannot_leave_its_time_slice_to_the_next(process_root: Path) -> None:
    """A command may set its init's time slice (``sched_setattr``'s ``sched_runtime`` of a
    fair task, Linux 6.12+: same user, no capability); the next command must not inherit
    it from an init it shares. (Held out: it did, before the init compared its whole
    ``sched_attr``.)"""
    calls = SCHED_CALLS.get(os.uname().machine)
    if calls is None:
        pytest.skip(f"sched_setattr's number on {os.uname().machine} is not known here")
    get_attr = (
        "import ctypes, struct; libc = ctypes.CDLL(None, use_errno=True);"
        " buf = ctypes.create_string_buffer(56);"
        f" assert libc.syscall({calls[1]}, PID, buf, 56, 0) == 0;"
        f" print(struct.unpack({SCHED_ATTR!r}, buf.raw)[5])"
    )
    # At its own niceness (lowering it takes a capability), a slice of 2.9 ms.
    set_attr = (
        "import ctypes, os, struct; libc = ctypes.CDLL(None, use_errno=True);"
        " nice = os.getpriority(os.PRIO_PROCESS, 1);"
        f" attr = struct.pack({SCHED_ATTR!r}, 56, 0, 0, nice, 0, 2900000, 0, 0, 0, 0);"
        f" libc.syscall({calls[0]}, 1, attr, 0);"
    )
    async with fast_session(process_root) as s, s.sandbox() as sb:
        fresh = await sb.exec(["python3", "-c", get_attr.replace("PID", "0")])
        assert fresh.returncode == 0, fresh
        meddled = await sb.exec(["python3", "-c", set_attr + get_attr.replace("PID", "1")])
        if meddled.stdout != b"2900000\n":
            pytest.skip(f"this kernel has no time slice to set: {meddled}")
        for _ in range(3):
            seen = await sb.exec(["python3", "-c", get_attr.replace("PID", "0")])
            assert seen.stdout == fresh.stdout, seen
            await sb.exec(["python3", "-c", set_attr])


async def test_a_command_cannot_leave_its_limits_to_the_next(process_root: Path) -> None:
    """A command may lower its init's resource limits (``prlimit`` of a process of the
    same user needs no capability, and no access to its memory: the init being undumpable
    does not stop it); the next command must not inherit them from an init it shares.
    (Held out: the next command ran with the lowered limits before the init compared its
    limits too.)"""
    meddle = (
        "import resource as r; r.prlimit(1, r.RLIMIT_NOFILE, (32, 32));"
        " r.prlimit(1, r.RLIMIT_CPU, (7, 7)); print(r.prlimit(1, r.RLIMIT_NOFILE)[1])"
    )
    look = "import resource as r; print(r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_CPU))"
    async with fast_session(process_root) as s, s.sandbox() as sb:
        fresh = await sb.exec(["python3", "-c", look])
        assert fresh.returncode == 0, fresh
        for _ in range(3):
            done = await sb.exec(["python3", "-c", meddle])
            assert done.stdout == b"32\n", done  # the meddling took
            seen = await sb.exec(["python3", "-c", look])
            assert seen.stdout == fresh.stdout, seen


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass"


async def test_a_commands_cpu_time_is_its_own_and_its_waited_childrens(process_root: Path) -> None:
    """``cpu_time``: what the command's init got from ``wait4`` (the command and the
    children it waited for), not the sandbox's other commands, nor the wall time; None for
    a command that never ran, and on the per-command path, which cannot tell."""
    async with fast_session(process_root) as s, s.sandbox() as sb:
        busy = await sb.exec(["python3", "-c", BUSY.format(0.3)])
        async with anyio.create_task_group() as tg:  # a busy neighbour counts for neither

            async def neighbour() -> None:
                await sb.exec(["python3", "-c", BUSY.format(0.5)])

            tg.start_soon(neighbour)
            idle = await sb.exec(["sleep", "0.2"])
        waited = await sb.exec(["sh", "-c", f"python3 -c '{BUSY.format(0.2)}'; exit 3"])
        missing = await sb.exec(["no-such-program"])
    # (Each at least what it burnt, at most that and an interpreter's start or two more.)
    assert busy.cpu_time == pytest.approx(0.4, abs=0.1), busy
    assert idle.cpu_time == pytest.approx(0.05, abs=0.05), idle
    assert waited.returncode == 3
    assert waited.cpu_time == pytest.approx(0.3, abs=0.1), waited
    assert missing.returncode == 127
    assert missing.cpu_time is None, missing
    options = {"isolation": "native", "fast_path": False}
    async with process.session(process_root, backend_options=options) as s:
        assert (await s.run(["python3", "-c", BUSY.format(0.05)])).cpu_time is None


async def test_an_idle_executor_stops_and_the_next_command_starts_one(process_root: Path) -> None:
    async with fast_session(process_root, executor_idle=0.3) as s, s.sandbox() as sb:
        assert (await sb.exec(["echo", "one"])).stdout == b"one\n"
        handle: Any = sb._life.handle
        first = handle._path.executor
        assert first is not None
        await eventually_async(
            lambda: handle._path.executor is None, within=5, what="the executor stopped when idle"
        )
        with anyio.fail_after(10):
            await first.process.wait()  # it exits once told to
        assert (await sb.exec(["echo", "two"])).stdout == b"two\n"
        assert handle._path.executor is not first


async def test_the_fast_path_leaks_no_descriptors(process_root: Path) -> None:
    """Executors started and stopped, commands with and without stdin, file transfers: our
    process holds no more descriptors afterwards (it leaked one per executor)."""

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def some_sandboxes(s: Session) -> None:
        for _ in range(5):
            async with s.sandbox() as sb:
                await sb.exec(["true"])
                await sb.exec(["cat"], stdin=b"data")
                await sb.write_file("f", b"x")
                assert await sb.read_file("f") == b"x"

    async with fast_session(process_root) as s:
        await some_sandboxes(s)  # warm up (the event loop's own descriptors)
        before = descriptors()
        await some_sandboxes(s)
        assert descriptors() == before
