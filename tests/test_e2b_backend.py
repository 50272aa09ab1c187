"""The e2b backend (``Session("e2b")``) against the E2B API of a REAL ``asyncsandbox serve``
on loopback (process backend), on asyncio and trio: the conformance suite, the judge,
warm pools, metrics, snapshots, errors at its boundary; and its shepherd, run for real on
this machine, kills the process trees envd leaves alone.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from asyncsandbox_e2b import E2bAttributes, E2bBackend

from asyncsandbox import (
    BackendUnavailable,
    InvalidArgument,
    RequestNotSent,
    Resources,
    RetryPolicy,
    Sandbox,
    SandboxDied,
    SandboxNotFound,
    SandboxStatus,
    Session,
    Timeouts,
    WarmPool,
)
from asyncsandbox.abc import Backend, SandboxSpec
from asyncsandbox.judge import Program, TestCase, Verdict
from asyncsandbox.testing import CHECKS, Check

from ._support import (
    ALICE,
    BOB,
    Server,
    eventually,
    eventually_async,
    kill_process_sandbox_processes,
    process_launcher_broken,
    serving,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("e2b-backend") / "main") as started:
        yield started


def make(server: Server, key: str = ALICE, **options: Any) -> Callable[[], Backend]:
    """The e2b backend on the server; its sandboxes run with their template's limits (the
    suite's sandboxes ask for the default Resources, which E2B cannot set per sandbox)."""
    options.setdefault("limits", "best-effort")
    return functools.partial(E2bBackend, key, api_url=server.url, sandbox_url=server.url, **options)


def served_id(server: Server, sandbox: Sandbox) -> str:
    """The id of the served backend's sandbox behind an E2B sandbox (the server's own API
    lists it with the label ``e2b.sandbox``)."""
    with server.client() as client:
        answer = client.get("/v1/sandboxes", params={"label": f"e2b.sandbox={sandbox.id}"})
    assert answer.status_code == 200, answer.text
    (item,) = answer.json()["items"]
    return str(item["id"])


# -- conformance --------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
async def test_conformance(server: Server, check: Check) -> None:
    @asynccontextmanager
    async def broken(sandbox: Sandbox) -> AsyncIterator[None]:
        # The served process sandbox's launcher, broken for real (as for the remote
        # backend); the server's error reaches the e2b backend in envd's end event.
        assert server.root is not None
        inner = served_id(server, sandbox)
        async with process_launcher_broken(server.root / inner):
            kill_process_sandbox_processes(inner)
            yield

    if check.name == "launch_failure" and os.geteuid() != 0:
        pytest.skip("breaking the served sandbox's executor goes through its cgroup (root)")
    await check.run(make(server), launch_failure=broken)


# -- configuration and errors at the boundary ----------------------------------------------


