"""The Docker backend on a real engine. asyncio only: aiodocker is asyncio-based, and the
backend says so (see test_refuses_trio_with_a_clear_error)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from asyncsandbox_docker import DockerAttributes, DockerBackend

from asyncsandbox import (
    ExecTimeout,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    Resources,
    Sandbox,
    SandboxDefaults,
    SandboxDied,
    Session,
    Timeouts,
    WarmPool,
)
from asyncsandbox.testing import CHECKS, Check

from ._support import (
    a_recycled_sandbox_is_fresh,
    docker_pids_squeezed,
    docker_problem,
    docker_test_image,
    episodes_leave_nothing,
    eventually_async,
    processes_with,
    running,
    unique_marker,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]
IMAGE = docker_test_image()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def daemon_still_answers(docker_engine: None) -> Iterator[None]:
    """Fail fast, with the reason, if a test left the daemon wedged. Only after an engine
    answered before the test (``docker_engine``): without one, the test was skipped and
    there is nothing to check."""
    yield
    problem = docker_problem()
    if problem is not None:
        pytest.fail(problem)


def backend(**options: object) -> DockerBackend:
    return DockerBackend(default_image=IMAGE, **options)  # type: ignore[arg-type]


def session(tag: str, **kwargs: object) -> Session:
    defaults = kwargs.pop("defaults", None) or SandboxDefaults(tags=(tag,))
    return Session(backend(), defaults=defaults, sweep=False, **kwargs)  # type: ignore[arg-type]


def containers(label: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode().split()


def unique() -> str:
    return "test-" + uuid.uuid4().hex[:8]


async def stopped(*containers: str) -> bool:
    """Whether none of ``containers`` runs any more (a removed one does not)."""
    with anyio.fail_after(30):
        done = await anyio.run_process(
            ["docker", "inspect", "-f", "{{.State.Running}}", *containers], check=False
        )
    return b"true" not in done.stdout.split()


def blocked_writing(marker: str) -> bool:
    """Whether the host process ``yes MARKER`` is blocked writing to its full pipe."""
    for line in processes_with(marker):
        pid, command = line.split(": ", 1)
        if command.startswith("yes "):
            with contextlib.suppress(OSError):
                return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()
    return False


def squeeze_pids(sandbox: Sandbox) -> AbstractAsyncContextManager[None]:
    """The launch_failure hook: no fork succeeds in the container (tests/_support.py)."""
    return docker_pids_squeezed(sandbox.extra(DockerAttributes.container_id))


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_conformance(check: Check, fast_path: bool) -> None:
    await check.run(lambda: backend(fast_path=fast_path), launch_failure=squeeze_pids)


async def test_commands_cannot_touch_the_executor() -> None:
    """The trust model of the fast path: a command (the sandbox user) can neither signal the
    executor nor reach its file descriptors, so it cannot forge another command's result."""
    probe = textwrap.dedent(
        """
        import os, signal
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        executor = next(p for p in pids if b'serve' in open(f'/proc/{p}/cmdline', 'rb').read())
        try:
            os.kill(int(executor), signal.SIGKILL)
            print('killed')
        except PermissionError:
            print('kill refused')
        try:
            os.open(f'/proc/{executor}/fd/1', os.O_WRONLY)
            print('opened')
        except PermissionError:
            print('fd refused')
        """
    )
    async with session(unique()) as s, s.sandbox() as sb:
        result = await sb.exec(["python3", "-c", probe])
        assert result.stdout == b"kill refused\nfd refused\n", result.stderr
        assert (await sb.exec(["echo", "still served"])).stdout == b"still served\n"


async def test_signals_are_reported_on_the_fast_path() -> None:
    async with session(unique()) as s, s.sandbox() as sb:
        killed = await sb.exec(["sh", "-c", "kill -9 $$"])
        exited = await sb.exec(["sh", "-c", "exit 137"])
    assert (killed.returncode, killed.signal) == (137, 9)
    assert (exited.returncode, exited.signal) == (137, None)


# -- launcher failures are infrastructure errors (issue 18) -----------------------------------


async def launch_error(call: Awaitable[object]) -> LaunchError:
    """The LaunchError that ``call`` raises (the test fails with what it gave instead)."""
    try:
        result = await call
    except LaunchError as exc:
        return exc
    pytest.fail(f"a command that could not start gave a result: {result}")


