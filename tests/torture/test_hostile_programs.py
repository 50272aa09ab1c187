"""Hostile programs, on every backend: each ends with its documented typed outcome within
its timeout plus a small bound, nothing it started outlives it, and the sandbox is still
usable afterwards (or reported dead) — never a hang.

The fork bomb and the memory hog under default limits live in test_process_limits.py and
test_docker_containers.py; here they run on every backend, next to the rest of the zoo, and on
gVisor (the process backend's gvisor mechanism, Docker with runsc), where the sandbox's
processes are its own kernel's: what still runs in a sandbox is asked of its ``/proc``,
and what outlived it is any host process of its gVisor sandbox."""

from __future__ import annotations

import contextlib
import socket
import time

import anyio
import pytest

from asyncsandbox import (
    ExecResult,
    ExecTimeout,
    Resources,
    Sandbox,
    SandboxDied,
    SandboxOOMKilled,
)

from .._support import (
    Target,
    eventually_async,
    new_process_root,
    processes_gone,
    unique_marker,
)
from . import _host
from ._report import REPORT

# Hostile programs run to their limits (1 GiB of output, fork bombs, timeouts): slow
# (`uv run pytest -m slow`; CI runs them once).
pytestmark = pytest.mark.slow

GIB = 1 << 30


@pytest.fixture
def target(target_or_gvisor: Target) -> Target:
    """Every backend, and gVisor under the process backend (on asyncio and trio) and
    under Docker (asyncio: the Docker backend refuses trio)."""
    return target_or_gvisor


async def gvisor_seen(target: Target, sb: Sandbox) -> None:
    """On gVisor, while the sandbox lives, note what the host's processes of its gVisor
    sandbox carry in their arguments (the process backend: the sandbox's id, in runsc's
    paths; Docker: the container's full id, in its shim's and runsc's), for
    :func:`no_leftovers`."""
    if not target.gvisor:
        return
    carried = sb.id
    if target.name == "docker-runsc":
        assert sb.id is not None
        carried = (await _host.adocker("inspect", "--format", "{{.Id}}", sb.id)).strip()
    assert carried, sb
    target.data.setdefault("gvisor", []).append(carried)


async def usable_or_dead(sb: Sandbox, target: Target, program: str) -> str:
    """The sandbox after a hostile program: it runs a command again, or says it is dead."""
    await gvisor_seen(target, sb)
    try:
        with anyio.fail_after(30 + target.bound):
            again = await sb.exec(["echo", "alive"], timeout=30)
    except SandboxDied:
        return "reported dead"
    assert again.stdout == b"alive\n", f"after {program}: {again}"
    return "usable"


async def still_running(target: Target, sb: Sandbox, marker: str) -> list[str]:
    """Wait up to the target's bound for the processes carrying ``marker`` to be gone;
    return those still there. On gVisor a second command asks the sandbox's ``/proc``
    (gVisor's: every process of the sandbox), by a pattern its own command line does not
    match (``1000[.]5`` finds ``1000.5``, not itself)."""
    if not target.gvisor:
        return await processes_gone(marker, within=target.bound)
    pattern = marker.replace(".", "[.]")
    left: list[str] = []

    async def gone() -> bool:
        ask = await sb.exec(["sh", "-c", f"grep -a -e '{pattern}' /proc/[0-9]*/cmdline"])
        if ask.returncode not in (0, 1) or ask.stderr:
            pytest.fail(f"could not read the sandbox's /proc: {ask}")
        left[:] = ask.stdout.replace(b"\0", b" ").decode(errors="replace").splitlines()
        return not left

    with contextlib.suppress(AssertionError):
        await eventually_async(gone, within=target.bound)
    return left


async def no_leftovers(target: Target, marker: str | None = None) -> None:
    """After the session closed: no sandbox left, no process carrying ``marker``; on
    gVisor, no host process of the sandbox's gVisor (where all of its processes ran: see
    :func:`gvisor_seen`)."""
    seen: list[str] = target.data.get("gvisor", [])
    assert seen or not target.gvisor, "the test noted no gVisor sandbox to look for"
    for carried in ([] if marker is None else [marker]) + seen:
        left = await processes_gone(carried, within=target.bound)
        _host.kill_processes(carried)
        assert left == [], f"processes outlived the sandbox: {left}"
    assert target.leftovers() == []