async def test_session_by_name_reads_the_sdks_variables(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session("e2b") finds the backend and reads E2B_API_KEY, E2B_API_URL and
    E2B_SANDBOX_URL as E2B's SDK does."""
    monkeypatch.setenv("E2B_API_KEY", ALICE)
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
    monkeypatch.setenv("ASYNCSANDBOX_E2B_LIMITS", "best-effort")
    async with Session("e2b", sweep=False) as session, session.sandbox() as sb:
        result = await sb.exec(["python3", "-c", "print(6 * 7)"])
        assert result.stdout == b"42\n"
        assert sb.extra(E2bAttributes.template) == "base"
        assert sb.extra(E2bAttributes.api_url) == server.url
    assert ALICE not in repr(session.backend)


async def test_a_limit_e2b_cannot_set_is_refused_unless_best_effort(server: Server) -> None:
    """E2B sets no per-sandbox limit (a template fixes them): a sandbox asking for one is
    refused, saying which and how to run anyway; without limits it runs."""
    async with Session(make(server, limits="enforce")(), sweep=False) as session:
        with pytest.raises(InvalidArgument, match="memory_mb, pids") as refused:
            await session.sandbox().start()
        assert "best-effort" in str(refused.value)
        free = Resources(memory_mb=None, pids=None)
        async with session.sandbox(resources=free) as sb:
            assert (await sb.exec(["true"])).returncode == 0
    with pytest.raises(InvalidArgument, match="limits must be one of"):
        E2bBackend("k", limits="lax")


def test_the_backend_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(InvalidArgument, match="E2B_API_KEY"):
        E2bBackend()
    with pytest.raises(InvalidArgument, match="api_url"):
        E2bBackend("k", api_url="ftp://x")


def test_urls_are_derived_as_the_sdk_derives_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN"):
        monkeypatch.delenv(name, raising=False)
    assert E2bBackend("k").api_url == "https://api.e2b.app"
    monkeypatch.setenv("E2B_DOMAIN", "example.org")
    backend = E2bBackend("k")
    assert backend.api_url == "https://api.example.org"
    assert backend.sandbox_url is None


async def test_an_unreachable_api_is_backend_unavailable() -> None:
    # Nothing was sent: RequestNotSent, which the Session's RetryPolicy tries again: the
    # second attempt finds the backend openable still (not "opened once").
    with pytest.raises(RequestNotSent, match="cannot reach") as info:
        async with Session(
            E2bBackend(ALICE, api_url="http://127.0.0.1:9", sandbox_url="http://127.0.0.1:9"),
            retries=RetryPolicy(attempts=2, backoff=0.01),
            sweep=False,
        ):
            pass
    assert isinstance(info.value, BackendUnavailable)
    assert info.value.retryable
    assert isinstance(info.value.__cause__, httpx.HTTPError)  # chained, never raised


def test_the_backend_has_no_deadline_options_of_its_own() -> None:
    with pytest.raises(InvalidArgument, match=r"timeout=.*Timeouts\(operation=5\.0\)"):
        E2bBackend(ALICE, timeout=5.0)
    with pytest.raises(InvalidArgument, match=r"connect_timeout=.*Timeouts\(operation=5\.0"):
        E2bBackend(ALICE, connect_timeout=5.0)


async def test_the_backends_deadlines_are_the_sessions_timeouts(tmp_path: Path) -> None:
    """Timeouts(operation=4): a command silent for 6 s runs to its end (envd keeps its
    stream alive); then the server freezes (SIGSTOP), and a file read, which the runtime
    puts no deadline on, ends with BackendUnavailable once ``operation`` passed without an
    answer. The backend used to wait 60 s there (``E2bBackend(timeout=60.0)``)."""
    with serving(tmp_path / "frozen") as frozen:
        timeouts = Timeouts(operation=4, cleanup=4)
        async with Session(make(frozen)(), timeouts=timeouts, sweep=False) as s, s.sandbox() as sb:
            quiet = await sb.exec(["sh", "-c", "sleep 6; echo quiet"])
            assert quiet.stdout == b"quiet\n"
            frozen.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(BackendUnavailable, match=r"ReadTimeout after 4s of silence"):
                    await sb.read_file("anything")
            finally:
                frozen.process.send_signal(signal.SIGCONT)
            assert (await sb.exec(["echo", "answering again"])).stdout == b"answering again\n"


async def test_a_refused_key_says_so(server: Server) -> None:
    with pytest.raises(BackendUnavailable, match="refused the API key") as info:
        async with Session(make(server, key="e2b_" + "0" * 40)(), sweep=False):
            pass
    assert not info.value.retryable


async def test_another_tenants_sandbox_is_not_found(server: Server) -> None:
    async with Session(make(server)(), sweep=False) as alice, alice.sandbox() as sb:
        assert sb.id is not None
        async with Session(make(server, key=BOB)(), sweep=False) as bob:
            with pytest.raises(SandboxNotFound):
                await bob.backend.attach(sb.id)
            assert sb.id not in [info.id for info in await bob.list()]


async def test_a_sandbox_removed_behind_our_back_died(server: Server) -> None:
    async with Session(make(server)(), sweep=False) as session, session.sandbox() as sb:
        await sb.exec(["true"])
        async with httpx.AsyncClient() as client:
            gone = await client.delete(
                f"{server.url}/sandboxes/{sb.id}", headers={"X-API-KEY": ALICE}
            )
        assert gone.status_code == 204
        with pytest.raises(SandboxDied):
            await sb.exec(["true"])


async def test_a_sandbox_killed_while_its_command_runs_died(server: Server) -> None:
    async def kill_when_running(sb: Sandbox) -> None:
        async def running() -> bool:  # (polling the sandbox: another process)
            return bool((await sb.exec(["sh", "-c", "ls /tmp/running 2>/dev/null"])).stdout)

        await eventually_async(running, within=60, what="the command runs")
        async with httpx.AsyncClient() as client:
            await client.delete(f"{server.url}/sandboxes/{sb.id}", headers={"X-API-KEY": ALICE})

    async with (
        Session(make(server)(), sweep=False) as session,
        session.sandbox() as sb,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(kill_when_running, sb)
        with pytest.raises(SandboxDied):
            await sb.exec(["sh", "-c", "touch /tmp/running; sleep 60"])


async def test_a_workdir_nobody_can_make_is_refused_clearly(server: Server) -> None:
    """The server makes the workdir the e2b backend asks for; a path no user can create
    (under /proc) fails the create, saying why, and leaves nothing."""
    async with Session(make(server)(), sweep=False) as session:
        with pytest.raises(InvalidArgument):
            await session.sandbox(workdir="/proc/nope", tags=["bad-workdir"]).start()
        assert await session.list(tags=["bad-workdir"]) == []


# -- the rest of the API on it ----------------------------------------------------------


async def test_judge_warm_pool_and_metrics(server: Server) -> None:
    """session.judge, a warm pool and the session's metrics, on E2B sandboxes."""
    add = "a, b = map(int, input().split())\nprint(a + b)\n"
    pool = WarmPool(size=2, max_age=600)
    async with Session(make(server)(), sweep=False, warm_pool=pool, report_to=[]) as session:
        result = await session.judge(
            Program(source=add),
            [TestCase(stdin="1 2\n", expected="3\n"), TestCase(stdin="1 1\n", expected="3\n")],
        )
        assert [c.verdict for c in result.cases] == [Verdict.ACCEPTED, Verdict.WRONG_ANSWER]
        await eventually_async(
            lambda: session.statistics().pool_ready >= 2, within=60, what="the pool is ready"
        )
        async with session.sandbox() as sb:
            assert (await sb.exec(["echo", "pooled"])).stdout == b"pooled\n"
        assert session.statistics().pool_hits >= 1
        metrics = session.metrics()
        assert metrics["asyncsandbox/executions"] >= 1
        assert metrics["asyncsandbox/exec_completed_ok"] >= 1


async def test_snapshots_and_fork(server: Server) -> None:
    async with Session(make(server)(), sweep=False) as session, session.sandbox() as sb:
        await sb.write_file("state.txt", b"before")
        snapshot = await sb.snapshot()
        await sb.write_file("state.txt", b"after")
        async with session.sandbox(from_snapshot=snapshot) as copy:
            assert await copy.read_file("state.txt") == b"before"
            assert (await copy.exec(["pwd"])).stdout.decode().strip() == sb.config.workdir
        (child,) = await sb.fork(1)
        async with child:
            assert await child.read_file("state.txt") == b"after"


async def test_the_lease_moves_the_sandboxs_timeout_forward(server: Server) -> None:
    """A sandbox lives on past its first timeout while its owner uses it (the backend
    moves it forward)..."""
    backend = make(server, lease_seconds=2)()
    async with Session(backend, sweep=False) as session, session.sandbox() as sb:
        with anyio.fail_after(60):
            started = anyio.current_time()
            while anyio.current_time() - started < 5:  # two leases and more
                assert (await sb.exec(["true"])).returncode == 0
        assert (await sb.info()).status == SandboxStatus.RUNNING


async def test_an_owner_that_vanished_leaves_nothing_past_a_lease(server: Server) -> None:
    """... and ends within a lease once its owner is gone (here: a backend closed without
    removing its sandbox, as a killed process would leave it)."""
    spec = SandboxSpec(
        image=None,
        env={},
        workdir="/home/user",
        resources=Resources(),
        network="none",
        labels={"test": "vanished"},
        max_lifetime=None,
    )
    async with make(server, lease_seconds=2)() as backend:
        handle = await backend.create(spec)
    async with make(server)() as observer:

        async def gone() -> bool:
            try:
                await observer.attach(handle.id)
            except SandboxNotFound:
                return True
            return False

        await eventually_async(gone, within=30, what="the vanished owner's sandbox ended")


# -- the shepherd, on this machine ------------------------------------------------------


SHEPHERD = Path(__file__).resolve().parent.parent / "backends/e2b/asyncsandbox_e2b/_shepherd.py"


def shepherd(tmp_path: Path, *argv: str, deadline: str = "-") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            SHEPHERD.read_text(),
            deadline,
            "-",
            str(tmp_path),
            *argv,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def ended(run: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    """The shepherd's exit status and stderr, once it exited."""
    _, stderr = run.communicate(timeout=30)
    return run.returncode, stderr


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


DAEMON = "(setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' &); "


def test_the_shepherd_kills_what_the_command_left_behind(tmp_path: Path) -> None:
    run = shepherd(tmp_path, "sh", "-c", DAEMON + "while [ ! -s daemon.pid ]; do :; done; exit 3")
    assert ended(run)[0] == 3
    daemon = int((tmp_path / "daemon.pid").read_text())
    eventually(lambda: not alive(daemon), within=30)


def test_the_shepherd_kills_the_tree_on_sigterm_and_at_its_deadline(tmp_path: Path) -> None:
    run = shepherd(tmp_path, "sh", "-c", DAEMON + "exec sleep 300")
    eventually(
        lambda: (tmp_path / "daemon.pid").exists() and bool((tmp_path / "daemon.pid").read_text()),
        within=30,
    )
    run.send_signal(signal.SIGTERM)
    assert ended(run)[0] == 137
    eventually(lambda: not alive(int((tmp_path / "daemon.pid").read_text())), within=30)
    (tmp_path / "daemon.pid").unlink()
    timed = shepherd(tmp_path, "sh", "-c", DAEMON + "exec sleep 300", deadline="1.5")
    assert ended(timed)[0] == 137
    eventually(lambda: not alive(int((tmp_path / "daemon.pid").read_text())), within=30)


def test_the_shepherd_reports_a_command_that_cannot_start_as_a_shell_does(tmp_path: Path) -> None:
    status, stderr = ended(shepherd(tmp_path, "no-such-program-here"))
    assert status == 127
    assert b"command not found" in stderr
    bad_cwd = subprocess.run(
        [sys.executable, "-I", "-S", "-c", SHEPHERD.read_text(), "-", "-", "/no/such", "true"],
        capture_output=True,
        check=False,
    )
    assert bad_cwd.returncode == 126
    assert b"/no/such" in bad_cwd.stderr
