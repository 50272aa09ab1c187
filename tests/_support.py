"""What the test modules share: waiting for a condition, the host's processes, the process
backend's roots and mechanisms, the Docker engine, a real ``asyncsandbox serve``, and the
episodes that recycling must leave nothing of.

The one place for helpers used by more than one test module (test modules never import
each other: tests/test_suite_hygiene.py checks it). Fixtures stay in ``conftest.py``.

Waiting: a test never sleeps to let another task or process get somewhere. It waits for
an event, for ``anyio.wait_all_tasks_blocked()``, or for a condition it can observe, polled
under a deadline with :func:`eventually` (blocking callers) or :func:`eventually_async`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from asyncsandbox import (
    Limits,
    Resources,
    RetryPolicy,
    Sandbox,
    SandboxDefaults,
    Session,
    Timeouts,
)
from asyncsandbox._process._backend import default_root
from asyncsandbox.abc import Backend

# -- waiting for a condition ----------------------------------------------------------------

POLL_INTERVAL = 0.02
"""How often a condition is looked at again (what another process does cannot be awaited)."""


def eventually(
    predicate: Callable[[], object], *, within: float = 10.0, what: str = "the condition"
) -> None:
    """Return once ``predicate()`` is true; fail the test if it is not within ``within``
    seconds (a bound on a failure, never a measure of speed). For blocking callers."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {within:g}s: {what}")
        time.sleep(POLL_INTERVAL)