def record(program: str, target: Target, outcome: str) -> None:
    REPORT.program(program, target.name, outcome)


async def test_fork_bomb(target: Target) -> None:
    # The shell forks once, before the bomb goes off (a subshell lights it), then execs:
    # with the pids limit reached, a fork of its own (dash forks each member of the bomb's
    # first pipeline itself) would fail and end the command at once (status 2).
    bomb = "b() { b | b & }; (b) & exec sleep 100"
    async with target.session(resources=Resources(pids=64)) as s, s.sandbox() as sb:
        started = time.monotonic()
        with pytest.raises(ExecTimeout):
            await sb.exec(["sh", "-c", bomb], timeout=3)
        assert time.monotonic() - started < 3 + target.bound
        after = await usable_or_dead(sb, target, "fork bomb")
        count = await sb.exec(["sh", "-c", "ls /proc | grep -c '^[0-9]'"], timeout=30)
        assert int(count.stdout) < 10, "the bomb's processes survived its timeout"
    record("fork_bomb", target, f"ExecTimeout, sandbox {after}")
    await no_leftovers(target)


async def test_memory_hog(target: Target) -> None:
    hog = "x = bytearray(512 * 1024 * 1024); print('survived')"
    if target.gvisor:
        # What gVisor cannot give: a memory limit per process. memory_mb holds the whole
        # gVisor sandbox on the host (the program's memory is gVisor's, which the host
        # cannot tell apart from its kernel's): a program over it ends the sandbox, a
        # typed infrastructure outcome (never a score), as Docker reports a container
        # killed for memory.
        async with target.session(resources=Resources(memory_mb=64)) as s, s.sandbox() as sb:
            with pytest.raises(SandboxOOMKilled):
                await sb.exec(["python3", "-c", hog], timeout=60)
            after = await usable_or_dead(sb, target, "memory hog")
        record("memory_hog", target, f"SandboxOOMKilled (the gVisor sandbox), sandbox {after}")
        await no_leftovers(target)
        return
    async with target.session(resources=Resources(memory_mb=64)) as s, s.sandbox() as sb:
        result = await sb.exec(["python3", "-c", hog], timeout=60)
        assert result.oom_killed, result
        assert result.returncode == 137
        assert b"survived" not in result.stdout
        after = await usable_or_dead(sb, target, "memory hog")
    record("memory_hog", target, f"oom_killed result, sandbox {after}")
    await no_leftovers(target)


@pytest.mark.timeout(400)  # its exec's own timeout is 300 s: 1 GiB through gVisor (ptrace)
async def test_gibibyte_of_output(target: Target) -> None:
    """1 GiB on stdout: kept head and tail, the true size, our memory untouched."""
    size = GIB
    _host.reset_peak_rss()
    before = _host.rss()
    async with target.session() as s, s.sandbox() as sb:
        started = time.monotonic()
        result = await sb.exec(["head", "-c", str(size), "/dev/zero"], timeout=300)
        elapsed = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        assert result.stdout_truncated
        assert result.stdout_size == size
        assert 0 < len(result.stdout) <= 1024 * 1024
        after = await usable_or_dead(sb, target, "1 GiB output")
    grew = _host.peak_rss() - before
    assert grew < 200 * 1024 * 1024, f"our memory grew by {grew >> 20} MiB for 1 GiB of output"
    record("gib_output", target, f"truncated result in {elapsed:.1f}s, sandbox {after}")
    await no_leftovers(target)


async def test_invalid_utf8_and_binary_output(target: Target) -> None:
    binary = bytes(range(256)) * 4
    script = "printf '\\377\\376\\200ok\\n'; printf '\\300\\301' >&2; cat"
    async with target.session() as s, s.sandbox() as sb:
        result = await sb.exec(["sh", "-c", script], stdin=binary, timeout=30)
        assert result.stdout == b"\xff\xfe\x80ok\n" + binary
        assert result.stderr == b"\xc0\xc1"
        assert "ok" in result.stdout_text  # decoding never raises
        assert result.stderr_text == "\ufffd\ufffd"
        async with sb.exec_stream(["sh", "-c", script], stdin=binary, timeout=30) as run:
            streamed = b"".join([chunk.data async for chunk in run if chunk.stream == "stdout"])
            assert (await run.wait()).returncode == 0
        assert streamed == result.stdout
        after = await usable_or_dead(sb, target, "invalid utf-8")
    record("invalid_utf8", target, f"exact bytes, sandbox {after}")
    await no_leftovers(target)