@pytest.mark.parametrize(
    ("fast_path", "room"),
    [(True, 0), (True, 1), (False, 0)],
    ids=["executor-cannot-fork-a-shepherd", "shepherd-cannot-fork-the-command", "engine-api"],
)
async def test_a_command_that_cannot_be_launched_raises_launch_error(
    fast_path: bool, room: int
) -> None:
    """When our side cannot start a command (here every fork in the container fails), exec
    raises LaunchError, retryable: the command never ran. It returned exit status 137 (the
    shepherd died before the command: "killed"), or 1 (the Engine API shepherd's
    traceback), or hung 10 s and declared the sandbox lost. The sandbox works again once
    forks do."""
    tag = unique()
    defaults = SandboxDefaults(tags=(tag,))
    async with (
        Session(backend(fast_path=fast_path), defaults=defaults, sweep=False) as s,
        s.sandbox() as sb,
    ):
        assert (await sb.exec(["true"])).returncode == 0
        container = sb.extra(DockerAttributes.container_id)
        async with docker_pids_squeezed(container, room=room):
            for stdin in (None, b"some input"):
                error = await launch_error(sb.exec(["echo", "never"], stdin=stdin, timeout=60))
                assert error.retryable
                # On the Engine API path, Docker itself may fail to start the shepherd, or the
                # shepherd its stdin thread.
                expected = "Resource temporarily unavailable|can't start new thread|OCI runtime"
                assert re.search(expected, str(error)), error
        again = await sb.exec(["echo", "launched again"], timeout=60)
        assert again.stdout == b"launched again\n"
        assert s.statistics().execs_failed == 2
    assert containers(f"asyncsandbox.tag.{tag}") == []


async def test_engine_api_results_cannot_be_forged_into_errors() -> None:
    """On the Engine API path, output that looks like Docker's own start failures and the
    launcher's exit status are a command's own outcome, not an infrastructure error (they
    were taken for a dead sandbox, and for an image without python3)."""
    async with (
        Session(backend(fast_path=False), sweep=False) as s,
        s.sandbox() as sb,
    ):
        for code, text in (
            (126, "OCI runtime exec failed: exec failed: unable to start container process"),
            (127, 'exec: "python3": executable file not found in $PATH'),
            (125, "a command may exit 125 too"),
        ):
            result = await sb.exec(["sh", "-c", f"echo '{text}'; exit {code}"])
            assert (result.returncode, result.stdout) == (code, text.encode() + b"\n")
        assert (await sb.exec(["echo", "alive"])).stdout == b"alive\n"


def executor_fds(container_id: str) -> tuple[int, float]:
    """Open fds and CPU seconds of a container's executor (the child of Docker's init)."""
    init = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", container_id],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    proc = Path("/proc")
    children = (proc / init / "task" / init / "children").read_text().split()
    executor = next(p for p in children if b"serve" in (proc / p / "cmdline").read_bytes())
    ticks = (proc / executor / "stat").read_text().rsplit(")", 1)[1].split()[11:13]
    cpu = sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")
    return len(os.listdir(proc / executor / "fd")), cpu


async def test_executor_releases_every_job_and_idles() -> None:
    """Concurrent commands with output (whose status and output pipes reach EOF in any
    order) leave the executor with no fd behind, and an idle executor uses no CPU."""
    async with session(unique()) as s, s.sandbox() as sb:
        container = sb.extra(DockerAttributes.container_id)
        baseline, _ = await anyio.to_thread.run_sync(executor_fds, container)
        async with anyio.create_task_group() as tg:
            for _ in range(8):

                async def worker() -> None:
                    for _ in range(10):
                        result = await sb.exec(["python3", "-c", "print(sum(range(1000)))"])
                        assert result.stdout == b"499500\n"

                tg.start_soon(worker)
        fds, cpu = await anyio.to_thread.run_sync(executor_fds, container)
        await anyio.sleep(1.0)  # the window in which an idle executor must use no CPU
        _, later = await anyio.to_thread.run_sync(executor_fds, container)
    assert fds == baseline
    assert later - cpu < 0.1, "the idle executor keeps polling"


