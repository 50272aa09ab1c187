"""Docker's containers, on a real engine: locked down (no capabilities, no network), their
limits enforced (memory, reported as OOM; a fork bomb contained; the max lifetime, from
inside), a container killed or removed from outside (SandboxDied), and nothing left behind
(256 rollouts at concurrency 32; the sweep after an owner was killed). asyncio only:
aiodocker is asyncio-based (tests/test_docker_engine.py's
test_refuses_trio_with_a_clear_error)."""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable

import anyio
import pytest
from asyncsandbox_docker import DockerAttributes

from asyncsandbox import ExecTimeout, Resources, SandboxDefaults, SandboxDied, Session

from . import _docker_support as docker
from ._docker_support import docker_containers, docker_session, unique_tag
from ._support import (
    docker_backend,
    docker_test_image,
    eventually_async,
    running,
    unique_marker,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]
IMAGE = docker_test_image()

# Docker's fixtures (tests/_docker_support.py), this module's by name: its tests run on
# asyncio, and each is followed by a check that the daemon still answers.
anyio_backend = docker.docker_anyio_backend
daemon_still_answers = docker.docker_daemon_still_answers


async def stopped(*containers: str) -> bool:
    """Whether none of ``containers`` runs any more (a removed one does not)."""
    with anyio.fail_after(30):
        done = await anyio.run_process(
            ["docker", "inspect", "-f", "{{.State.Running}}", *containers], check=False
        )
    return b"true" not in done.stdout.split()


async def test_containers_are_locked_down() -> None:
    tag = unique_tag()
    async with docker_session(tag) as s, s.sandbox() as sb:
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
    async with docker_session(unique_tag()) as s:
        result = await s.run(["python3", "-c", code])
    assert result.returncode != 0
    assert b"Network is unreachable" in result.stderr or b"OSError" in result.stderr


async def test_memory_limit_is_reported_as_oom() -> None:
    defaults = SandboxDefaults(tags=(unique_tag(),), resources=Resources(memory_mb=64))
    async with docker_session("", defaults=defaults) as s, s.sandbox() as sb:
        hog = await sb.exec(
            ["python3", "-c", "x = bytearray(512 * 1024 * 1024); print('no')"], timeout=60
        )
        assert hog.returncode == 137
        assert hog.oom_killed
        ok = await sb.exec(["echo", "alive"])
        assert ok.stdout == b"alive\n"
        assert not ok.oom_killed


async def test_fork_bomb_is_contained() -> None:
    defaults = SandboxDefaults(tags=(unique_tag(),), resources=Resources(pids=64))
    async with docker_session("", defaults=defaults) as s, s.sandbox() as sb:
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
    tag = unique_tag()
    marker = unique_marker()
    defaults = SandboxDefaults(tags=(tag,))
    async with Session(docker_backend(fast_path=fast_path), defaults=defaults, sweep=False) as s:
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
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


async def test_max_lifetime_is_enforced_inside_the_container() -> None:
    tag = unique_tag()
    async with docker_session(tag) as s:
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
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


@pytest.mark.slow  # 256 rollouts
@pytest.mark.timeout(900)  # minutes when CI runs three suites on two cores
async def test_rollouts_at_concurrency_32_leave_nothing() -> None:
    """Done-when: 256 rollouts (create, 5 execs, a file write and read, remove) at
    concurrency 32, zero errors and zero containers left."""
    tag = unique_tag()
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

    async with docker_session(tag) as s:
        async with anyio.create_task_group() as tg:
            for i in range(256):
                tg.start_soon(bounded, s, i)
        stats = s.statistics()
    assert results == {i: f"rollout {i}".encode() for i in range(256)}
    assert stats.sandboxes_started == stats.sandboxes_removed == 256
    assert stats.start_failures == stats.remove_failures == stats.execs_failed == 0
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


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
    tag = unique_tag()
    owner = await anyio.run_process([sys.executable, "-c", OWNER, IMAGE, tag], check=False)
    assert owner.returncode == -signal.SIGKILL, owner.stderr.decode()
    left = docker_containers(f"asyncsandbox.tag.{tag}")
    assert len(left) == 3
    # The owner's connection died with it: each executor saw its stdin close, killed its
    # commands and ended its container (the dead-man's switch of the fast path).
    await eventually_async(lambda: stopped(*left), within=20, what="the containers ended")
    async with Session(docker_backend()):  # sweep=True by default
        pass
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []
