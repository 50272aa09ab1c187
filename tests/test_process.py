"""The embedded process backend on this machine: isolation, limits, crash safety, scale."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from asyncsandbox import (
    BackendUnavailable,
    ExecTimeout,
    FileErrorReason,
    InfrastructureError,
    InvalidArgument,
    Limits,
    Resources,
    SandboxDefaults,
    SandboxDied,
    SandboxFileError,
    SandboxOOMKilled,
    Session,
)
from asyncsandbox._process import (
    ProcessAttributes,
    ProcessBackend,
    _backend as process_backend,
    _seccomp,
    _select,
)
from asyncsandbox._process._spawn import Pipe
from asyncsandbox.testing import CHECKS, Check

from ._support import (
    PROCESS_MECHANISMS,
    default_process_mechanism,
    eventually,
    eventually_async,
    mechanism_unavailable,
    process_launch_failure,
    process_options,
    processes_with,
    running,
    sandbox_dirs,
    unique_marker,
    watch,
)

IS_ROOT = os.geteuid() == 0


# Real sandboxes, on asyncio: the runtime's policy is proven on both loops on the fake
# backend (test_session.py), and the process backend on trio by the conformance suite
# (test_conformance.py). A test about one loop says which (its parametrization wins).
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def session(
    root: Path,
    *,
    backend_options: Mapping[str, object] | None = None,
    defaults: SandboxDefaults | None = None,
    limits: Limits | None = None,
) -> Session:
    options = {"root": root, **(backend_options or {})}
    return Session(
        "process", backend_options=options, defaults=defaults, limits=limits, sweep=False
    )


# -- isolation ----------------------------------------------------------------------------


async def test_no_network_by_default(process_root: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
        async with session(process_root) as s:
            isolated = await s.run(["python3", "-c", code])
            assert isolated.returncode != 0
            assert b"ConnectionRefused" in isolated.stderr
            shared = await s.run(["python3", "-c", code], network="host")
            assert shared.stdout == b"connected\n", shared.stderr


async def test_host_is_hidden_and_read_only(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as sb:
        assert (await sb.exec(["ls", "/root"])).returncode != 0  # not in the view at all
        assert (await sb.exec(["sh", "-c", "echo x > /usr/owned"])).returncode != 0
        # Root-only host files stay out of the sandbox's /etc (they could not be read
        # through the view either: the sandbox runs as an unprivileged host user).
        shadow = await sb.exec(["cat", "/etc/shadow"])
        assert shadow.returncode != 0
        assert b"No such file" in shadow.stderr
        ident = await sb.exec(["sh", "-c", "id -u; hostname; echo $HOME"])
        assert ident.stdout == b"1000\nsandbox\n/home/sandbox\n"
        ps = await sb.exec(
            [
                "python3",
                "-c",
                "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            ]
        )
        assert max(eval(ps.stdout)) < 10  # its own PID namespace


async def test_sandboxes_do_not_see_each_other(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as a, s.sandbox() as b:
        await a.write_file("/tmp/secret", b"a's")
        await a.write_file("mine.txt", b"a's")
        assert (await b.exec(["ls", "/tmp/secret", "mine.txt"])).returncode != 0
        root_a = a.extra(ProcessAttributes.root)
        assert (root_a / "fs" / "work" / "mine.txt").read_bytes() == b"a's"


async def test_home_and_tmp_persist_across_commands(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as sb:
        await sb.exec(
            ["sh", "-c", "echo 1 > ~/.rc && echo 2 > /tmp/t && mkdir -p pkg && echo 3 > pkg/m"]
        )
        again = await sb.exec(["sh", "-c", "cat ~/.rc /tmp/t pkg/m"])
        assert again.stdout == b"1\n2\n3\n"


async def test_custom_workdir(process_root: Path) -> None:
    async with (
        session(process_root, defaults=SandboxDefaults(workdir="/testbed")) as s,
        s.sandbox() as sb,
    ):
        assert (await sb.exec(["pwd"])).stdout == b"/testbed\n"
        await sb.write_file("f", b"x")
        assert await sb.read_file("/testbed/f") == b"x"
    async with session(process_root, defaults=SandboxDefaults(workdir="/usr/app")) as s:
        with pytest.raises(Exception, match="read-only system directory"):
            await s.sandbox().start()


# -- limits (need cgroups, which need root) -----------------------------------------------

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


# -- cancellation and crash safety --------------------------------------------------------


# On asyncio: the runtime's cancellation is proven on both loops on the fake backend
# (test_session.py), and the process backend's on trio by the conformance suite. Slow: 200
# sandboxes (about 18 s on two cores); cancelling a few mid-exec is in the conformance suite.
@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cancelling_200_sandboxes_mid_exec_leaves_nothing(process_root: Path) -> None:
    """Done-when of the core issue: cancel a task group of 200 sandboxes mid-exec; no
    process and no sandbox directory remain."""
    marker = f"1000.{uuid.uuid4().int % 10**8}"  # a unique `sleep` argument to find leftovers
    script = f"(trap '' TERM; sleep {marker}) & setsid sleep {marker} & echo up; sleep {marker}"
    limits = Limits(max_live=None, max_execs=None)
    async with session(process_root, limits=limits) as s:
        running = 0
        all_running = anyio.Event()

        async def episode() -> None:
            nonlocal running
            async with s.sandbox() as sb, sb.exec_stream(["sh", "-c", script]) as run:
                async for _ in run:
                    running += 1
                    if running == 200:
                        all_running.set()
                    await anyio.sleep_forever()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for _ in range(200):
                    tg.start_soon(episode)
                await all_running.wait()
                assert len(processes_with(marker)) >= 600
                tg.cancel_scope.cancel()
        stats = s.statistics()
        assert stats.sandboxes_started == stats.sandboxes_removed == 200
    assert processes_with(marker) == []
    assert sandbox_dirs(process_root) == []


@pytest.mark.slow  # 1,000 sandboxes, twice (asyncio and trio)
async def test_1000_sandboxes_never_exceed_max_live(process_root: Path) -> None:
    """Done-when of the core issue: 1,000 sandboxes through max_live=64, checked from
    statistics() and from the backend's own directory, all without error."""
    peak_dirs = 0
    outputs: dict[int, bytes] = {}

    def look() -> None:
        nonlocal peak_dirs
        peak_dirs = max(peak_dirs, len(sandbox_dirs(process_root)))

    async def episode(s: Session, i: int) -> None:
        outputs[i] = (await s.run(["sh", "-c", 'echo "$0"', str(i)])).stdout

    async with session(process_root, limits=Limits(max_live=64)) as s:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(watch, look, every=0.002))
            async with anyio.create_task_group() as work:
                for i in range(1000):
                    work.start_soon(episode, s, i)
            tg.cancel_scope.cancel()
        stats = s.statistics()
    assert outputs == {i: f"{i}\n".encode() for i in range(1000)}
    assert stats.live.peak_active == 64
    assert 0 < peak_dirs <= 64
    assert stats.sandboxes_started == stats.sandboxes_removed == 1000
    assert stats.start_failures == stats.remove_failures == 0
    assert sandbox_dirs(process_root) == []