async def test_infinite_loop(target: Target) -> None:
    async with target.session() as s, s.sandbox() as sb:
        started = time.monotonic()
        with pytest.raises(ExecTimeout) as info:  # 5 s: Python starts slowly on gVisor
            await sb.exec(
                ["python3", "-c", "print('spin', flush=True)\nwhile True: pass"], timeout=5
            )
        elapsed = time.monotonic() - started
        assert 5 <= elapsed < 5 + target.bound
        assert isinstance(info.value, TimeoutError)
        assert info.value.result.timed_out
        assert info.value.result.stdout == b"spin\n"  # the output so far
        after = await usable_or_dead(sb, target, "infinite loop")
    record("infinite_loop", target, f"ExecTimeout after {elapsed:.1f}s, sandbox {after}")
    await no_leftovers(target)


async def test_child_ignoring_sigterm(target: Target) -> None:
    marker = unique_marker()
    script = f"trap '' TERM; (trap '' TERM; sleep {marker}) & sleep {marker}"
    async with target.session() as s, s.sandbox() as sb:
        started = time.monotonic()
        with pytest.raises(ExecTimeout):
            await sb.exec(["sh", "-c", script], timeout=2)
        assert time.monotonic() - started < 2 + target.bound
        left = await still_running(target, sb, marker)
        assert left == [], f"SIGTERM-ignoring processes survived the timeout: {left}"
        after = await usable_or_dead(sb, target, "sigterm ignorer")
    record("sigterm_ignoring_child", target, f"ExecTimeout, tree killed, sandbox {after}")
    await no_leftovers(target, marker)


DAEMONIZE = (
    "setsid sleep {m} & nohup sleep {m} >/dev/null 2>&1 & "
    "python3 -c 'import os, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "time.sleep({m})' & "
    "echo spawned"
)