async def test_a_slow_reader_is_not_a_stalled_executor() -> None:
    """A file operation gives up on an executor silent for a call deadline; frames held up
    behind a command whose output nobody reads for longer than that are not silence."""
    tag = unique()
    s = Session(
        DockerBackend(default_image=IMAGE),
        defaults=SandboxDefaults(tags=(tag,)),
        timeouts=Timeouts(operation=2),
        sweep=False,
    )
    marker = unique_marker()
    async with s, s.sandbox() as sb:
        await sb.write_file("f", b"content")
        async with sb.exec_stream(["yes", marker], timeout=60) as flood:
            # Nobody reads the flood: the executor's frames queue up until it stops reading
            # the command's output (backpressure), and `yes` blocks on its full pipe.
            await eventually_async(lambda: blocked_writing(marker), within=30, what="the flood")
            async with anyio.create_task_group() as tg:
                read: list[bytes] = []

                async def reader() -> None:
                    read.append(await sb.read_file("f"))

                tg.start_soon(reader)
                # The read's answer waits behind the flood, past the call deadline (2 s),
                # which must not take the executor for stalled: a deadline that must not
                # fire is shown by waiting past it.
                await anyio.sleep(5)
                # (On a loaded machine the flood may not have filled every buffer yet and
                # the read come back already: then the deadline had nothing to misjudge.)
                async for _ in flood:
                    if read:
                        break
            assert read == [b"content"]
        assert (await sb.exec(["true"])).returncode == 0