OWNER_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, anyio
    from asyncsandbox import Session, SandboxDefaults
    async def main():
        async with Session("process", backend_options={"root": sys.argv[1]}, sweep=False,
                           defaults=SandboxDefaults(tags=("crash-test",))) as s:
            sandboxes = [await s.sandbox().start() for _ in range(3)]
            async with sandboxes[0].exec_stream(["sh", "-c", "echo up; sleep " + sys.argv[2]]) as run:
                async for _ in run:
                    print("ready", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
    anyio.run(main)
    """
)


def test_sweep_removes_what_a_killed_owner_left(process_root: Path) -> None:
    marker = f"999.{uuid.uuid4().int % 10**8}"
    owner = subprocess.run(
        [sys.executable, "-c", OWNER_SCRIPT, str(process_root), marker],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert owner.returncode == -signal.SIGKILL, owner.stderr.decode()
    assert b"ready" in owner.stdout
    assert len(sandbox_dirs(process_root)) == 3  # the owner died without cleaning up
    # But its commands died with it: the kernel kills them as the owner's death reaches
    # each launcher (parent-death signals), within moments.
    eventually(lambda: not processes_with(marker), within=5, what="its commands died with it")

    async def sweep() -> None:
        async with Session("process", backend_options={"root": process_root}) as s:  # sweep=True
            assert await s.list(tags=["crash-test"]) == []

    anyio.run(sweep)
    assert sandbox_dirs(process_root) == []


# -- isolation mechanisms ------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_pseudo_terminal_opens(mechanism: str, process_root: Path) -> None:
    """The sandbox's own /dev/pts gives terminals to its user (interactive programs, E2B's
    PTY sessions): its /dev/ptmx opens. (The native launcher's devpts had ptmxmode 000:
    openpty failed with EACCES.)"""
    if problem := mechanism_unavailable(mechanism):
        pytest.skip(problem)
    program = "import os; master, slave = os.openpty(); print(os.ttyname(slave))"
    async with session(process_root, backend_options=process_options(mechanism)) as s:
        result = await s.run(["python3", "-c", program], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"/dev/pts/")


# The mechanism is independent of the async library: asyncio suffices here. gVisor, and
# the mechanism ProcessBackend() runs here, run the suite in test_conformance.py (on
# asyncio, and on trio in the slow suite): not twice.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("mechanism", [m for m in PROCESS_MECHANISMS if m != "gvisor"])
async def test_every_mechanism_conforms(mechanism: str, check: Check, process_root: Path) -> None:
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    if mechanism == default_process_mechanism():
        pytest.skip("the default mechanism: test_conformance.py runs the suite on it")
    await check.run(
        lambda: ProcessBackend(root=process_root, **process_options(mechanism)),
        launch_failure=process_launch_failure,
    )


@pytest.fixture
def no_mechanism_cached() -> Iterator[None]:
    """The mechanism is chosen once per process: forget it around a test that changes
    what the machine seems to offer."""
    saved = dict(_select.SELECTED)
    _select.SELECTED.clear()
    yield
    _select.SELECTED.clear()
    _select.SELECTED.update(saved)


async def test_refuses_with_what_is_missing(
    process_root: Path, monkeypatch: pytest.MonkeyPatch, no_mechanism_cached: None
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(BackendUnavailable, match=r"apt-get install bubblewrap"):
        async with session(process_root, backend_options={"isolation": "bwrap"}):
            pass
    # Without bubblewrap, "auto" falls back to the native launcher: same guarantees.
    async with session(process_root, backend_options={"isolation": "auto"}) as s:
        assert s.backend.capabilities.isolation.startswith("native")
        assert "seccomp" in s.backend.capabilities.isolation
    _select.SELECTED.clear()

    def no_libseccomp() -> bytes:
        raise _seccomp.SeccompUnavailable(
            "libseccomp cannot be loaded (apt-get install libseccomp2)"
        )

    monkeypatch.setattr(_seccomp, "program", no_libseccomp)
    with pytest.raises(BackendUnavailable, match=r"libseccomp2.*'seccomp': False"):
        async with session(process_root):
            pass


async def test_weaker_modes_are_asked_for_by_name_and_warned_about(
    process_root: Path, monkeypatch: pytest.MonkeyPatch, no_mechanism_cached: None
) -> None:
    monkeypatch.setattr(process_backend, "_WARNED", set())
    options = {"isolation": "native", "seccomp": False}
    with capture_logs() as logs:
        for _ in range(2):  # warned once per process, not per session
            async with session(process_root, backend_options=options) as s, s.sandbox() as sb:
                status = await sb.exec(["grep", "Seccomp:", "/proc/self/status"])
                assert status.stdout.split() == [b"Seccomp:", b"0"]
                assert "seccomp" not in s.backend.capabilities.isolation
    assert [e["event"] for e in logs].count("process.isolation.weaker") == 1
    # Unisolated: only by name, warned about, and never with network='none' (it cannot be).
    with capture_logs() as logs:
        async with session(process_root, backend_options={"isolation": "none"}) as s:
            with pytest.raises(InvalidArgument, match="network='none'"):
                await s.sandbox().start()
    assert [e["event"] for e in logs].count("process.isolation.none") == 1
    unisolated = SandboxDefaults(network="host")
    async with (
        session(process_root, backend_options={"isolation": "none"}, defaults=unisolated) as s,
        s.sandbox() as sb,
    ):
        assert s.backend.capabilities.isolation.startswith("none")
        assert (await sb.exec(["sh", "-c", "echo unisolated"])).stdout == b"unisolated\n"
        await sb.write_file("f.txt", b"data")
        assert (await sb.exec(["cat", "f.txt"])).stdout == b"data"


def test_bad_isolation_options_are_clear_errors(
    process_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidArgument, match="isolation must be one of auto, bwrap, native"):
        ProcessBackend(root=process_root, isolation="unshare")  # type: ignore[arg-type]
    monkeypatch.setenv("ASYNCSANDBOX_PROCESS_ISOLATION", "chroot")
    with pytest.raises(InvalidArgument, match=r"\$ASYNCSANDBOX_PROCESS_ISOLATION must be"):
        ProcessBackend(root=process_root)
    monkeypatch.delenv("ASYNCSANDBOX_PROCESS_ISOLATION")
    with pytest.raises(InvalidArgument, match="seccomp must be a bool"):
        ProcessBackend(root=process_root, seccomp="no")  # type: ignore[arg-type]
    if IS_ROOT:
        with pytest.raises(InvalidArgument, match="uid_range must be"):
            ProcessBackend(root=process_root, uid_range=(0, 10))


@pytest.mark.skipif(not IS_ROOT, reason="one host uid per sandbox needs root")
async def test_each_live_sandbox_is_its_own_host_user(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as a, s.sandbox() as b:
        owners = {os.stat(sb.extra(ProcessAttributes.root) / "fs" / "work").st_uid for sb in (a, b)}
        assert len(owners) == 2
        assert all(uid >= 0x70000000 for uid in owners)
        await a.exec(["sh", "-c", "echo x > f"])
        host_file = a.extra(ProcessAttributes.root) / "fs" / "work" / "f"
        assert host_file.stat().st_uid in owners
        # The sandbox directories' content is private to their owner on the host.
        fs = a.extra(ProcessAttributes.root) / "fs"
        assert fs.stat().st_mode & 0o077 == 0
    from asyncsandbox._process._uids import REGISTRY

    assert not any((REGISTRY / str(uid)).exists() for uid in owners), (
        "uids stay claimed after their sandboxes were removed"
    )


async def test_python_is_python3_where_the_system_has_only_python3(process_root: Path) -> None:
    """The seeds run "python": in a sandbox of a system without it, it is python3 (as an
    image with python-is-python3), so a reward is never 0 for want of a name."""
    async with session(process_root) as s, s.sandbox() as sb:
        both = await sb.exec(["sh", "-c", "python -c 'import sys; print(sys.version_info[0])'"])
        assert both.stdout == b"3\n", both


ROOTFS = os.environ.get("ASYNCSANDBOX_TEST_ROOTFS")


@pytest.mark.skipif(
    not ROOTFS, reason="set ASYNCSANDBOX_TEST_ROOTFS to a root filesystem (CI does)"
)
async def test_root_filesystem_image(process_root: Path) -> None:
    assert ROOTFS is not None
    async with (
        session(process_root, defaults=SandboxDefaults(image=ROOTFS)) as s,
        s.sandbox() as sb,
    ):
        release = await sb.read_file("/etc/os-release")
        assert release == await anyio.Path(ROOTFS, "etc/os-release").read_bytes()
        assert (await sb.exec(["python3", "-c", "print(2 + 2)"])).stdout == b"4\n"
        assert (await sb.exec(["sh", "-c", "command -v bwrap"])).returncode != 0  # not the host
    async with session(process_root, defaults=SandboxDefaults(image="python:3.12")) as s:
        with pytest.raises(Exception, match="root filesystem directories"):
            await s.sandbox().start()


# -- the fast path: a resident executor per sandbox ------------------------------------------


def fast_session(root: Path, **options: object) -> Session:
    return session(root, backend_options={"isolation": "native", "fast_path": True, **options})


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


# What gVisor's /proc/self/status leaves out: the ambient capabilities (PR_CAP_AMBIENT_IS_SET
# for each) and no_new_privs (PR_GET_NO_NEW_PRIVS).
PRCTL_STATUS = (
    "import ctypes; libc = ctypes.CDLL(None); "
    "print(sum(1 << c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1), "
    "libc.prctl(39, 0, 0, 0, 0))"
)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_command_starts_clean(mechanism: str, process_root: Path) -> None:
    """The command starts as a shell's child would (no signal ignored, caught or blocked,
    a session of its own) and with nothing of its launcher's power (no capability,
    no_new_privs, the seccomp filter): whatever init holds or ignores itself (the Python
    it runs in ignores SIGPIPE and SIGXFSZ; it spawns the command after shedding its
    privileges; the caller may ignore SIGHUP, SIGINT, SIGQUIT), none of it reaches the
    command."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    options = process_options(mechanism)
    # As a trainer under nohup, or in the background of a script: these ignored here.
    inherited = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    saved = {signum: signal.signal(signum, signal.SIG_IGN) for signum in inherited}
    try:
        async with session(process_root, backend_options=options) as s, s.sandbox() as sb:
            status = await sb.exec(["cat", "/proc/self/status"])  # cat catches nothing
            session_leader = await sb.exec(
                ["python3", "-c", "import os; print(os.getsid(0) == os.getpid())"]
            )
            piped = await sb.exec(["sh", "-c", "(yes; echo yes: $? >&2) | head -n 1"])
            asked = await sb.exec(["python3", "-c", PRCTL_STATUS])
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    fields = dict(line.split(":", 1) for line in status.stdout.decode().splitlines())
    seen = {
        name: value.strip()
        for name, value in fields.items()
        if name.startswith(("Sig", "Cap", "NoNewPrivs", "Seccomp"))
    }
    if mechanism == "gvisor":
        # gVisor's status has no signal lines, nor CapAmb nor NoNewPrivs (asked of prctl):
        # the dispositions are shown by the SIGPIPE check below.
        ambient, no_new_privs = asked.stdout.decode().split()
        caps = {name: value for name, value in seen.items() if name.startswith("Cap")}
        assert caps == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd"), "0" * 16)
        assert (ambient, no_new_privs, seen["Seccomp"]) == ("0", "1", "2"), seen
        seen = {
            "SigIgn": "0",
            **dict.fromkeys(("SigCgt", "SigBlk", *caps, "CapAmb"), "0" * 16),
            "NoNewPrivs": "1",
            "Seccomp": "2",
        }
    seen.pop("SigQ", None)
    seen.pop("SigPnd", None)
    seen.pop("Seccomp_filters", None)
    # Nothing ignored but, where the command is spawned (native), the C library's two
    # reserved signals: every posix_spawn of glibc leaves them ignored.
    ignored = int(seen.pop("SigIgn"), 16)
    reserved = sum(1 << (n - 1) for n in set(range(1, signal.NSIG)) - signal.valid_signals())
    assert ignored & ~reserved == 0, seen
    assert seen == {
        "SigCgt": "0000000000000000",
        "SigBlk": "0000000000000000",
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }, status
    if mechanism != "bwrap":  # bubblewrap's session is its own (it has no terminal either)
        assert session_leader.stdout == b"True\n"
    # `yes` died of SIGPIPE (128 + 13), not of a write error it got with SIGPIPE ignored.
    assert (piped.stdout, piped.stderr) == (b"y\n", b"yes: 141\n"), piped


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