async def eventually_async(
    predicate: Callable[[], object | Awaitable[object]],
    *,
    within: float = 10.0,
    what: str = "the condition",
) -> None:
    """:func:`eventually` for async callers: ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + within
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {within:g}s: {what}")
        await anyio.sleep(POLL_INTERVAL)


async def watch(look: Callable[[], object], *, every: float = POLL_INTERVAL) -> None:
    """Call ``look()`` every ``every`` seconds until cancelled: an observer that samples
    what it cannot be told about (the host's processes, a directory), waiting for nothing."""
    while True:
        look()
        await anyio.sleep(every)


# -- the host's processes -------------------------------------------------------------------


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


# -- the process backend ----------------------------------------------------------------------


def new_process_root(prefix: str = "") -> Path:
    """A fresh sandbox root for the process backend. pytest's tmp_path is not reachable by
    the unprivileged sandbox user, so it lives next to the default root."""
    root = default_root().parent / "tests" / (prefix + uuid.uuid4().hex[:10])
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    return root


def sandbox_dirs(root: Path) -> list[str]:
    """The sandboxes (their directories) under a process backend's root."""
    try:
        return sorted(name for name in os.listdir(root) if not name.startswith("."))
    except FileNotFoundError:
        return []


PROCESS_MECHANISMS = ("bwrap", "native", "executor", "gvisor")
"""``bwrap`` and ``native``: a launcher per command. ``executor``: the native launcher's
resident executor (the fast path), where commands run in namespaces of their own inside
long-lived ones. ``gvisor``: the executor inside a gVisor sandbox (runsc). Tests of the
process backend's isolation run on each one the machine has."""


def process_options(mechanism: str) -> dict[str, Any]:
    """The process backend's options that select ``mechanism``."""
    if mechanism == "executor":
        return {"isolation": "native", "fast_path": True}
    if mechanism == "gvisor":
        return {"isolation": "gvisor", "fast_path": True}
    return {"isolation": mechanism, "fast_path": False}


def default_process_mechanism() -> str | None:
    """Which of :data:`PROCESS_MECHANISMS` ``ProcessBackend()`` is here, if one: without
    bubblewrap, the native launcher's resident executor (the fast path is on by default);
    with it, bubblewrap with the native executor's commands, which no entry names; or the
    mechanism ``$ASYNCSANDBOX_PROCESS_ISOLATION`` forces (bubblewrap, forced, is that
    pair too)."""
    mode = os.environ.get("ASYNCSANDBOX_PROCESS_ISOLATION") or "auto"
    if mode == "auto":
        mode = "bwrap" if shutil.which("bwrap") else "native"
    return {"bwrap": None, "native": "executor"}.get(mode, mode)


def mechanism_unavailable(mechanism: str) -> str | None:
    """Why ``mechanism`` does not run here (a skip reason), or None."""
    forced = os.environ.get("ASYNCSANDBOX_PROCESS_ISOLATION")
    if forced and forced != process_options(mechanism)["isolation"]:
        return f"ASYNCSANDBOX_PROCESS_ISOLATION={forced} forces another mechanism"
    if mechanism == "bwrap" and shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    if mechanism == "gvisor":
        return gvisor_unavailable()
    return None


def gvisor_unavailable() -> str | None:
    """Why the gvisor mechanism does not run here (a skip reason), or None; with
    ``ASYNCSANDBOX_REQUIRE_GVISOR=1`` (CI, where runsc is installed) the test fails instead."""
    problem = None
    if shutil.which("runsc") is None:
        problem = "gVisor's runsc is not installed (Debian/Ubuntu: apt-get install runsc)"
    elif os.geteuid() != 0:
        problem = "the gvisor mechanism needs root"
    if problem is not None and os.environ.get("ASYNCSANDBOX_REQUIRE_GVISOR") == "1":
        pytest.fail(f"gVisor is required (ASYNCSANDBOX_REQUIRE_GVISOR=1): {problem}")
    return problem


@asynccontextmanager
async def process_launcher_broken(sandbox_dir: Path) -> AsyncIterator[None]:
    """While inside, the process sandbox at ``sandbox_dir`` (on the host) cannot be set up:
    its ``/tmp`` is taken away on the host, so every mechanism fails to bind it into the
    sandbox's view (bubblewrap: "Can't find source path"; the native launcher: its mount
    fails) and the command never runs. Put back on exit."""
    tmp = anyio.Path(sandbox_dir, "fs", "tmp")
    aside = anyio.Path(sandbox_dir, "fs", "tmp.broken")
    await tmp.rename(aside)
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await aside.rename(tmp)


def kill_process_sandbox_processes(sandbox_id: str) -> int:
    """SIGKILL every process of a process sandbox, through its cgroup (root only: that is
    where the backend has cgroups); return how many were signalled."""
    killed = 0
    # os.walk, not Path.glob("**"): cgroups come and go under the walk (the sandbox's own,
    # once its processes are dead), and a glob fails on a directory that vanished.
    for directory, subdirectories, _ in os.walk("/sys/fs/cgroup"):
        path = Path(directory)
        if path.name != sandbox_id or path.parent.name != "asyncsandbox":
            continue
        subdirectories.clear()
        try:
            pids = (path / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


@asynccontextmanager
async def process_launch_failure(sandbox: Sandbox) -> AsyncIterator[None]:
    """The conformance suite's launch_failure hook for a local process sandbox: its
    launcher broken (above), and its resident executor, if it has one, stopped, so that
    the next command needs a new one, which cannot be set up."""
    from asyncsandbox._process import ProcessAttributes

    async with process_launcher_broken(sandbox.extra(ProcessAttributes.root)):
        handle: Any = sandbox._life.handle
        await handle.stop_executor()
        yield


# -- Docker -----------------------------------------------------------------------------------
#
# Docker tests need an engine. Without one they skip, unless ASYNCSANDBOX_REQUIRE_DOCKER=1
# (CI sets it), which turns the skip into a failure. A wedged daemon (Docker 20.10 can stop
# answering `info`, moby/moby#46661) fails the test at once instead of hanging the run.

DOCKER_INFO_DEADLINE = 20


def docker_problem() -> str | None:
    """None if the Docker daemon answers `info` in time, else what is wrong."""
    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=DOCKER_INFO_DEADLINE,
            check=False,
        )
    except FileNotFoundError:
        return "the docker CLI is not installed"
    except subprocess.TimeoutExpired:
        return (
            f"the Docker daemon did not answer `docker info` within {DOCKER_INFO_DEADLINE}s: "
            "it is wedged (Docker 20.10: moby/moby#46661); restart it"
        )
    if done.returncode != 0:
        return "no Docker engine answers: " + done.stderr.decode(errors="replace").strip()
    return None


def require_docker() -> None:
    """Skip the calling test without a Docker engine; fail it instead when
    ``ASYNCSANDBOX_REQUIRE_DOCKER=1`` (CI)."""
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("ASYNCSANDBOX_REQUIRE_DOCKER") == "1":
        pytest.fail(f"Docker is required (ASYNCSANDBOX_REQUIRE_DOCKER=1): {problem}")
    pytest.skip(problem)


def require_runsc_runtime() -> None:
    """Skip the calling test when the Docker daemon has no ``runsc`` runtime (see
    ``.ci/docker.sh``); fail it instead with ``ASYNCSANDBOX_REQUIRE_GVISOR=1`` (CI)."""
    require_docker()
    done = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if b'"runsc"' not in done.stdout:
        problem = "the Docker daemon has no runsc runtime (see .ci/docker.sh)"
        if os.environ.get("ASYNCSANDBOX_REQUIRE_GVISOR") == "1":
            pytest.fail(f"gVisor is required (ASYNCSANDBOX_REQUIRE_GVISOR=1): {problem}")
        pytest.skip(problem)


def docker_test_image() -> str:
    """The image Docker tests use: $ASYNCSANDBOX_TEST_IMAGE (CI builds one from Debian
    packages), else a public python image that a normal Docker install pulls."""
    return os.environ.get("ASYNCSANDBOX_TEST_IMAGE", "python:3.12-slim")


def _pids_current(pid: int) -> int:
    """Tasks in the pids cgroup of host process ``pid`` (cgroup v1 or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return int(Path(f"/sys/fs/cgroup/pids{path}/pids.current").read_text())
        if hierarchy == "0" and not controllers:
            unified = Path(f"/sys/fs/cgroup{path}/pids.current")
            if unified.exists():
                return int(unified.read_text())
    raise RuntimeError(f"no pids cgroup found for process {pid}")


@asynccontextmanager
async def docker_pids_squeezed(container: str, *, room: int = 0) -> AsyncIterator[None]:
    """While inside, the container can start only ``room`` more tasks: its pids limit is
    set to what runs in it now plus ``room`` (``docker update``), then restored.

    A real launcher failure of a Docker sandbox: forks fail with EAGAIN, so the executor
    cannot fork a command's shepherd (``room=0``), or the shepherd cannot fork the command
    (``room=1``); an Engine API exec's first process is still moved into the container
    (cgroups refuse forks, not moves), and its fork of the command fails.
    """
    inspect = await anyio.run_process(
        ["docker", "inspect", "-f", "{{.State.Pid}} {{.HostConfig.PidsLimit}}", container]
    )
    pid, configured = inspect.stdout.decode().split()
    original = configured if configured.lstrip("-").isdigit() and configured != "0" else "-1"
    limit = 1 if room == 0 else _pids_current(int(pid)) + room
    await anyio.run_process(["docker", "update", "--pids-limit", str(limit), container])
    try:
        yield
    finally:
        # Shielded and bounded: the container must get its limit back whatever happened.
        with anyio.CancelScope(shield=True), anyio.fail_after(60):
            await anyio.run_process(["docker", "update", "--pids-limit", original, container])


# -- a real server --------------------------------------------------------------------------

ALICE = "alice-" + secrets.token_hex(16)
BOB = "bob-" + secrets.token_hex(16)


class Server:
    """``asyncsandbox -vv serve ...`` in a subprocess, on a free loopback port."""

    def __init__(
        self, directory: Path, *args: str, backend: str = "process", root: Path | None = None
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.keys = directory / "keys.txt"
        self.keys.write_text(f"# test tenants\nalice:{ALICE}\nbob:{BOB}\n")
        self.log = directory / f"server-{uuid.uuid4().hex[:6]}.log"
        self.root = root
        command = [
            sys.executable,
            "-m",
            "asyncsandbox",
            "-vv",
            "serve",
            "--backend",
            backend,
            "--listen",
            "127.0.0.1:0",
            "--print-url",
            "--keys",
            str(self.keys),
            *(["--backend-option", f"root={root}"] if root is not None else []),
            *args,
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:  # select() fails past fd 1023
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(60)
        line = self.process.stdout.readline().decode() if ready else ""
        if not line.startswith(("http://", "https://")):
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"the server did not start:\n{self.logs()[-3000:]}")
        # --print-url: the URL alone on stdout (the log line goes to stderr).
        self.url = line.strip()
        self.first_line = line

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        try:
            if self.process.poll() is None:
                self.process.send_signal(sig)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                    raise
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
        return self.process.returncode

    def sandbox_dirs(self) -> list[str]:
        assert self.root is not None
        return sandbox_dirs(self.root)

    def client(self, key: str | None = ALICE) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def backend(self, key: str = ALICE, **options: Any) -> Callable[[], Backend]:
        from asyncsandbox_remote import RemoteBackend

        return functools.partial(RemoteBackend, self.url, key, **options)


class TcpProxy:
    """A TCP proxy on loopback in front of a server's port, that breaks the client's
    connections on demand: real faults on the client's path, the server untouched.

    * :meth:`drop`: the next ``n`` connections are closed as soon as they are accepted.
      In front of a TLS server their handshake fails, so their request is never sent
      (httpx raises ``ConnectError``).
    * :meth:`cut`: close every connection open now (idle pooled ones, and requests in
      flight, which reached the server and lose their answers).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        """Connections accepted so far."""
        self.dropped = 0
        """Connections closed by :meth:`drop`."""
        self._drop = 0
        self._live: dict[anyio.CancelScope, anyio.Event] = {}

    def url(self, scheme: str = "https") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def drop(self, n: int) -> None:
        """Drop the next ``n`` connections (0: none); what was dropped so far stays counted."""
        self._drop = n

    async def cut(self) -> None:
        """Close every connection open now, and return once they are closed."""
        closed = list(self._live.values())
        for scope in list(self._live):
            scope.cancel()
        for event in closed:
            await event.wait()

    async def _pipe(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, tg: anyio.abc.TaskGroup
    ) -> None:
        try:
            async for data in source:
                await sink.send(data)
            await sink.send_eof()  # a half-close, passed on
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            tg.cancel_scope.cancel()  # one side broke: so does the other

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        scope, closed = anyio.CancelScope(), anyio.Event()
        self._live[scope] = closed
        try:
            async with client:
                if self._drop > 0:
                    self._drop -= 1
                    self.dropped += 1
                    return
                with scope:
                    upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
                    async with upstream, anyio.create_task_group() as tg:
                        tg.start_soon(self._pipe, client, upstream, tg)
                        tg.start_soon(self._pipe, upstream, client, tg)
        finally:
            del self._live[scope]
            closed.set()

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)