def test_prints_nothing_until_logging_is_configured() -> None:
    """A program using the Docker backend writes its own output only: the backend's debug
    events (``docker.connected`` on every Session) were printed on stdout."""
    program = textwrap.dedent(
        """
        import sys, anyio
        from asyncsandbox import Session
        from asyncsandbox_docker import DockerBackend
        async def main():
            async with Session(DockerBackend(default_image=sys.argv[1]), sweep=False) as s:
                result = await s.run(["echo", "only this"])
            sys.stdout.buffer.write(result.stdout)
        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program, IMAGE], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"only this\n"
    assert done.stderr == b""


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_refuses_trio_with_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match=r"does not run on trio.*asyncio.*'process'"):
        async with Session(backend(), sweep=False):
            pass


async def test_containers_are_locked_down() -> None:
    tag = unique()
    async with session(tag) as s, s.sandbox() as sb:
        name = sb.extra(DockerAttributes.container_id)
        inspect = await anyio.run_process(["docker", "inspect", name])
        import json

        config = json.loads(inspect.stdout)[0]
        host = config["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["Init"] is True
        assert host["Memory"] == 1024 * 1024 * 1024
        assert host["PidsLimit"] == 512
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["CapDrop"] == ["ALL"]
        assert config["Config"]["Labels"][f"asyncsandbox.tag.{tag}"] == ""
        assert "asyncsandbox.owner" in config["Config"]["Labels"]
        who = await sb.exec(["sh", "-c", "id -u; echo $HOME; touch /etc/forbidden"])
        assert who.stdout == b"1000\n/home/sandbox\n"
        assert who.returncode != 0  # the sandbox user cannot write system files


async def test_no_network() -> None:
    code = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"
    async with session(unique()) as s:
        result = await s.run(["python3", "-c", code])
    assert result.returncode != 0
    assert b"Network is unreachable" in result.stderr or b"OSError" in result.stderr


async def test_memory_limit_is_reported_as_oom() -> None:
    defaults = SandboxDefaults(tags=(unique(),), resources=Resources(memory_mb=64))
    async with session("", defaults=defaults) as s, s.sandbox() as sb:
        hog = await sb.exec(
            ["python3", "-c", "x = bytearray(512 * 1024 * 1024); print('no')"], timeout=60
        )
        assert hog.returncode == 137
        assert hog.oom_killed
        ok = await sb.exec(["echo", "alive"])
        assert ok.stdout == b"alive\n"
        assert not ok.oom_killed


async def test_fork_bomb_is_contained() -> None:
    defaults = SandboxDefaults(tags=(unique(),), resources=Resources(pids=64))
    async with session("", defaults=defaults) as s, s.sandbox() as sb:
        with pytest.raises(ExecTimeout):
            # The bomb in a background subshell: the shell's one fork comes before it, so
            # its `exec sleep` cannot be refused a fork (dash exits when a fork fails).
            await sb.exec(["sh", "-c", "(b() { b | b & }; b) & exec sleep 100"], timeout=3)
        alive = await sb.exec(["echo", "still here"], timeout=20)
        assert alive.stdout == b"still here\n"
        left = await sb.exec(["sh", "-c", "ls /proc | grep -c '^[0-9]'"], timeout=20)
        assert int(left.stdout) < 10  # the bomb's processes are all gone


@pytest.mark.parametrize("how", ["kill", "rm"], ids=["killed", "removed"])
@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_a_container_gone_from_outside_is_sandbox_died(how: str, fast_path: bool) -> None:
    """Containers killed (``docker kill``) or removed (``docker rm -f``) from outside while
    a command runs in one: that command, and every later call of the others (exec,
    write_file, read_file), raise SandboxDied (the sandbox is gone), never a plain
    InfrastructureError (which says: retry in it) nor an exit status."""
    tag = unique()
    marker = unique_marker()
    defaults = SandboxDefaults(tags=(tag,))
    async with Session(backend(fast_path=fast_path), defaults=defaults, sweep=False) as s:
        busy, *idle = [await s.sandbox().start() for _ in range(4)]
        for sb in idle:
            await sb.write_file("f", b"before")
        outcome: list[BaseException] = []

        async def run() -> None:
            try:
                await busy.exec(["sleep", marker], timeout=60)
            except Exception as exc:  # noqa: BLE001 - the test looks at its type
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually_async(lambda: running("sleep", marker), what="the command runs")
            ids = [sb.extra(DockerAttributes.container_id) for sb in (busy, *idle)]
            command = ["docker", "kill", *ids] if how == "kill" else ["docker", "rm", "-f", *ids]
            with anyio.fail_after(60):
                await anyio.run_process(command)
        assert len(outcome) == 1, outcome
        assert isinstance(outcome[0], SandboxDied), repr(outcome[0])
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "exec": lambda: idle[0].exec(["echo", "hello"]),
            "write_file": lambda: idle[1].write_file("f", b"after"),
            "read_file": lambda: idle[2].read_file("f"),
        }
        later: dict[str, str] = {}
        for what, call in calls.items():
            try:
                later[what] = f"returned {await call()!r}"
            except Exception as exc:  # noqa: BLE001 - the test looks at its type
                later[what] = type(exc).__name__
        assert later == dict.fromkeys(calls, "SandboxDied")
    assert containers(f"asyncsandbox.tag.{tag}") == []


async def test_max_lifetime_is_enforced_inside_the_container() -> None:
    tag = unique()
    async with session(tag) as s:
        sb = await s.sandbox(max_lifetime=2).start()
        started = time.monotonic()
        container = sb.extra(DockerAttributes.container_id)
        # Ended from inside, by its own deadline, within 3.5 s of being started.
        await eventually_async(
            lambda: stopped(container),
            within=started + 3.5 - time.monotonic(),
            what="the container ended at its max lifetime",
        )
        with pytest.raises(SandboxDied, match="max lifetime"):
            await sb.exec(["true"])
        report = await s.gc()
        assert (sb.id, "max lifetime exceeded") in [(info.id, reason) for info, reason in report]
    assert containers(f"asyncsandbox.tag.{tag}") == []


def test_call_deadline_is_gone_with_a_clear_error() -> None:
    """Engine API calls are bounded by Timeouts.operation: the old knob says so."""
    with pytest.raises(InvalidArgument, match=r"Timeouts\(operation=5\)"):
        DockerBackend(call_deadline=5)


async def test_image_errors_are_clear() -> None:
    async with Session(backend(pull="never"), sweep=False) as s:
        with pytest.raises(InvalidArgument, match="not present locally"):
            await s.sandbox(image="asyncsandbox-no-such-image:1").start()


@pytest.fixture
def image_without_python() -> Iterator[str]:
    name = "asyncsandbox-test-nopython:" + uuid.uuid4().hex[:6]
    container = (
        subprocess.run(
            ["docker", "create", "--entrypoint", "sh", IMAGE, "-c", "rm -f /usr/bin/python3*"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .strip()
    )
    try:
        subprocess.run(
            ["docker", "start", "-a", container], check=True, timeout=60, capture_output=True
        )
        subprocess.run(
            ["docker", "commit", container, name], check=True, timeout=60, capture_output=True
        )
    finally:
        subprocess.run(
            ["docker", "rm", "-f", container], timeout=60, capture_output=True, check=False
        )
    yield name
    subprocess.run(["docker", "rmi", "-f", name], timeout=60, capture_output=True, check=False)


@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_image_without_python_is_a_clear_error(
    image_without_python: str, fast_path: bool
) -> None:
    tag = unique()
    defaults = SandboxDefaults(tags=(tag,))
    async with Session(backend(fast_path=fast_path), defaults=defaults, sweep=False) as s:
        with pytest.raises(InvalidArgument, match="has no python3"):
            async with s.sandbox(image=image_without_python) as sb:
                await sb.exec(["true"])
    assert containers(f"asyncsandbox.tag.{tag}") == []


@pytest.mark.slow  # 256 rollouts
@pytest.mark.timeout(900)  # minutes when CI runs three suites on two cores
async def test_rollouts_at_concurrency_32_leave_nothing() -> None:
    """Done-when: 256 rollouts (create, 5 execs, a file write and read, remove) at
    concurrency 32, zero errors and zero containers left."""
    tag = unique()
    results: dict[int, bytes] = {}

    async def rollout(s: Session, i: int) -> None:
        async with s.sandbox() as sb:
            for step in range(5):
                r = await sb.exec(["python3", "-c", f"print({i} * 10 + {step})"], timeout=60)
                assert r.stdout == f"{i * 10 + step}\n".encode()
            await sb.write_file("answer.txt", f"rollout {i}".encode())
            results[i] = await sb.read_file("answer.txt")

    limiter = anyio.CapacityLimiter(32)

    async def bounded(s: Session, i: int) -> None:
        async with limiter:
            await rollout(s, i)

    async with session(tag) as s:
        async with anyio.create_task_group() as tg:
            for i in range(256):
                tg.start_soon(bounded, s, i)
        stats = s.statistics()
    assert results == {i: f"rollout {i}".encode() for i in range(256)}
    assert stats.sandboxes_started == stats.sandboxes_removed == 256
    assert stats.start_failures == stats.remove_failures == stats.execs_failed == 0
    assert containers(f"asyncsandbox.tag.{tag}") == []


OWNER = textwrap.dedent(
    """
    import os, signal, sys, anyio
    from asyncsandbox import Session, SandboxDefaults
    from asyncsandbox_docker import DockerBackend
    async def main():
        defaults = SandboxDefaults(tags=(sys.argv[2],))
        async with Session(DockerBackend(default_image=sys.argv[1]), defaults=defaults, sweep=False) as s:
            sandboxes = [await s.sandbox().start() for _ in range(3)]
            async with sandboxes[0].exec_stream(["sh", "-c", "echo up; exec sleep 1234"]) as run:
                async for _ in run:
                    print("ready", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
    anyio.run(main)
    """
)


async def test_sweep_removes_containers_of_a_killed_owner() -> None:
    tag = unique()
    owner = await anyio.run_process([sys.executable, "-c", OWNER, IMAGE, tag], check=False)
    assert owner.returncode == -signal.SIGKILL, owner.stderr.decode()
    left = containers(f"asyncsandbox.tag.{tag}")
    assert len(left) == 3
    # The owner's connection died with it: each executor saw its stdin close, killed its
    # commands and ended its container (the dead-man's switch of the fast path).
    await eventually_async(lambda: stopped(*left), within=20, what="the containers ended")
    async with Session(backend()):  # sweep=True by default
        pass
    assert containers(f"asyncsandbox.tag.{tag}") == []


# -- the daemon restarting under us -----------------------------------------------------------


def dockerd_pid() -> int | None:
    done = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, check=False)
    pids = done.stdout.split()
    return int(pids[0]) if len(pids) == 1 else None


restartable = pytest.mark.skipif(
    os.environ.get("ASYNCSANDBOX_TEST_DOCKER_RESTART") != "1",
    reason="restarts the Docker daemon: set ASYNCSANDBOX_TEST_DOCKER_RESTART=1 (CI does)",
)


@pytest.mark.slow  # and alone: it takes the daemon from every other user of it
@restartable
async def test_daemon_restart_mid_run_fails_in_flight_work_with_typed_errors() -> None:
    pid = dockerd_pid()
    assert pid is not None, "needs exactly one dockerd, started by hand (as CI does)"
    cmdline = await anyio.Path(f"/proc/{pid}/cmdline").read_bytes()
    command = [arg.decode() for arg in cmdline.split(b"\0") if arg]
    tag = unique()
    errors: list[BaseException] = []

    marker = unique_marker()

    async def long_exec(sb: object) -> None:
        try:
            await sb.exec(["sleep", marker], timeout=90)  # type: ignore[attr-defined]
        except InfrastructureError as exc:
            errors.append(exc)

    started = time.monotonic()
    async with session(tag) as s:
        sandboxes = [await s.sandbox().start() for _ in range(4)]
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(long_exec, sb)
            await eventually_async(
                lambda: running("sleep", marker) == 4, within=60, what="in flight"
            )
            os.kill(pid, signal.SIGTERM)  # a graceful restart, as `systemctl restart docker`
            await eventually_async(lambda: dockerd_pid() is None, within=60, what="it stopped")
            # Detached (through sh) so that it outlives this test like the original did.
            await anyio.run_process(["sh", "-c", 'nohup "$@" >/dev/null 2>&1 &', "sh", *command])

            async def answers() -> bool:
                return await anyio.to_thread.run_sync(docker_problem) is None

            await eventually_async(answers, within=60, what="the daemon answers again")
        assert len(errors) == 4, errors  # every in-flight exec ended with an infrastructure error
        assert time.monotonic() - started < 90  # within the execs' own timeout: nothing hung
    assert containers(f"asyncsandbox.tag.{tag}") == []


def snapshot_images() -> list[str]:
    done = subprocess.run(
        ["docker", "images", "--format", "{{.Tag}}", "asyncsandbox-snapshot"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode().split()


@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_fork_and_snapshots_on_docker(fast_path: bool) -> None:
    tag = unique()
    before = snapshot_images()
    s = Session(backend(fast_path=fast_path), defaults=SandboxDefaults(tags=(tag,)), sweep=False)
    async with s, s.sandbox() as parent:
        await parent.exec(
            ["sh", "-c", "echo repo > f; mkdir -p ~/.cache && echo x > ~/.cache/y; (sleep 1004 &)"],
            check=True,
        )
        listing = ["sh", "-c", "cat f ~/.cache/y; id -u; ps -eo args= | grep -c 'sleep 100[4]'"]
        want = (await parent.exec(listing)).stdout
        children = await parent.fork(3)
        for child in children:
            # Files, owner and home carried; the parent's processes are not.
            assert (await child.exec(listing)).stdout == want.replace(b"\n1\n", b"\n0\n")
        await children[0].write_file("f", "changed")
        assert await children[1].read_file("f") == b"repo\n"
        kept = await parent.snapshot(keep=True)
        async with s.sandbox(from_snapshot=kept) as again:
            assert await again.read_file("f") == b"repo\n"
            # Deleted while a sandbox of it runs: no new sandbox starts from it, and its
            # image goes with the last sandbox of it.
            await s.delete_snapshot(kept)
            with pytest.raises(InvalidArgument, match="no snapshot"):
                await s.sandbox(from_snapshot=kept).start()
        for child in children:
            await child.stop()
    assert snapshot_images() == before
    assert containers(f"asyncsandbox.tag.{tag}") == []


CRASHING_OWNER = """
import os, sys, anyio
from asyncsandbox import Session
from asyncsandbox_docker import DockerBackend
async def main():
    async with Session(DockerBackend(default_image=sys.argv[1]), sweep=False) as s:
        async with s.sandbox() as sb:
            await sb.write_file("note", "x")
            dropped = await sb.snapshot()
            kept = await sb.snapshot(keep=True)
            print(dropped.id, kept.id, flush=True)
            os._exit(9)  # the owner dies: nothing of it runs its cleanup
anyio.run(main)
"""


async def test_gc_deletes_the_snapshot_images_a_crashed_owner_left() -> None:
    done = await anyio.run_process([sys.executable, "-c", CRASHING_OWNER, IMAGE], check=False)
    assert done.returncode == 9, done.stderr.decode()
    dropped, kept = done.stdout.decode().split()
    async with Session(backend(), sweep=False) as s:
        listed = await s.gc(dry_run=True)
        assert [(item.id, why) for item, why in listed if item.id in (dropped, kept)] == [
            (dropped, "owner process is gone")
        ]
        await s.gc()
        assert {dropped, kept} & set(snapshot_images()) == {kept}
        await s.delete_snapshot(kept)
    assert kept not in snapshot_images()


async def test_recycling_is_refused_on_docker_unless_recyclable() -> None:
    s = session(unique(), warm_pool=WarmPool(size=1, recycle=True))
    with pytest.raises(InvalidArgument, match="does not support reset"):
        async with s:
            pass


@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_a_recycled_container_is_indistinguishable_from_a_fresh_one(fast_path: bool) -> None:
    tag = unique()
    s = Session(
        backend(fast_path=fast_path, recyclable=True),
        defaults=SandboxDefaults(tags=(tag,)),
        warm_pool=WarmPool(size=1, recycle=True),
        sweep=False,
    )
    async with s:
        await a_recycled_sandbox_is_fresh(s, within=60)
    assert containers(f"asyncsandbox.tag.{tag}") == []


def test_recyclable_needs_the_sandbox_user() -> None:
    with pytest.raises(InvalidArgument, match="user='sandbox'"):
        backend(recyclable=True, user="root")


@pytest.mark.slow  # 64 episodes (the process backend's, in test_state, are not slow)
@pytest.mark.timeout(600)  # under CI load
async def test_recycling_under_load_hands_over_no_state() -> None:
    s = Session(
        backend(recyclable=True),
        defaults=SandboxDefaults(tags=(unique(),)),
        warm_pool=WarmPool(size=8, recycle=True),
        sweep=False,
    )
    async with s:
        seen = await episodes_leave_nothing(s, episodes=64, concurrency=16)
    assert len(seen) < 64, "no container was reused"


# The host side's names for the frames and files of the in-container agent, each of which
# must mean what the agent means by it.
_AGENT_PROTOCOL = (
    *("FRAME", "START", "STDIN", "STDIN_EOF", "KILL"),  # host -> executor
    *("READY", "STDOUT", "STDERR", "EXIT", "FAILED"),  # executor -> host
)


def test_the_executor_client_speaks_the_agents_protocol() -> None:
    """The frame layout and kinds of ``_executor.py`` (the host) and ``_agent.py`` (the
    container) agree, as do the Engine API path's shepherd paths and status: each side is
    imported, nothing restated, so changing one side alone fails here."""
    from asyncsandbox_docker import _agent, _api_path, _executor

    for name in _AGENT_PROTOCOL:
        host, agent = getattr(_executor, name), getattr(_agent, name)
        if name == "FRAME":
            host, agent = host.format, agent.format
        assert host == agent, f"{name}: the host says {host!r}, the agent {agent!r}"
    kinds = [getattr(_agent, name) for name in _AGENT_PROTOCOL[1:]]
    assert len(set(kinds)) == len(kinds), "two frame kinds share a number"
    for name in ("RUN_DIR", "LAUNCH_FAILED"):
        assert getattr(_api_path, name) == getattr(_agent, name), name


def test_the_private_aiodocker_api_we_use_is_still_there() -> None:
    """The engine's few uses of aiodocker's (and aiohttp's) private API, listed in one place
    (``_engine.PRIVATE_API``), exist in the installed versions with the keyword arguments we
    pass: an upgrade that drops or renames one fails here, not in a sandbox."""
    import inspect

    from asyncsandbox_docker import _engine

    for owner, name, keywords in _engine.PRIVATE_API:
        where = f"{owner.__module__}.{owner.__qualname__}.{name}"
        member = getattr(owner, name, None)
        if member is None:  # an instance attribute: its class's __init__ sets it
            assert name in owner.__init__.__code__.co_names, f"{where} is gone"
            continue
        parameters = inspect.signature(member).parameters
        missing = [k for k in keywords if k not in parameters]
        assert not missing, f"{where} no longer takes {missing}"