async def test_a_killed_executor_is_an_infrastructure_error_then_replaced(
    process_root: Path,
) -> None:
    """The executor killed from outside while a command runs: the command dies with it and
    its exec raises an InfrastructureError (never an exit status); the sandbox goes on
    with a new executor."""
    marker = f"1000.{uuid.uuid4().int % 10**8}"
    async with fast_session(process_root) as s, s.sandbox() as sb:
        await sb.exec(["true"])
        handle: Any = sb._life.handle
        launcher = handle._path.executor.process

        async def kill_when_running() -> None:
            await eventually_async(lambda: processes_with(marker), what="the command runs")
            os.kill(launcher.pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_when_running)
            with pytest.raises(InfrastructureError, match="executor"):
                await sb.exec(["sleep", marker], timeout=30)
        await eventually_async(lambda: not processes_with(marker), within=5, what="it died")
        assert (await sb.exec(["echo", "again"])).stdout == b"again\n"


@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_sandbox_removed_from_outside_is_sandbox_died(
    mechanism: str, process_root: Path
) -> None:
    """Another owner removes the sandboxes (a second backend on the same root, as
    ``asyncsandbox gc`` would: their directories go, their cgroups' processes are killed)
    while a command runs in one and a file transfer in another: those two, and every
    later call of the others (exec, write_file, read_file), raise SandboxDied (the
    sandbox is gone), never a plain InfrastructureError (which says: retry in it), a
    file error nor an exit status. Compare the killed executor above: that sandbox is
    still there, and goes on."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    if os.geteuid() != 0:
        # Known gap: without cgroups, another owner's removal cannot kill the running
        # command's processes, which run on to their timeout (exec: ExecTimeout).
        pytest.skip("a removal from outside kills a sandbox's processes through its cgroup (root)")
    marker = unique_marker()
    options = process_options(mechanism)
    async with session(process_root, backend_options=options) as s:
        busy, feeding, *idle = [await s.sandbox().start() for _ in range(5)]
        for sb in idle:
            await sb.write_file("f", b"before")  # started (and its executor, if any)
        outcome: dict[str, str] = {}
        asked, go = anyio.Event(), anyio.Event()

        async def archive() -> AsyncIterator[bytes]:
            asked.set()  # its script runs, and waits for the archive
            await go.wait()
            yield bytes(10240)  # an empty tar archive

        async def run(what: str, call: Callable[[], Awaitable[object]]) -> None:
            try:
                outcome[what] = f"returned {await call()!r}"
            except Exception as exc:  # noqa: BLE001 - the test looks at its type
                outcome[what] = repr(exc)

        async with (
            ProcessBackend(root=process_root, **options) as other,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(run, "exec", lambda: busy.exec(["sleep", marker], timeout=60))
            tg.start_soon(run, "put_archive", lambda: feeding.put_archive("d", archive()))
            if mechanism == "gvisor":
                # Its processes are gVisor's kernel's, not the host's: asked of the
                # sandbox's /proc by a second command, whose own command line the pattern
                # does not match (``1000[.]5`` finds ``1000.5``).
                pattern = marker.replace(".", "[.]")
                ask = ["sh", "-c", f"grep -a -l -e '{pattern}' /proc/[0-9]*/cmdline"]

                async def runs() -> bool:
                    return (await busy.exec(ask)).returncode == 0

                await eventually_async(runs, what="the command runs")
            else:
                # The command itself (not its launcher, whose arguments carry the marker).
                await eventually_async(lambda: running("sleep", marker), what="the command runs")
            await asked.wait()
            for sb in (busy, feeding, *idle):
                assert sb.id is not None
                await (await other.attach(sb.id)).remove()
            go.set()
        assert {what: said.split("(")[0] for what, said in outcome.items()} == {
            "exec": "SandboxDied",
            "put_archive": "SandboxDied",
        }, outcome
        calls = (
            lambda: idle[0].exec(["echo", "hello"]),
            lambda: idle[1].write_file("f", b"after"),
            lambda: idle[2].read_file("f"),
        )
        for call in calls:
            with pytest.raises(SandboxDied, match="removed"):
                await call()
    assert sandbox_dirs(process_root) == []


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


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_command_outlives_the_thread_that_started_it(
    mechanism: str, process_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher dies with the thread that forked it (PR_SET_PDEATHSIG, bwrap's
    --die-with-parent). trio forks its subprocesses in a worker thread that exits after ten
    idle seconds (0.2 s here): every command running longer was SIGKILLed (status 137)."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    import trio

    monkeypatch.setattr(trio._core._thread_cache, "IDLE_TIMEOUT", 0.2)
    async with (
        session(process_root, backend_options=process_options(mechanism)) as s,
        s.sandbox() as sb,
    ):
        result = await sb.exec(["sh", "-c", "sleep 1.5; echo done"], timeout=30)
        assert (result.returncode, result.stdout) == (0, b"done\n")
        result = await sb.exec(["echo", "again"], timeout=30)
        assert (result.returncode, result.stdout) == (0, b"again\n")


@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_file_error_is_judged_on_all_it_said(mechanism: str, process_root: Path) -> None:
    """A file operation's script says why it failed on stderr, then exits; its reason was
    taken from whatever stderr had been read when the exit was seen (nothing, at times:
    PERMISSION became OTHER; busy event loops made it likelier, hence several sandboxes)."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    reasons: list[FileErrorReason] = []

    async def refused_writes(s: Session) -> None:
        async with s.sandbox() as sb:
            await sb.write_file("locked/f", b"x")
            await sb.exec(["chmod", "a-w", "locked/f", "locked"])
            for _ in range(40):
                with pytest.raises(SandboxFileError) as caught:
                    await sb.write_file("locked/f", b"y")
                reasons.append(caught.value.reason)

    async with (
        session(process_root, backend_options=process_options(mechanism)) as s,
        anyio.create_task_group() as tg,
    ):
        for _ in range(6):
            tg.start_soon(refused_writes, s)
    assert set(reasons) == {FileErrorReason.PERMISSION}