@asynccontextmanager
async def tcp_proxy(upstream_port: int) -> AsyncIterator[TcpProxy]:
    """A :class:`TcpProxy` serving for the duration of the block."""
    proxy = TcpProxy(upstream_port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()


# -- recycling: what an episode leaves, and what a fresh sandbox looks like ----------------------


def plant(marker: str) -> str:
    """A script that leaves something in every writable place an episode reaches: files
    (workdir, /tmp, /dev/shm, the home's dotfiles and what `pip install --user` writes),
    processes (a daemon in its own session, a cron-like loop appending to a file whose
    command line carries ``marker``, one ignoring SIGTERM), IPC objects (a System V message
    queue and semaphore, POSIX shared memory), and the environment later commands start
    with (a login shell's profile)."""
    return textwrap.dedent(
        r"""
        set -e
        echo planted > /workspace/planted
        mkdir -p /workspace/deep/er && echo x > /workspace/deep/er/file
        echo planted > /tmp/planted
        echo planted > /dev/shm/planted 2>/dev/null || true
        echo 'export PLANTED=1' >> ~/.profile
        echo 'export PLANTED=1' >> ~/.bashrc
        mkdir -p ~/.local/lib/python3/site-packages && echo 'x = 1' > ~/.local/lib/python3/site-packages/planted.py
        setsid sh -c 'while :; do date +%s%N >> /tmp/loop; sleep 0.05; done' MARKER </dev/null >/dev/null 2>&1 &
        (trap '' TERM HUP; exec sleep 1001) </dev/null >/dev/null 2>&1 &
        nohup sleep 1002 </dev/null >/dev/null 2>&1 &
        python3 - <<'PY'
        import os, sys
        try:
            from multiprocessing import shared_memory
            shared_memory.SharedMemory(name="planted", create=True, size=4096).close()
        except Exception as exc:
            print("no posix shm:", exc, file=sys.stderr)
        PY
        if command -v ipcmk >/dev/null; then ipcmk -Q >/dev/null; ipcmk -S 1 >/dev/null; fi
        echo done
        """
    ).replace("MARKER", f"loop-{marker}")


LOOK = textwrap.dedent(
    r"""
    echo "files: $(find /workspace /tmp ~ -mindepth 1 2>/dev/null | sort | tr '\n' ' ')"
    echo "shm: $(ls -A /dev/shm 2>/dev/null | tr '\n' ' ')"
    echo "processes: $(ps -eo args= 2>/dev/null | grep -c -E 'sleep 100[12]|while [:]' || true)"
    echo "procs-any: $(for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\0' ' '; echo; done | grep -c -E 'sleep 100[12]|while [:]' || true)"
    if command -v ipcs >/dev/null; then echo "ipc: $(ipcs -q -s | grep -c '^0x' || true)"; fi
    echo "env: PLANTED=${PLANTED:-unset}"
    echo "login env: $(sh -lc 'echo ${PLANTED:-unset}')"
    """
)
"""What a sandbox shows of the places :func:`plant` writes to (the same script on a fresh
sandbox and a reused one)."""


async def look(sandbox: Sandbox) -> str:
    result = await sandbox.exec(["sh", "-c", LOOK])
    assert result.returncode == 0, result.stderr_text
    return result.stdout_text


async def pool_ready(s: Session, n: int, *, within: float = 30) -> None:
    """Wait until the session's warm pool holds ``n`` ready sandboxes."""
    await eventually_async(
        lambda: s.statistics().pool_ready >= n, within=within, what=f"{n} ready in the pool"
    )


async def a_recycled_sandbox_is_fresh(s: Session, *, within: float = 30) -> None:
    """The check of a recycling session (a warm pool of one, ``recycle=True``): an
    episode plants state everywhere; the next episodes get its sandbox back, reset, and it
    looks exactly like a fresh one. The planted loop is gone from the host (it can write
    no more) before the sandbox is looked at: a loop that survived would have written."""
    marker = unique_marker()
    async with s.sandbox() as fresh:
        expected = await look(fresh)
        first_id = fresh.id
        result = await fresh.exec(["sh", "-c", plant(marker)])
        assert result.stdout_text.strip().endswith("done"), result.stderr_text
        # The planted state is there while the episode lasts (so the check below can fail).
        assert await look(fresh) != expected
    # The next episodes get the same sandbox back (reset, in the background), not a new
    # one: the pool holds it and a fresh spare, so take both and find ours.
    await pool_ready(s, 2, within=within)
    async with s.sandbox() as a, s.sandbox() as b:
        reused = a if a.id == first_id else b
        assert reused.id == first_id, "the released sandbox was not recycled"
        assert await processes_gone(f"loop-{marker}", within=within) == []
        assert await look(reused) == expected
    assert s.metrics()["asyncsandbox/reset_failures"] == 0


async def episodes_leave_nothing(s: Session, *, episodes: int, concurrency: int) -> set[str]:
    """Episodes through a recycling session, ``concurrency`` at a time: each checks that
    its sandbox looks fresh, then plants state everywhere. Return the sandbox ids used."""
    async with s.sandbox() as first:
        fresh = await look(first)
    seen: set[str] = set()
    limiter = anyio.Semaphore(concurrency)

    async def episode() -> None:
        async with limiter, s.sandbox() as sandbox:
            assert sandbox.id is not None
            seen.add(sandbox.id)
            assert await look(sandbox) == fresh, f"{sandbox.id} was handed over dirty"
            result = await sandbox.exec(["sh", "-c", plant(unique_marker())])
            assert result.stdout_text.strip().endswith("done"), result.stderr_text

    async with anyio.create_task_group() as tg:
        for _ in range(episodes):
            tg.start_soon(episode)
    assert s.metrics()["asyncsandbox/reset_failures"] == 0
    return seen


# -- the torture suite's targets ----------------------------------------------------------------

# How far past its own timeout a hostile command may end (a loaded 2-core CI machine,
# Docker's API in between): "a small bound", never a hang.
BOUND = {
    "process": 5.0,
    "process-gvisor": 10.0,
    "docker": 10.0,
    "docker-runsc": 15.0,
    "remote": 10.0,
}

CANARY_SECRET = "canary-secret-" + uuid.uuid4().hex
"""What the torture suite's host canary holds: it must never show up in a sandbox."""


@dataclass
class Target:
    """One backend under torture (tests/torture/conftest.py makes them)."""

    name: str
    tag: str
    make_backend: Callable[[], Backend]
    leftovers: Callable[[], list[str]]
    """What the target's sandboxes left on the host (directories, containers)."""
    data: dict[str, Any] = field(default_factory=dict)
    gvisor: bool = False
    """The sandboxes run on gVisor's kernel: their processes are not the host's (the host
    sees runsc's few processes), so what runs in one is asked of its own ``/proc``."""

    @property
    def bound(self) -> float:
        return BOUND[self.name]

    def session(
        self,
        *,
        resources: Resources | None = None,
        limits: Limits | None = None,
        timeouts: Timeouts | None = None,
        backend: Backend | None = None,
        retries: RetryPolicy | None = None,
        **defaults: Any,
    ) -> Session:
        config = SandboxDefaults(tags=(self.tag,), resources=resources or Resources(), **defaults)
        return Session(
            backend or self.make_backend(),
            defaults=config,
            limits=limits,
            timeouts=timeouts,
            retries=retries,
            sweep=False,
            report_to=[],
        )


def docker_backend(**options: Any) -> Backend:
    """A Docker backend on the test image."""
    from asyncsandbox_docker import DockerBackend

    return DockerBackend(default_image=docker_test_image(), **options)


FORK_UNTIL_REFUSED = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(200):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('stopped', n < 200, e.errno)\n"
)
"""A Python program that forks sleeping children until a fork is refused (a pids limit),
then prints ``stopped True ERRNO``."""