async def test_daemonized_grandchildren_do_not_outlive_the_exec(target: Target) -> None:
    """setsid, nohup and a double fork: the exec returns when its main process exits (it
    does not wait for the pipes they hold) and they are killed with it."""
    marker = unique_marker()
    async with target.session() as s, s.sandbox() as sb:
        started = time.monotonic()
        result = await sb.exec(["sh", "-c", DAEMONIZE.format(m=marker)], timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout == b"spawned\n"
        assert time.monotonic() - started < target.bound, "the exec waited for its daemons"
        left = await still_running(target, sb, marker)
        assert left == [], f"daemonized processes outlived the exec: {left}"
        # And if one is started by a long-running exec that is then cancelled, the same.
        with anyio.move_on_after(2):
            await sb.exec(["sh", "-c", DAEMONIZE.format(m=marker) + f"; sleep {marker}"])
        left = await still_running(target, sb, marker)
        assert left == [], f"daemonized processes outlived a cancelled exec: {left}"
        after = await usable_or_dead(sb, target, "daemonizer")
    record("daemonized_grandchild", target, f"returned, daemons killed, sandbox {after}")
    await no_leftovers(target, marker)


async def test_daemon_outliving_the_sandbox(target: Target) -> None:
    """A daemon started in a sandbox that is stopped while the exec still runs."""
    marker = unique_marker()
    async with target.session() as s:
        sb = await s.sandbox().start()
        async with sb.exec_stream(
            ["sh", "-c", DAEMONIZE.format(m=marker) + f"; sleep {marker}"]
        ) as run:
            async for _ in run:
                break  # "spawned": everything is up
            await gvisor_seen(target, sb)
            await sb.stop()
            with pytest.raises(Exception) as info:  # noqa: PT011 - the type is checked below
                await run.wait()
            assert type(info.value).__name__ in ("SandboxClosed", "SandboxDied"), info.value
    record("daemon_outliving_sandbox", target, "killed with the sandbox")
    await no_leftovers(target, marker)


async def test_closed_stdout_keeps_running(target: Target) -> None:
    """Closing stdout and stderr is not exiting: the exec waits for the process (its real
    status), and a timeout still kills it."""
    marker = unique_marker()
    async with target.session() as s, s.sandbox() as sb:
        started = time.monotonic()
        result = await sb.exec(["sh", "-c", "exec >&- 2>&-; sleep 1.5; exit 3"], timeout=30)
        assert result.returncode == 3
        assert time.monotonic() - started >= 1.5
        started = time.monotonic()
        with pytest.raises(ExecTimeout):
            await sb.exec(["sh", "-c", f"exec >&- 2>&-; sleep {marker}"], timeout=2)
        assert time.monotonic() - started < 2 + target.bound
        after = await usable_or_dead(sb, target, "closed stdout")
    record("closed_stdout", target, f"real status, then ExecTimeout, sandbox {after}")
    await no_leftovers(target, marker)


async def test_network_attempts_fail(target: Target) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        probe = (
            "import socket\n"
            f"for host, port in (('1.1.1.1', 53), ('127.0.0.1', {port}), ('example.com', 80)):\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=3)\n"
            "        print('reached', host)\n"
            "    except OSError as exc:\n"
            "        print('refused', host, type(exc).__name__)\n"
        )
        async with target.session() as s, s.sandbox() as sb:
            result = await sb.exec(["python3", "-c", probe], timeout=60)
            assert b"reached" not in result.stdout, result.stdout
            assert result.stdout.count(b"refused") == 3, result
            after = await usable_or_dead(sb, target, "network")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's loopback
    record("network_attempts", target, f"unreachable, sandbox {after}")
    await no_leftovers(target)


async def test_disk_filling_writes(target: Target) -> None:
    """Writes that fill the disk: the command fails with ENOSPC, the host's other disks are
    untouched, the sandbox still works once the file is gone. Only the process backend has
    a disk bound here: its root on a small tmpfs (Docker and the remote server's backend
    have no per-sandbox quota; see the README's torture suite section)."""
    if target.name not in ("process", "process-gvisor"):
        pytest.skip(f"the {target.name} backend has no per-sandbox disk quota")
    if not _host.can_mount():
        pytest.skip("mounting a tmpfs needs root")
    from asyncsandbox._process import ProcessBackend

    root = new_process_root("torture-")
    free_before = _host.disk_free("/")
    with _host.tmpfs(root, 48):
        backend = ProcessBackend(root=root, **target.data["options"])
        async with target.session(backend=backend) as s, s.sandbox() as sb:
            started = time.monotonic()
            fill = await sb.exec(
                ["sh", "-c", "dd if=/dev/zero of=fill bs=1M count=512 2>&1; echo rc=$?"],
                timeout=60,
            )
            assert b"No space left" in fill.stdout, fill
            assert time.monotonic() - started < 60
            write_error = None
            try:
                await sb.write_file("more.bin", b"x" * (4 << 20))
            except Exception as exc:  # noqa: BLE001 - checked just below
                write_error = exc
            assert write_error is None or type(write_error).__name__ == "SandboxFileError"
            await sb.exec(["rm", "-f", "fill", "more.bin"], timeout=30)
            await sb.write_file("after.txt", b"room again")
            assert await sb.read_file("after.txt") == b"room again"
        assert [p for p in root.iterdir() if not p.name.startswith(".")] == []
    assert abs(_host.disk_free("/") - free_before) < 256 << 20  # the real disk was not filled
    record("disk_filling", target, "ENOSPC in the command, usable after cleanup")


@pytest.mark.parametrize("program", ["sleep_forever_no_timeout_cancelled"])
async def test_cancelled_endless_command(target: Target, program: str) -> None:
    """An endless command with no timeout, abandoned by its caller (a cancel scope): the
    cancellation is not swallowed and the command is killed."""
    marker = unique_marker()
    async with target.session() as s, s.sandbox() as sb:
        started = time.monotonic()
        with anyio.move_on_after(1) as scope:
            await sb.exec(["sleep", marker])
        assert scope.cancelled_caught
        assert time.monotonic() - started < 1 + target.bound
        assert await still_running(target, sb, marker) == []
        result: ExecResult = await sb.exec(["true"], timeout=30)
        assert result.returncode == 0
        await gvisor_seen(target, sb)
    record(program, target, "cancelled, command killed")
    await no_leftovers(target, marker)
