"""The process backend's resource limits: memory and pids under cgroups (which need root),
enforced or refused, never ignored; best-effort limits only by name, and warned about."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from asyncsandbox import (
    ExecTimeout,
    InfrastructureError,
    InvalidArgument,
    Resources,
    SandboxDefaults,
    SandboxOOMKilled,
)
from asyncsandbox._process import ProcessBackend

from . import _process_support as process
from ._process_support import IS_ROOT, session
from ._support import (
    PROCESS_MECHANISMS,
    eventually_async,
    mechanism_unavailable,
    process_options,
    processes_with,
    unique_marker,
)

# The process family's fixture (tests/_process_support.py), this module's by name.
anyio_backend = process.anyio_backend


needs_cgroups = pytest.mark.skipif(not IS_ROOT, reason="cgroup limits need root")


@needs_cgroups
async def test_memory_limit_oom_kills_the_command_not_the_sandbox(process_root: Path) -> None:
    defaults = SandboxDefaults(resources=Resources(memory_mb=64))
    async with session(process_root, defaults=defaults) as s, s.sandbox() as sb:
        hog = await sb.exec(
            ["python3", "-c", "x = bytearray(512 * 1024 * 1024); print('survived')"], timeout=60
        )
        assert hog.oom_killed
        assert hog.returncode == 137
        assert b"survived" not in hog.stdout
        fine = await sb.exec(["python3", "-c", "print('ok')"])
        assert fine.stdout == b"ok\n"
        assert not fine.oom_killed


@needs_cgroups
async def test_an_executor_lost_while_the_sandbox_ran_out_of_memory_says_both(
    process_root: Path,
) -> None:
    """A command whose executor went away (here: killed from outside) while the sandbox
    reached its memory limit (another command OOM-killed) fails with an error saying how
    the executor ended and that memory ran out: what tells the kernel's OOM killer from
    anything else when it happens unasked. (Before: "the executor exited", no more.)"""
    marker = unique_marker()
    options = {"isolation": "native", "fast_path": True}
    defaults = SandboxDefaults(resources=Resources(memory_mb=64, pids=None))
    async with (
        session(process_root, backend_options=options, defaults=defaults) as s,
        s.sandbox() as sb,
    ):
        await sb.exec(["true"])
        handle: Any = sb._life.handle
        launcher = handle._path.executor.process

        async def hog_then_kill() -> None:
            await eventually_async(lambda: processes_with(marker), what="the command runs")
            hog = await sb.exec(["python3", "-c", "x = bytearray(300 << 20)"], timeout=60)
            assert hog.oom_killed, hog
            os.kill(launcher.pid, signal.SIGKILL)

        said = r"killed by SIGKILL\); the command .*; the sandbox reached its memory limit"
        async with anyio.create_task_group() as tg:
            tg.start_soon(hog_then_kill)
            with pytest.raises(InfrastructureError, match=said):
                await sb.exec(["sleep", marker], timeout=60)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the fake proves the policy on trio
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_memory_limit_is_enforced_or_refused_never_ignored(
    mechanism: str, process_root: Path
) -> None:
    """Whoever the owner (root: cgroups; anyone else: none), a sandbox that asks for a
    memory limit either gets it (the hog OOM-killed, 137) or is refused, naming the limit
    and how to get it; a hog that allocates past it and exits 0 is the lie this forbids.
    (Failed as an unprivileged owner before: the hog exited 0.)"""
    if problem := mechanism_unavailable(mechanism):
        pytest.skip(problem)
    options = {**process_options(mechanism), "limits": "enforce"}
    defaults = SandboxDefaults(resources=Resources(memory_mb=64, pids=None))
    hog = "x = bytearray(300 << 20); print('survived')"
    async with session(process_root, backend_options=options, defaults=defaults) as s:
        if "memory_mb" not in s.backend.capabilities.enforced_limits:
            with pytest.raises(InvalidArgument, match="cannot enforce memory_mb") as refused:
                await s.run(["python3", "-c", hog], timeout=60)
            assert "best-effort" in str(refused.value)
            return
        if mechanism == "gvisor":  # the cgroup holds the whole gVisor sandbox (see _gvisor)
            with pytest.raises(SandboxOOMKilled):
                await s.run(["python3", "-c", hog], timeout=60)
            return
        result = await s.run(["python3", "-c", hog], timeout=60)
    assert (result.returncode, result.oom_killed) == (137, True), result
    assert b"survived" not in result.stdout


async def test_best_effort_limits_are_asked_for_by_name_and_warned_about(
    process_root: Path,
) -> None:
    options = {"limits": "best-effort"}
    with capture_logs() as logs:
        async with session(process_root, backend_options=options) as s:
            assert s.backend.capabilities.best_effort_limits
            missing = {"memory_mb", "pids"} - s.backend.capabilities.enforced_limits
            result = await s.run(["true"])
    assert result.returncode == 0
    warned = [log for log in logs if log["event"] == "sandbox.limits.unenforced"]
    assert [sorted(log["limits"]) for log in warned] == ([sorted(missing)] if missing else [])
    with pytest.raises(InvalidArgument, match="limits must be one of enforce, best-effort"):
        ProcessBackend(limits="sometimes")


@needs_cgroups
async def test_fork_bomb_is_contained(process_root: Path) -> None:
    defaults = SandboxDefaults(resources=Resources(pids=64))
    bomb = "b() { b | b & }; (b)"
    async with session(process_root, defaults=defaults) as s, s.sandbox() as sb:
        await sb.exec(["true"])
        group = sb._life.handle._box.cgroup  # type: ignore[union-attr]
        assert group is not None
        with pytest.raises(ExecTimeout):
            # The shell forks once, before the bomb goes off, then `exec`s: a shell that
            # forks again once the bomb filled the pids limit (for `sleep`, or for the
            # second half of the bomb's first pipeline: dash forks each member itself)
            # exits at once ("Cannot fork", status 2) instead of timing out.
            await sb.exec(["sh", "-c", bomb + " & exec sleep 100"], timeout=3)
        after = await sb.exec(["echo", "still here"], timeout=10)
        assert after.stdout == b"still here\n"
        # Nothing is left of the bomb: the processes killed with the exec are gone once
        # the kernel has reaped them, without anyone killing them again. (What stays, on
        # the fast path: the sandbox's executor and its idle command inits.)
        await eventually_async(
            lambda: not commands_in(group._pids()),
            within=10,
            what="the processes of the bomb gone (they outlived their exec)",
        )


def commands_in(pids: set[int]) -> list[bytes]:
    """The command lines of these processes, but the process backend's own."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"asyncsandbox._process._launcher" not in argv:
                found.append(argv)
    return found