async def test_a_pipe_closed_under_its_reader_leaves_its_number_alone() -> None:
    """Closing a pipe that a task waits on, then waiting on a new descriptor that took its
    number: the new wait must still wake. On anyio's asyncio backend the first waiter,
    resuming late, unregistered the new descriptor's wait (a new executor's stderr was
    waited on forever: 1,000 sandboxes through max_live=64 hung at random)."""
    first_r, first_w = os.pipe()
    first = Pipe(first_r)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.receive)
        await anyio.wait_all_tasks_blocked()  # the reader waits
        first.close()
        second_r, second_w = os.pipe()
        second = Pipe(second_r)

        async def write_once_waited_on() -> None:
            # Once the first reader has resumed (late: after the second wait began, below)
            # and the second one waits.
            await anyio.wait_all_tasks_blocked()
            os.write(second_w, b"x")

        tg.start_soon(write_once_waited_on)
        with anyio.fail_after(5):
            assert await second.receive() == b"x"
    second.close()
    for fd in (first_w, second_w):
        os.close(fd)


@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_an_exit_status_reaped_by_someone_else_is_an_error_never_a_zero(
    mechanism: str, process_root: Path
) -> None:
    """With SIGCHLD ignored (some libraries do it to avoid zombies) the kernel reaps our
    launchers itself and their exit status is gone: ``Popen.poll`` then says 0, and a
    failing command passed. The executor's commands report through its socket and keep
    their status; a launcher's is an InfrastructureError."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    async with (
        session(process_root, backend_options=process_options(mechanism)) as s,
        s.sandbox() as sb,
    ):
        await sb.exec(["true"])  # the executor (if any) started while SIGCHLD is default
        previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        try:
            if mechanism in ("executor", "gvisor"):
                assert (await sb.exec(["sh", "-c", "exit 3"])).returncode == 3
            else:
                with pytest.raises(InfrastructureError, match="exit status is lost"):
                    await sb.exec(["sh", "-c", "exit 3"])
        finally:
            signal.signal(signal.SIGCHLD, previous)
        assert (await sb.exec(["sh", "-c", "exit 3"])).returncode == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_default_mechanism_is_the_one_left_to_test_conformance(
    process_root: Path,
) -> None:
    """test_every_mechanism_conforms leaves the default mechanism to test_conformance.py,
    which runs the suite on ``ProcessBackend()``: they are the same here."""
    mechanism = default_process_mechanism()
    if mechanism is None:
        pytest.skip("ProcessBackend() here is bubblewrap with the native executor: no entry")
    options = process_options(mechanism)
    backends = ProcessBackend(root=process_root), ProcessBackend(root=process_root, **options)
    seen = []
    for backend in backends:
        async with Session(backend) as s, s.sandbox() as sb:
            assert sb.id is not None
            seen.append((backend.capabilities, type(backend._handles[sb.id]._path).__name__))
    assert seen[0] == seen[1]
