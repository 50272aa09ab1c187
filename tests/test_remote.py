"""The remote backend and its server, against REAL servers on loopback.

Every server here is ``asyncsandbox serve`` started as a subprocess on a free port (the
server runs on asyncio; the clients run on asyncio and trio). The conformance suite runs
through remote -> process and remote -> docker; the other tests check what the server
promises: tenancy and auth, quotas and size limits, cancellation on disconnect, leases,
shutdown, idempotent creates, its OpenAPI document (fuzzed), and a load test.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import socket
import sys
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import httpx
import msgspec
import pytest
from asyncsandbox_remote import RemoteAttributes, RemoteBackend, _wire as wire
from asyncsandbox_remote._openapi import openapi

from asyncsandbox import (
    BackendUnavailable,
    ExecTimeout,
    InvalidArgument,
    LaunchError,
    RequestNotSent,
    RetryPolicy,
    Sandbox,
    SandboxDied,
    Session,
    Timeouts,
    WarmPool,
)
from asyncsandbox.abc import Backend, SandboxHandle
from asyncsandbox.judge import Checker, Language, Program, TestCase, Verdict
from asyncsandbox.testing import CHECKS, Check

from ._support import (
    ALICE,
    BOB,
    Server,
    TcpProxy,
    a_recycled_sandbox_is_fresh,
    docker_pids_squeezed,
    docker_test_image,
    episodes_leave_nothing,
    eventually,
    eventually_async,
    kill_process_sandbox_processes,
    new_process_root,
    process_launcher_broken,
    processes_with,
    require_docker,
    tcp_proxy,
    unique_marker,
)

REPO = Path(__file__).resolve().parent.parent
NO_RETRIES = RetryPolicy(attempts=1)
T = TypeVar("T")


# -- servers ------------------------------------------------------------------------------


# Real servers, clients on asyncio: the runtime's policy is proven on both loops on the
# fake backend (test_session.py), and the remote client on trio by the conformance suite
# through a process server below. A test about one loop says which (its parametrization
# wins).
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote")


@pytest.fixture(scope="module")
def process_server(server_dir: Path) -> Iterator[Server]:
    """One server on the process backend for the tests that need no special settings."""
    root = new_process_root()
    server = Server(server_dir / "main", root=root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_server(server_dir: Path) -> Iterator[Callable[..., Server]]:
    """Servers with special settings, stopped (and their roots removed) after the test."""
    started: list[Server] = []

    def make(*args: str) -> Server:
        server = Server(server_dir / uuid.uuid4().hex[:6], *args, root=new_process_root())
        started.append(server)
        return server

    yield make
    for server in started:
        try:
            server.stop(timeout=60)
        finally:
            if server.root is not None:
                shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="module")
def docker_server(server_dir: Path) -> Iterator[Server]:
    """A server on the Docker backend (skipped without an engine, like docker_engine)."""
    require_docker()
    server = Server(
        server_dir / "docker",
        "--backend-option",
        f"default_image={docker_test_image()}",
        backend="docker",
    )
    try:
        yield server
    finally:
        server.stop()


def _create(client: httpx.Client, **body: Any) -> str:
    response = client.post("/v1/sandboxes", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _heartbeat(path: str, marker: str = "") -> list[str]:
    """A command that writes "started", then appends to ``path`` every 50 ms for ever; its
    shell carries ``marker`` on its command line (seen from the host: it runs on this
    machine), and it alone writes, so once that shell is gone nothing writes any more."""
    loop = f"echo started; while true; do echo x >> {path}; sleep 0.05; done"
    return ["sh", "-c", loop, marker or unique_marker()]


def _expect_started(line: str) -> None:
    frame = wire.decode_frame(line.encode())
    assert isinstance(frame, wire.OutputFrame), line
    assert frame.data == b"started\n"


# -- conformance --------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # the client on both loops
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
async def test_conformance_process(process_server: Server, check: Check) -> None:
    @asynccontextmanager
    async def broken(sandbox: Sandbox) -> AsyncIterator[None]:
        # The served sandbox's id is its directory under the server's root; its resident
        # executor (killed through its cgroup) must start again, and cannot.
        assert process_server.root is not None
        assert sandbox.id is not None
        async with process_launcher_broken(process_server.root / sandbox.id):
            kill_process_sandbox_processes(sandbox.id)
            yield

    if check.name == "launch_failure" and os.geteuid() != 0:
        pytest.skip("breaking the served sandbox's executor goes through its cgroup (root)")
    await check.run(process_server.backend(), launch_failure=broken)


def squeeze_served_container(sandbox: Sandbox) -> AbstractAsyncContextManager[None]:
    """The launch_failure hook through a Docker server: the remote sandbox's id is the
    container's name (the server's own hook, see tests/_support.py)."""
    assert sandbox.id is not None
    return docker_pids_squeezed(sandbox.id)


# The server's backend is asyncio-only; the client runs on asyncio and trio alike, and on
# trio it is checked through the process server above: here asyncio suffices.
@pytest.mark.docker
@pytest.mark.usefixtures("docker_engine")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
async def test_conformance_docker(docker_server: Server, check: Check) -> None:
    await check.run(docker_server.backend(), launch_failure=squeeze_served_container)


async def test_session_by_name_and_environment(
    process_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session("remote") finds the plugin and reads its configuration from the env."""
    monkeypatch.setenv("ASYNCSANDBOX_BASE_URL", process_server.url)
    monkeypatch.setenv("ASYNCSANDBOX_API_KEY", ALICE)
    async with Session("remote", sweep=False) as session:
        caps = session.backend.capabilities
        assert caps.async_libraries == {"asyncio", "trio"}
        assert "process at" in caps.isolation
        async with session.sandbox() as sb:
            result = await sb.exec(["python3", "-c", "print(6 * 7)"])
            assert result.stdout == b"42\n"
            assert sb.extra(RemoteAttributes.server_backend) == "process"
            assert sb.extra(RemoteAttributes.base_url) == process_server.url
    assert ALICE not in repr(session.backend)


def test_print_url_prints_the_url_alone(process_server: Server) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+\n", process_server.first_line)
    assert f"asyncsandbox serve: listening on {process_server.url} (" in process_server.logs()


def test_backend_needs_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCSANDBOX_BASE_URL", raising=False)
    monkeypatch.delenv("ASYNCSANDBOX_API_KEY", raising=False)
    with pytest.raises(InvalidArgument, match="ASYNCSANDBOX_BASE_URL"):
        RemoteBackend()
    with pytest.raises(InvalidArgument, match="ASYNCSANDBOX_API_KEY"):
        RemoteBackend("http://127.0.0.1:1")


async def test_unreachable_server_is_backend_unavailable() -> None:
    retries = RetryPolicy(attempts=2, backoff=0.001)
    backend = RemoteBackend("http://127.0.0.1:9", ALICE)
    with pytest.raises(RequestNotSent, match="cannot reach") as info:
        async with Session(backend, retries=retries, sweep=False):
            pass
    assert isinstance(info.value, BackendUnavailable)
    assert info.value.retryable
    assert not (info.value.__cause__ is None)  # chained, never an httpx error


async def test_a_command_that_cannot_be_started_crosses_the_wire_as_launch_error(
    server_dir: Path,
) -> None:
    """The served backend could not start the command (a fake one whose next launches
    fail): the client raises LaunchError through the exec stream and its error frame; the
    unary endpoint answers 502 ``launch_error``. It was a generic InfrastructureError
    (``infrastructure_error``), its type lost. The server's Session retried each command
    under its RetryPolicy (4 attempts by default) before answering, so the error arrives
    final (not retryable): the client does not multiply the attempts."""
    attempts = RetryPolicy().attempts
    server = Server(
        server_dir / ("fake-" + uuid.uuid4().hex[:6]),
        "--backend-option",
        f"launch_failures={3 * attempts}",  # the exec, the stream and the unary call
        backend="fake",
    )
    try:
        async with Session(RemoteBackend(server.url, ALICE), sweep=False) as s, s.sandbox() as sb:
            with pytest.raises(LaunchError, match="scripted launch failure") as info:
                await sb.exec(["echo", "never"])
            assert not info.value.retryable
            with pytest.raises(LaunchError):
                async with sb.exec_stream(["echo", "never"]) as run:
                    await run.wait()
            assert sb.id is not None
            with server.client() as client:
                answer = await anyio.to_thread.run_sync(
                    functools.partial(
                        client.post, f"/v1/sandboxes/{sb.id}/exec", json={"argv": ["true"]}
                    )
                )
            assert answer.status_code == 502, answer.text
            error = answer.json()["error"]
            assert (error["code"], error["retryable"], error["sandbox_id"]) == (
                "launch_error",
                False,
                sb.id,
            )
            assert (await sb.exec(["echo", "started"])).stdout == b"started\n"
    finally:
        server.stop()


def _answered(server: Server, operation: str) -> dict[str, int]:
    """How many requests of ``operation`` the server answered, by status (its /metrics)."""
    with server.client(None) as client:
        text = client.get("/metrics").text
    labels = rf'operation="{operation}",method="\w+",status="(\d+)"'
    pattern = rf"asyncsandbox_remote_requests_total\{{{labels}\}} (\d+)"
    return {status: int(count) for status, count in re.findall(pattern, text)}


async def test_a_create_is_sent_once_per_attempt_of_the_session(server_dir: Path) -> None:
    """Retries live in one layer. The served backend fails every create (retryably, after
    the server's own Session tried it), and the client's Session sends the create exactly
    once per attempt of its RetryPolicy. The client used to retry 502/503/504 answers and
    lost answers itself, under the Session's attempts: 3 attempts sent 12 creates."""
    server = Server(
        server_dir / ("fake-" + uuid.uuid4().hex[:6]),
        "--backend-option",
        "create_failures=1000000",
        backend="fake",
    )
    retries = RetryPolicy(attempts=3, backoff=0.01)
    try:
        async with Session(RemoteBackend(server.url, ALICE), retries=retries, sweep=False) as s:
            with pytest.raises(BackendUnavailable, match="scripted create failure") as info:
                await s.sandbox().start()
            assert info.value.retryable  # what the Session retried
            assert s.statistics().start_failures == 1
        assert _answered(server, "create_sandbox") == {"503": 3}
        # Each failed create was abandoned (its outcome unknown to a client): once each.
        assert _answered(server, "abandon_create") == {"204": 3}
    finally:
        server.stop()


async def test_a_kill_the_server_does_not_confirm_is_never_a_timeout(
    make_server: Callable[..., Server],
) -> None:
    """The command's timeout expires while the server does not answer (it is frozen with
    SIGSTOP): whether the command was killed is unknown, so the client raises
    BackendUnavailable. It reported ExecTimeout, the command's own outcome ("it ran too
    long and was killed"), which a trainer scores."""
    server = make_server()
    backend = RemoteBackend(server.url, ALICE)
    # Timeouts.cleanup bounds how long the client waits for the kill's confirmation.
    async with Session(backend, timeouts=Timeouts(cleanup=5), sweep=False) as s, s.sandbox() as sb:
        async with sb.exec_stream(["sh", "-c", "echo up; exec sleep 600"], timeout=2) as run:
            async for chunk in run:
                assert chunk.data == b"up\n"
                break
            server.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(BackendUnavailable, match="did not confirm"):
                    await run.wait()
            finally:
                server.process.send_signal(signal.SIGCONT)
        assert (await sb.exec(["echo", "answering again"])).stdout == b"answering again\n"


async def test_the_server_kills_a_command_at_its_timeout(
    make_server: Callable[..., Server],
) -> None:
    """The client sends the command's timeout and the server enforces it: the command ends
    with ExecTimeout carrying its output so far, soon after its timeout, killed by the
    server, which ends the stream with the exit frame. That kill costs no request: the
    client neither asked for it (cancel_exec) nor hung up (a disconnect kill). The client
    used to leave the timeout out, and killed every timed-out command by id."""
    server = make_server()
    marker = unique_marker()
    heartbeat = _heartbeat("t.hb", marker)

    async def streamed(sb: Sandbox) -> None:
        async with sb.exec_stream(heartbeat, timeout=1.5) as stream:
            await stream.wait()

    async with Session(RemoteBackend(server.url, ALICE), sweep=False) as s, s.sandbox() as sb:
        for run in ("exec", "exec_stream"):
            started = time.monotonic()
            with pytest.raises(ExecTimeout) as info:
                await (sb.exec(heartbeat, timeout=1.5) if run == "exec" else streamed(sb))
            elapsed = time.monotonic() - started
            assert 1.5 <= elapsed < 1.5 + 2.0, f"{run}: ended after {elapsed:.2f}s"
            result = info.value.result
            assert (result.stdout, result.timed_out, result.returncode) == (
                b"started\n",
                True,
                137,
            )
            # Killed before the exit frame was sent: nothing writes any more.
            assert processes_with(marker) == [], f"{run}: the command survived"
    assert _answered(server, "exec_stream") == {"200": 2}
    assert _answered(server, "cancel_exec") == {}
    with server.client(None) as client:
        assert "asyncsandbox_remote_disconnect_kills_total 0" in client.get("/metrics").text


async def _tls_server(make_server: Callable[..., Server], directory: Path) -> tuple[Server, Path]:
    """A server on TLS (a self-signed certificate for 127.0.0.1), and its certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = directory / "cert.pem", directory / "key.pem"
    await anyio.run_process(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ]
    )
    server = make_server("--tls-cert", str(cert), "--tls-key", str(key))
    assert server.url.startswith("https://")
    return server, cert


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1].rstrip("/"))


async def test_tls(make_server: Callable[..., Server], tmp_path: Path) -> None:
    server, cert = await _tls_server(make_server, tmp_path)
    async with Session(RemoteBackend(server.url, ALICE, verify=str(cert)), sweep=False) as s:
        assert (await s.run(["echo", "over tls"])).stdout == b"over tls\n"
    with pytest.raises(BackendUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        async with Session(RemoteBackend(server.url, ALICE), retries=NO_RETRIES, sweep=False):
            pass


async def test_a_snapshot_deletion_is_retried_by_the_session_alone(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Deleting a snapshot is retried by the Session's RetryPolicy (Runtime.delete_snapshot
    goes through its retrying call); the transport must not retry it too, or the attempts
    multiply (4 x 4 with the defaults). The server goes, and a listener on its port
    accepts each connection and closes it: the TLS handshake fails, a connection error
    that nothing was sent on, which both layers would retry. It counts the tries."""
    server, cert = await _tls_server(make_server, tmp_path)
    port = _port(server)
    backend = RemoteBackend(server.url, ALICE, verify=str(cert))
    retries = RetryPolicy(attempts=2, backoff=0.001)
    tries = 0
    async with Session(backend, retries=retries, sweep=False) as s:
        server.stop()
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)

        async def refuse(stream: anyio.abc.SocketStream) -> None:
            nonlocal tries
            tries += 1
            await stream.aclose()

        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, refuse)
            with pytest.raises(BackendUnavailable, match="cannot reach"):
                await s.delete_snapshot("gone-with-the-server")
            tg.cancel_scope.cancel()
    assert tries == retries.attempts


# -- retries: the Session's RetryPolicy alone, over a link that drops connections ----------
#
# A TcpProxy in front of a TLS server: a connection it drops at once fails its TLS
# handshake, so its request was never sent (RequestNotSent); one it cuts later carried a
# request that reached the server. The lease keeper renews every 1,000 s here: it opens
# no connection of its own during a test.

LONG_LEASE = 3000.0


@asynccontextmanager
async def _behind_a_proxy(
    make_server: Callable[..., Server],
    directory: Path,
    retries: RetryPolicy,
    *,
    dropped_at_open: int = 0,
) -> AsyncIterator[tuple[Sandbox, TcpProxy]]:
    """A sandbox of a Session whose connections pass through a proxy, which drops the
    first ``dropped_at_open`` ones."""
    server, cert = await _tls_server(make_server, directory)
    async with tcp_proxy(_port(server)) as proxy:
        proxy.drop(dropped_at_open)
        backend = RemoteBackend(proxy.url(), ALICE, verify=str(cert), lease_seconds=LONG_LEASE)
        async with Session(backend, retries=retries, sweep=False) as s, s.sandbox() as sb:
            yield sb, proxy


async def _dropping(proxy: TcpProxy, n: int, call: Awaitable[T]) -> T:
    """``call``'s outcome, its first ``n`` connections dropped (pooled ones closed first,
    so that it needs a new one); asserts that it used all ``n``."""
    await proxy.cut()
    dropped = proxy.dropped
    proxy.drop(n)
    try:
        return await call
    finally:
        assert proxy.dropped - dropped == n


async def _packed(sb: Sandbox) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo("packed.txt")
        member.size = 6
        tar.addfile(member, io.BytesIO(b"packed"))

    async def chunks() -> AsyncIterator[bytes]:
        yield buffer.getvalue()

    await sb.put_archive(".", chunks())


async def _unpacked(sb: Sandbox, name: str) -> bytes:
    async with sb.get_archive(name) as chunks:
        archive = b"".join([chunk async for chunk in chunks])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_call_that_never_left_is_retried_by_the_session(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Every call whose request never reached the server (RequestNotSent) is tried again
    by the Session, under its RetryPolicy: opening the backend, a command, a file written
    and read, an archive both ways, code run: each succeeds after two dropped connections
    with 3 attempts. (The client used to retry these itself, with its own ``attempts``
    and ``backoff`` options; the Session retried none of them.)"""
    retries = RetryPolicy(attempts=3, backoff=0.001)
    async with _behind_a_proxy(make_server, tmp_path, retries, dropped_at_open=2) as (sb, proxy):
        assert proxy.dropped == 2  # opening the backend: GET /v1/info
        assert (await _dropping(proxy, 2, sb.exec(["echo", "ran"]))).stdout == b"ran\n"
        await _dropping(proxy, 2, sb.write_file("f.txt", b"written"))
        assert await _dropping(proxy, 2, sb.read_file("f.txt")) == b"written"
        await _dropping(proxy, 2, _packed(sb))
        assert await _dropping(proxy, 2, _unpacked(sb, "packed.txt")) == b"packed"
        assert (await _dropping(proxy, 2, sb.run_code("6 * 7"))).text == "42"


async def test_retries_of_a_call_that_never_left_stop_at_the_policys_attempts(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    """The link drops every connection: a command, then a file read, is tried exactly as
    many times as the RetryPolicy says (one connection each, and no kill sent for a
    command that never left), and fails with RequestNotSent (retryable). The client used
    to try each 4 times itself (its ``attempts``), and 4 more to cancel the command."""
    retries = RetryPolicy(attempts=3, backoff=0.001)
    async with _behind_a_proxy(make_server, tmp_path, retries) as (sb, proxy):
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: sb.exec(["echo", "never"]),
            lambda: sb.read_file("nothing"),
        ]
        for call in calls:
            with pytest.raises(RequestNotSent, match="cannot reach") as info:
                await _dropping(proxy, retries.attempts, call())
            assert info.value.retryable
            assert proxy.connections == proxy.dropped + 1  # + the one that opened
            proxy.drop(0)
        assert (await sb.exec(["echo", "back"])).stdout == b"back\n"


async def test_a_request_that_was_sent_is_never_retried(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    """A command reached the server and ran; then its connection is cut. The RetryPolicy
    allows 3 attempts, but a command that may have run is never sent again: it ran once
    (it appends a line to a file as it starts), and the error is BackendUnavailable, not
    RequestNotSent, and not retryable."""
    retries = RetryPolicy(attempts=3, backoff=0.001)
    async with _behind_a_proxy(make_server, tmp_path, retries) as (sb, proxy):
        script = "echo ran >> runs.txt; echo started; exec sleep 600"
        async with sb.exec_stream(["sh", "-c", script]) as run:
            async for chunk in run:
                assert chunk.data == b"started\n"
                break
            await proxy.cut()
            with pytest.raises(BackendUnavailable) as info:
                await run.wait()
        assert not isinstance(info.value, RequestNotSent)
        assert not info.value.retryable
        assert await sb.read_file("runs.txt") == b"ran\n"


# -- auth and tenancy ---------------------------------------------------------------------


def test_missing_and_wrong_keys_answer_401(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
    calls = [
        ("GET", "/v1/info", None),
        ("GET", "/v1/sandboxes", None),
        ("POST", "/v1/sandboxes", {}),
        ("GET", f"/v1/sandboxes/{sandbox_id}", None),
        ("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"argv": ["true"]}),
        ("DELETE", f"/v1/sandboxes/{sandbox_id}", None),
    ]
    for key in (None, "not-a-key-of-anyone-at-all", ALICE[:-1], "Basic " + ALICE):
        with httpx.Client(base_url=process_server.url) as client:
            headers = {} if key is None else {"authorization": f"Bearer {key}"}
            if key is not None and key.startswith("Basic"):
                headers = {"authorization": key}
            for method, path, body in calls:
                response = client.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (key, method, path, response.text)
                assert response.json()["error"]["code"] == "unauthorized"
                assert response.headers["www-authenticate"].startswith("Bearer")
    with process_server.client(ALICE) as alice:  # nothing happened to it
        assert alice.get(f"/v1/sandboxes/{sandbox_id}").status_code == 200
        assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
    with process_server.client(None) as anonymous:  # open endpoints
        assert anonymous.get("/v1/health").json()["status"] == "ok"
        assert anonymous.get("/openapi.json").json()["openapi"].startswith("3.")
        assert anonymous.get("/metrics").status_code == 200


async def test_wrong_key_through_the_backend(process_server: Server) -> None:
    with pytest.raises(BackendUnavailable, match="refused the API key") as info:
        async with Session(process_server.backend("wrong-key-0123456789")(), sweep=False):
            pass
    assert not info.value.retryable


def test_tenants_see_and_touch_only_their_own(process_server: Server) -> None:
    with process_server.client(ALICE) as alice, process_server.client(BOB) as bob:
        mine = _create(alice, labels={"who": "alice"})
        theirs = _create(bob, labels={"who": "bob"})
        assert alice.put(
            f"/v1/sandboxes/{mine}/files", params={"path": "secret.txt"}, content=b"alice's"
        ).is_success
        listed = bob.get("/v1/sandboxes").json()["items"]
        assert mine not in {item["id"] for item in listed}
        assert theirs in {i["id"] for i in listed}
        assert bob.get("/v1/sandboxes", params={"label": "who=alice"}).json()["items"] == []
        base = f"/v1/sandboxes/{mine}"
        attempts = [
            bob.get(base),
            bob.post(f"{base}/exec", json={"argv": ["cat", "secret.txt"]}),
            bob.post(f"{base}/exec/stream", json={"argv": ["cat", "secret.txt"]}),
            bob.get(f"{base}/files", params={"path": "secret.txt"}),
            bob.put(f"{base}/files", params={"path": "x"}, content=b"bob was here"),
            bob.put(f"{base}/archive", params={"path": "x"}, content=b""),
            bob.get(f"{base}/archive", params={"path": "."}),
            bob.post(f"{base}/lease"),
            bob.post(f"{base}/reset"),
            bob.delete(f"{base}/execs/anything"),
            bob.delete(base),
        ]
        unknown = bob.get("/v1/sandboxes/p-000000000000")
        for response in attempts:
            assert response.status_code == 404, (response.request.url, response.text)
            error = response.json()["error"]
            assert error["code"] == "sandbox_not_found"
            # Indistinguishable from an id that does not exist at all.
            assert error["message"].replace(mine, "ID") == unknown.json()["error"][
                "message"
            ].replace("p-000000000000", "ID")
        renewed = bob.post("/v1/leases", json={"ids": [mine, theirs]}).json()
        assert renewed["missing"] == [mine]
        assert renewed["renewed"] == [theirs]
        deleted = bob.request("DELETE", "/v1/sandboxes", params={"label": "who=alice"}).json()
        assert deleted["ids"] == []
        # Alice's sandbox is untouched.
        content = alice.get(f"{base}/files", params={"path": "secret.txt"}).content
        assert content == b"alice's"
        assert alice.get(f"{base}/files", params={"path": "x"}).status_code == 404
        assert bob.delete(f"/v1/sandboxes/{theirs}").status_code == 204
        assert alice.delete(base).status_code == 204


async def test_tenants_through_the_backend(process_server: Server) -> None:
    async with (
        Session(process_server.backend(ALICE)(), sweep=False) as alice,
        Session(process_server.backend(BOB)(), sweep=False) as bob,
    ):
        sb = await alice.sandbox(tags=["private"]).start()
        assert await bob.list(tags=["private"]) == []
        assert await bob.delete(ids=[str(sb.id)]) == [str(sb.id)]  # "gone" for bob: not found
        assert [i.id for i in await alice.list(tags=["private"])] == [sb.id]
        assert (await sb.exec(["true"])).returncode == 0


async def test_judging_happens_on_the_server_in_one_request(process_server: Server) -> None:
    """session.judge on a remote session: one POST /v1/judge, not a round trip per case;
    verdicts, a checker in its own sandbox, bytes and a custom language cross the wire."""
    add = "a, b = map(int, input().split())\nprint(a + b)\n"
    cases = [
        TestCase(stdin="1 2\n", expected="3\n"),
        TestCase(stdin=b"40 2\n", expected=b"42\n", name="bytes"),
        TestCase(stdin="1 1\n", expected="3\n"),  # the program is right: a wrong case
        TestCase(stdin="x\n", expected="0\n"),
    ]
    judged, execs = _answered(process_server, "judge"), _answered(process_server, "exec")
    async with Session(process_server.backend(ALICE)(), sweep=False, report_to=[]) as s:
        result = await s.judge(Program(source=add), cases, parallel=2)
        assert [c.verdict for c in result.cases] == [
            Verdict.ACCEPTED,
            Verdict.ACCEPTED,
            Verdict.WRONG_ANSWER,
            Verdict.RUNTIME_ERROR,
        ]
        assert result.score == 0.5
        assert result.cases[1].name == "bytes"
        shell = Language(name="sh", source="main.sh", run=("sh", "{source}"))
        any_order = Checker(
            program=Program(
                source="import sys\nf = lambda i: sorted(open(sys.argv[i]).read().split())\n"
                "sys.exit(0 if f(2) == f(3) else 1)\n"
            )
        )
        checked = await s.judge(
            Program(source="echo 2 1", language=shell),
            [TestCase(expected="1 2"), TestCase(expected="1 3")],
            comparison=any_order,
        )
        assert [c.verdict for c in checked.cases] == [Verdict.ACCEPTED, Verdict.WRONG_ANSWER]
    assert _answered(process_server, "judge").get("200", 0) == judged.get("200", 0) + 2
    assert _answered(process_server, "exec") == execs


def test_a_judge_client_that_leaves_gets_its_cases_killed(
    make_server: Callable[..., Server],
) -> None:
    """The cases would run for 100 s: the client's leaving, once they run, kills them long
    before that, and the judging sandbox is removed or reset (recyclable: the next
    request's, fresh)."""
    server = make_server()
    program = "import pathlib, time\npathlib.Path('started').touch()\ntime.sleep(100)\n"
    body = msgspec.json.encode({"program": {"source": program}, "cases": [{}], "time_limit": 100})
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port), timeout=60) as connection:
        connection.sendall(
            b"POST /v1/judge HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {ALICE}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert server.root is not None
        root = server.root
        eventually(lambda: any(root.glob("*/fs/**/started")), within=30, what="the case started")
        started = next(root.glob("*/fs/**/started"))
        connection.shutdown(socket.SHUT_RDWR)
    eventually(
        lambda: not started.exists() and "disconnect_kills_total 1" in _metrics(server),
        within=20,
        what="the cases killed and their sandbox reset or removed",
    )


def _metrics(server: Server) -> str:
    with server.client(None) as client:
        return client.get("/metrics").text


def test_judge_requests_are_checked(process_server: Server) -> None:
    program = {"source": "print(1)"}
    bad = [
        {"program": program, "cases": []},
        {"program": {"source": "x", "command": ["true"]}, "cases": [{}]},
        {"program": program, "cases": [{}], "comparison": "checker"},
        {"program": program, "cases": [{}], "comparison": "nearly"},
        {"program": {"source": "x", "language": "cobol"}, "cases": [{}]},
        {"program": program, "cases": [{"time_limit": 0}]},
        {"program": program, "cases": [{}], "sandbox": {"network": "bridge"}},
    ]
    with process_server.client() as client:
        for body in bad:
            answer = client.post("/v1/judge", json=body)
            assert answer.status_code == 400, (body, answer.text)
            assert answer.json()["error"]["code"] == "invalid_argument", answer.text
        ok = client.post("/v1/judge", json={"program": program, "cases": [{"expected": "MQo="}]})
        assert ok.status_code == 200, ok.text
        assert ok.json()["verdict"] == "accepted"
    with process_server.client(None) as client:
        assert client.post("/v1/judge", json={"program": program, "cases": [{}]}).status_code == 401


async def test_fork_and_snapshots_through_the_server(process_server: Server) -> None:
    async with (
        Session(process_server.backend(ALICE)(), sweep=False) as alice,
        Session(process_server.backend(BOB)(), sweep=False) as bob,
    ):
        assert alice.backend.capabilities.snapshots
        async with alice.sandbox() as parent:
            await parent.exec(["sh", "-c", "echo state > f; echo rc > ~/.rc"], check=True)
            children = await parent.fork(2)
            for child in children:
                assert await child.read_file("/home/sandbox/.rc") == b"rc\n"
                assert await child.read_file("f") == b"state\n"
                await child.stop()
            kept = await parent.snapshot(keep=True)
        async with alice.sandbox(from_snapshot=kept) as again:
            assert await again.read_file("f") == b"state\n"
        # Another tenant can neither start from it nor delete it.
        with pytest.raises(InvalidArgument, match="no snapshot"):
            await bob.sandbox(from_snapshot=kept).start()
        await bob.delete_snapshot(kept)
        async with alice.sandbox(from_snapshot=kept) as still:
            assert await still.read_file("f") == b"state\n"
        await alice.delete_snapshot(kept)
        with pytest.raises(InvalidArgument, match="no snapshot"):
            await alice.sandbox(from_snapshot=kept).start()


# -- recycling: a reset on the server --------------------------------------------------------


def _recycling(server: Server, size: int = 1) -> Session:
    return Session(
        server.backend(ALICE)(), warm_pool=WarmPool(size=size, recycle=True), sweep=False
    )


async def test_a_recycled_remote_sandbox_is_indistinguishable_from_a_fresh_one(
    process_server: Server,
) -> None:
    """The recycling check of the process and Docker backends (tests/_support.py), through
    a real server: the released sandbox comes back with its id, reset on the server."""
    async with _recycling(process_server) as s:
        await a_recycled_sandbox_is_fresh(s, within=60)
        metrics = s.metrics()
        assert metrics["asyncsandbox/reset_count"] >= 1
        assert s.statistics().pool_hits > 0


async def test_remote_recycling_under_load_hands_over_no_state(process_server: Server) -> None:
    async with _recycling(process_server, size=2) as s:
        seen = await episodes_leave_nothing(s, episodes=16, concurrency=4)
        assert s.statistics().pool_hits > 0
    assert len(seen) < 16, "no sandbox was reused"


def test_reset_route_resets_in_place_for_its_tenant_only(process_server: Server) -> None:
    with process_server.client(ALICE) as alice, process_server.client(BOB) as bob:
        info = alice.get("/v1/info").json()
        assert info["capabilities"]["reset"] is True
        mine = _create(alice)
        base = f"/v1/sandboxes/{mine}"
        assert alice.put(f"{base}/files", params={"path": "f"}, content=b"x").is_success
        refused = bob.post(f"{base}/reset")
        assert refused.status_code == 404, refused.text
        assert alice.get(f"{base}/files", params={"path": "f"}).content == b"x"
        reset = alice.post(f"{base}/reset")
        assert reset.status_code == 204, reset.text
        assert alice.get(f"{base}/files", params={"path": "f"}).status_code == 404
        again = alice.post(f"{base}/exec", json={"argv": ["ls", "-A", "."]})
        assert again.json()["stdout"] == "", again.text  # the same sandbox, usable, empty
        assert alice.delete(base).status_code == 204
        assert alice.post(f"{base}/reset").status_code == 404


async def test_recycling_is_refused_where_the_server_cannot_reset(docker_server: Server) -> None:
    """The Docker server's containers are not recyclable (no ``recyclable=True``): its
    info says so, a recycling session is refused, and the route answers 400."""
    with pytest.raises(InvalidArgument, match="reset"):
        async with _recycling(docker_server):
            pass
    with docker_server.client(ALICE) as alice:
        assert alice.get("/v1/info").json()["capabilities"]["reset"] is False
        mine = _create(alice, image=docker_test_image())
        try:
            refused = alice.post(f"/v1/sandboxes/{mine}/reset")
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == "invalid_argument"
        finally:
            alice.delete(f"/v1/sandboxes/{mine}")


def test_snapshot_routes_answer_only_their_tenant(process_server: Server) -> None:
    with process_server.client(ALICE) as alice, process_server.client(BOB) as bob:
        mine = _create(alice)
        assert bob.post(f"/v1/sandboxes/{mine}/snapshot").status_code == 404
        created = alice.post(f"/v1/sandboxes/{mine}/snapshot")
        assert created.status_code == 201, created.text
        snapshot = created.json()["id"]
        refused = bob.post("/v1/sandboxes", json={"snapshot": snapshot})
        assert refused.status_code == 400
        assert bob.delete(f"/v1/snapshots/{snapshot}").status_code == 204  # a no-op for bob
        copy = alice.post("/v1/sandboxes", json={"snapshot": snapshot})
        assert copy.status_code == 201, copy.text
        assert alice.delete(f"/v1/snapshots/{snapshot}").status_code == 204
        for sandbox_id in (mine, copy.json()["id"]):
            assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


# -- quotas and limits --------------------------------------------------------------------


def test_quotas_answer_429(make_server: Callable[..., Server]) -> None:
    server = make_server("--max-live-per-tenant", "2", "--max-execs-per-tenant", "1")
    with server.client(ALICE) as alice, server.client(BOB) as bob:
        first, _ = _create(alice), _create(alice)
        refused = alice.post("/v1/sandboxes", json={})
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert "max_live" in error["message"]
        assert refused.headers["retry-after"]
        _create(bob)  # quotas are per tenant
        with alice.stream(
            "POST", f"/v1/sandboxes/{first}/exec/stream", json={"argv": _heartbeat("hb")}
        ) as running:
            # Keep the line iterator: a dropped one closes the connection when collected.
            lines = running.iter_lines()
            _expect_started(next(lines))
            busy = alice.post(f"/v1/sandboxes/{first}/exec", json={"argv": ["true"]})
            assert busy.status_code == 429
            assert "max_execs" in busy.json()["error"]["message"]
            assert (
                alice.get(f"/v1/sandboxes/{first}/files", params={"path": "hb"}).status_code == 429
            )
        metrics = alice.get("/metrics").text
        assert 'quota_rejections_total{tenant="alice",quota="max_live"} 1' in metrics


async def test_quota_through_the_backend(make_server: Callable[..., Server]) -> None:
    server = make_server("--max-live-per-tenant", "1")
    async with Session(server.backend()(), sweep=False) as session:
        await session.sandbox().start()
        with pytest.raises(BackendUnavailable, match="max_live quota is 1") as info:
            await session.sandbox().start()
        assert info.value.retryable


def test_request_size_limits_answer_413(make_server: Callable[..., Server]) -> None:
    server = make_server("--max-request-bytes", "4096", "--max-file-bytes", "8192")
    with server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        big = alice.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["x" * 5000]})
        assert big.status_code == 413
        assert big.json()["error"]["code"] == "request_too_large"

        def chunked() -> Iterator[bytes]:  # no Content-Length: counted while read
            yield b"x" * 6000
            yield b"x" * 6000

        response = alice.put(
            f"/v1/sandboxes/{sandbox_id}/files", params={"path": "f"}, content=chunked()
        )
        assert response.status_code == 413
        ok = alice.put(
            f"/v1/sandboxes/{sandbox_id}/files", params={"path": "f"}, content=b"y" * 8000
        )
        assert ok.status_code == 204
        garbage = alice.post("/v1/sandboxes", content=b"{not json")
        assert garbage.status_code == 400
        assert garbage.json()["error"]["code"] == "invalid_argument"


async def test_too_large_through_the_backend(make_server: Callable[..., Server]) -> None:
    server = make_server("--max-file-bytes", "8192")
    async with Session(server.backend()(), sweep=False) as session, session.sandbox() as sb:
        with pytest.raises(InvalidArgument, match="exceeds the server's limit"):
            await sb.write_file("big", b"z" * 10_000)


def test_no_secret_is_logged(make_server: Callable[..., Server]) -> None:
    server = make_server()
    with server.client(ALICE) as alice, server.client(BOB[:-2] + "zz") as wrong:
        sandbox_id = _create(alice)
        alice.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["true"]})
        assert wrong.get("/v1/sandboxes").status_code == 401
        alice.delete(f"/v1/sandboxes/{sandbox_id}")
    assert server.stop() == 0
    logs = server.logs()
    assert "remote.auth.failed" in logs
    assert "POST /v1/sandboxes" in logs
    for secret in (ALICE, BOB, BOB[:-2] + "zz", ALICE[6:], BOB[4:]):
        assert secret not in logs


# -- archives -------------------------------------------------------------------------------


def _tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def test_archive_transfers_hold_a_slot_of_the_server_session(
    process_server: Server,
) -> None:
    """The server moves archives through the public Sandbox API, under its Session's
    limits: a download or an upload in progress holds an ``execs`` slot, as a command
    does. They went to the backend's handle directly, outside every limit."""
    async with httpx.AsyncClient(
        base_url=process_server.url, headers={"authorization": f"Bearer {ALICE}"}, timeout=60
    ) as client:

        async def execs_held() -> int:
            text = (await client.get("/metrics")).text
            found = re.search(r'session_slots_active\{limiter="execs"\} (\d+)', text)
            assert found is not None, text
            return int(found.group(1))

        sandbox_id = (await client.post("/v1/sandboxes", json={})).json()["id"]
        base = f"/v1/sandboxes/{sandbox_id}"
        made = await client.post(
            f"{base}/exec", json={"argv": ["sh", "-c", "head -c 32000000 /dev/urandom > big"]}
        )
        assert made.json()["returncode"] == 0
        assert await execs_held() == 0
        # A download past the server's look-ahead (1 MiB), its reader paused, then resumed.
        async with client.stream("GET", f"{base}/archive", params={"path": "big"}) as download:
            assert download.status_code == 200
            received = 0
            async for chunk in download.aiter_raw():
                if not received:
                    assert await execs_held() == 1
                received += len(chunk)
            assert received > 32_000_000
        # An upload whose client pauses half way.
        archive, resume = _tar("uploaded.txt", b"up\n" * 1000), anyio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield archive[:1024]
            await resume.wait()
            yield archive[1024:]

        uploaded: list[int] = []

        async def upload() -> None:
            answer = await client.put(f"{base}/archive", params={"path": "."}, content=body())
            uploaded.append(answer.status_code)

        async def held(count: int) -> None:
            """Wait until ``count`` slots are held (the server's own pace: poll it)."""

            async def holds() -> bool:
                return await execs_held() == count

            await eventually_async(holds, within=30, what=f"{count} slots held")

        async with anyio.create_task_group() as tg:
            tg.start_soon(upload)
            await held(1)
            resume.set()
        assert uploaded == [204]
        read = await client.get(f"{base}/files", params={"path": "uploaded.txt"})
        assert read.content == b"up\n" * 1000
        await held(0)
        await client.delete(base)


@pytest.mark.parametrize("first", ["archive", "exec"])
def test_a_transfer_that_finds_its_sandbox_dead_marks_it_dead(
    process_server: Server, first: str
) -> None:
    """The sandbox's directory is removed from outside. Whatever finds it first, an
    archive transfer or a command, the served Sandbox remembers that it died: the server
    then describes it as dead, and every later call answers 410. Through the backend's
    handle, a transfer left the sandbox unmarked (and its record was dropped: 404)."""
    assert process_server.root is not None
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        base = f"/v1/sandboxes/{sandbox_id}"
        assert alice.put(f"{base}/files", params={"path": "a"}, content=b"a").status_code == 204
        shutil.rmtree(process_server.root / sandbox_id)
        if first == "archive":
            found = alice.get(f"{base}/archive", params={"path": "a"})
        else:
            found = alice.post(f"{base}/exec", json={"argv": ["true"]})
        assert found.status_code == 410, found.text
        assert found.json()["error"]["code"] == "sandbox_died"
        described = alice.get(base)
        assert described.status_code == 200, described.text
        assert described.json()["status"] == "dead"
        later = alice.get(f"{base}/archive", params={"path": "a"})
        assert later.status_code == 410, later.text
        assert alice.delete(base).status_code == 204


# -- the code interpreter (its semantics: tests/test_interpreter.py, remote included) -------


def _code_frames(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.iter_lines() if line]


def test_run_code_streams_ndjson_frames(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        base = f"/v1/sandboxes/{sandbox_id}/code"
        body = {"code": "x = 20\nprint('hi')\ndisplay(1)\nx + 22", "env": {"A": "b"}}
        with alice.stream("POST", f"{base}/run", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
            frames = _code_frames(response)
        assert [f["type"] for f in frames] == ["OutputMessage", "Result", "Result", "end"]
        assert frames[0]["line"] == "hi\n"
        assert frames[0]["error"] is False
        execution = frames[-1]["execution"]
        assert execution["results"][-1]["text"] == "42"
        assert execution["results"][-1]["is_main_result"] is True
        assert execution["logs"]["stdout"] == ["hi\n"]
        assert execution["context_id"] == "default"
        # The state is the context's, from one request to the next.
        with alice.stream("POST", f"{base}/run", json={"code": "x"}) as response:
            assert _code_frames(response)[-1]["execution"]["results"][0]["text"] == "20"
        # A timeout is data, as the client raises it.
        slow = {"code": "import time; time.sleep(60)", "timeout": 0.5}
        with alice.stream("POST", f"{base}/run", json=slow) as response:
            end = _code_frames(response)[-1]
        assert end["execution"]["timed_out"] is True
        assert end["execution"]["error"]["name"] == "KeyboardInterrupt"
        # Contexts.
        created = alice.post(f"{base}/contexts", json={"cwd": "/tmp"})
        assert created.status_code == 201, created.text
        context = created.json()
        assert context["cwd"] == "/tmp"
        assert context["language"] == "python"
        listed = alice.get(f"{base}/contexts").json()["items"]
        assert {c["id"] for c in listed} == {"default", context["id"]}
        restarted = alice.post(f"{base}/contexts/{context['id']}/restart")
        assert restarted.status_code == 204
        assert alice.delete(f"{base}/contexts/{context['id']}").status_code == 204
        unknown = alice.post(f"{base}/run", json={"code": "1", "context": context["id"]})
        assert unknown.status_code == 400
        assert unknown.json()["error"]["code"] == "invalid_argument"
        assert alice.delete(f"{base}/contexts/{context['id']}").status_code == 400
        bad = alice.post(f"{base}/contexts", json={"cwd": "/no/such/directory"})
        assert bad.status_code == 400, bad.text
        # Another tenant's sandbox does not exist for it.
        with process_server.client(BOB) as bob:
            assert bob.post(f"{base}/run", json={"code": "x"}).status_code == 404
            assert bob.get(f"{base}/contexts").status_code == 404
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


def test_closing_the_run_code_stream_interrupts_the_code(process_server: Server) -> None:
    code = "kept = 'yes'\nimport time\nprint('started', flush=True)\ntime.sleep(600)"
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        base = f"/v1/sandboxes/{sandbox_id}/code"
        with alice.stream("POST", f"{base}/run", json={"code": code}) as response:
            lines = response.iter_lines()
            assert json.loads(next(lines))["line"] == "started\n"
        # The connection is closed: the server interrupts the code (KeyboardInterrupt, as
        # a notebook's interrupt), and the context keeps its state. The next call waits for
        # the interrupted one to end (one call at a time in a context).
        with alice.stream("POST", f"{base}/run", json={"code": "kept"}) as response:
            execution = _code_frames(response)[-1]["execution"]
        assert execution["results"][0]["text"] == "'yes'"
        assert execution["restarted"] is False
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


# -- cancellation, leases, shutdown -------------------------------------------------------


def test_closing_the_exec_stream_kills_the_process(process_server: Server) -> None:
    marker = unique_marker()
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        body = {"argv": _heartbeat("s.hb", marker)}
        with alice.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec/stream", json=body) as run:
            lines = run.iter_lines()
            _expect_started(next(lines))
            assert processes_with(marker)
        # The connection is closed (the body was not read to its end): the server kills it.
        eventually(lambda: not processes_with(marker), what="the command killed on disconnect")
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


async def test_disconnect_during_unary_exec_kills_the_process(process_server: Server) -> None:
    marker = unique_marker()
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
    async with httpx.AsyncClient(
        base_url=process_server.url, headers={"authorization": f"Bearer {ALICE}"}
    ) as client:
        body = {"argv": _heartbeat("u.hb", marker)}
        async with anyio.create_task_group() as tg:
            url = f"/v1/sandboxes/{sandbox_id}/exec"
            tg.start_soon(functools.partial(client.post, url, json=body))
            await eventually_async(lambda: processes_with(marker), what="the command runs")
            tg.cancel_scope.cancel()  # the client gives up: its connection is closed
    await eventually_async(
        lambda: not processes_with(marker), what="the command killed on disconnect"
    )
    with process_server.client(ALICE) as alice:
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


def test_cancel_exec_by_id(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        marker = unique_marker()
        body = {"argv": _heartbeat("c.hb", marker), "exec_id": "job-1"}
        with alice.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec/stream", json=body) as run:
            lines = run.iter_lines()
            _expect_started(next(lines))
            with process_server.client(ALICE) as other:
                assert other.delete(f"/v1/sandboxes/{sandbox_id}/execs/job-1").status_code == 204
                # Answered once the process tree is gone: nothing writes any more.
                assert processes_with(marker) == []
            last = wire.decode_frame(list(lines)[-1].encode())
            assert isinstance(last, wire.ErrorFrame)
            assert last.error.code == "exec_cancelled"
        # An exec id cancelled before its command arrives is refused when it does.
        alice.delete(f"/v1/sandboxes/{sandbox_id}/execs/job-2")
        late = alice.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["true"], "exec_id": "job-2"}
        )
        assert late.status_code == 409
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


async def test_lease_expiry_reaps_abandoned_sandboxes(make_server: Callable[..., Server]) -> None:
    server = make_server("--lease", "1", "--max-lease", "5")
    with server.client(ALICE) as alice:
        abandoned = _create(alice)
        busy = _create(alice)
    async with (
        Session(server.backend()(), sweep=False) as session,
        session.sandbox() as kept,
        httpx.AsyncClient(
            base_url=server.url, headers={"authorization": f"Bearer {ALICE}"}, timeout=30
        ) as client,
    ):

        async def expired(count: int) -> bool:
            metrics = (await client.get("/metrics")).text
            return f"asyncsandbox_remote_leases_expired_total {count}\n" in metrics

        # A request in flight keeps its sandbox alive past the lease (a command of 2.5 s:
        # 2.5 leases); the abandoned one's lease expires meanwhile.
        long_exec = await client.post(f"/v1/sandboxes/{busy}/exec", json={"argv": ["sleep", "2.5"]})
        assert long_exec.status_code == 200
        assert long_exec.json()["returncode"] == 0
        await eventually_async(lambda: expired(1), what="the abandoned sandbox's lease expired")
        # The backend renews the lease of the sandbox it holds (every lease/3): unused
        # since its start, 2.5 leases ago, it is still there.
        assert (await kept.exec(["true"])).returncode == 0
        gone = await client.get(f"/v1/sandboxes/{abandoned}")
        assert gone.status_code == 404
        # Once its request ended, the busy sandbox's lease runs out too (reading its record
        # would renew it: the metrics say when).
        await eventually_async(lambda: expired(2), what="the busy sandbox's lease expired")
        assert (await client.get(f"/v1/sandboxes/{busy}")).status_code == 404
        assert (await kept.exec(["true"])).returncode == 0
        assert abandoned not in server.sandbox_dirs()
        assert busy not in server.sandbox_dirs()
        assert await expired(2)
    assert server.sandbox_dirs() == []


async def test_sandbox_removed_on_the_server_is_dead(process_server: Server) -> None:
    async with Session(process_server.backend()(), sweep=False) as session:
        sb = await session.sandbox().start()
        with process_server.client(ALICE) as alice:
            alice.delete(f"/v1/sandboxes/{sb.id}")  # removed behind the client's back
        with pytest.raises(SandboxDied, match="not found on the server"):
            await sb.exec(["true"])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sigterm_removes_sandboxes_and_kills_commands(
    make_server: Callable[..., Server],
) -> None:
    server = make_server("--shutdown-grace", "2")
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    with server.client(ALICE) as alice:
        ids = [_create(alice) for _ in range(3)]
    assert set(server.sandbox_dirs()) == set(ids)
    async with httpx.AsyncClient(
        base_url=server.url, headers={"authorization": f"Bearer {ALICE}"}, timeout=60
    ) as client:
        body = {"argv": ["sh", "-c", "echo started; exec sleep 600", marker]}
        async with client.stream("POST", f"/v1/sandboxes/{ids[0]}/exec/stream", json=body) as run:
            lines = run.aiter_lines()
            _expect_started(await anext(lines))
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            status = await anyio.to_thread.run_sync(server.process.wait, 30)
            elapsed = time.monotonic() - started
    assert status == 0, server.logs()[-2000:]
    assert elapsed < 15, f"shutdown took {elapsed:.1f}s"
    assert server.sandbox_dirs() == [], "sandboxes left after shutdown"
    leftover = await anyio.run_process(["pgrep", "-f", marker], check=False)
    assert leftover.stdout == b"", "the command outlived the server"
    assert "remote.server.stopping" in server.logs()


def test_sigterm_keep_policy(make_server: Callable[..., Server]) -> None:
    server = make_server("--on-shutdown", "keep")
    with server.client(ALICE) as alice:
        sandbox_id = _create(alice)
    assert server.stop() == 0
    assert server.sandbox_dirs() == [sandbox_id], "the keep policy removed the sandbox"

    async def cleanup() -> list[str]:
        from asyncsandbox._process import ProcessBackend

        assert server.root is not None
        async with Session(ProcessBackend(root=server.root), sweep=False) as session:
            return await session.delete(tags=["remote-tenant:alice"])

    assert anyio.run(cleanup) == [sandbox_id]


# -- idempotency --------------------------------------------------------------------------


def test_idempotent_create(process_server: Server) -> None:
    key = {"idempotency-key": uuid.uuid4().hex}
    with process_server.client(ALICE) as alice, process_server.client(BOB) as bob:
        first = alice.post("/v1/sandboxes", json={"labels": {"k": "v"}}, headers=key)
        again = alice.post("/v1/sandboxes", json={"labels": {"k": "v"}}, headers=key)
        assert first.status_code == 201
        assert again.status_code == 200
        assert again.headers["idempotent-replayed"] == "true"
        assert first.json()["id"] == again.json()["id"]
        listed = alice.get("/v1/sandboxes", params={"label": "k=v"}).json()["items"]
        assert [item["id"] for item in listed] == [first.json()["id"]]
        conflict = alice.post("/v1/sandboxes", json={"labels": {"k": "other"}}, headers=key)
        assert conflict.status_code == 422
        assert conflict.json()["error"]["code"] == "idempotency_conflict"
        # Keys are per tenant: the same key is a different create for another tenant.
        theirs = bob.post("/v1/sandboxes", json={"labels": {"k": "v"}}, headers=key)
        assert theirs.status_code == 201
        assert theirs.json()["id"] != first.json()["id"]
        # Abandoning the key removes its sandbox and refuses the key from then on.
        assert alice.delete(f"/v1/creates/{key['idempotency-key']}").status_code == 204
        assert alice.get(f"/v1/sandboxes/{first.json()['id']}").status_code == 404
        late = alice.post("/v1/sandboxes", json={"labels": {"k": "v"}}, headers=key)
        assert late.status_code == 409
        assert late.json()["error"]["code"] == "create_abandoned"
        bob.delete(f"/v1/sandboxes/{theirs.json()['id']}")


async def test_concurrent_retries_create_once(process_server: Server) -> None:
    key = {"idempotency-key": uuid.uuid4().hex}
    body = {"labels": {"retry": key["idempotency-key"]}}
    ids: list[str] = []
    async with httpx.AsyncClient(
        base_url=process_server.url, headers={"authorization": f"Bearer {ALICE}"}, timeout=60
    ) as client:

        async def create() -> None:
            response = await client.post("/v1/sandboxes", json=body, headers=key)
            assert response.status_code in (200, 201), response.text
            ids.append(response.json()["id"])

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(create)
        assert len(set(ids)) == 1
        label = f"retry={key['idempotency-key']}"
        listed = (await client.get("/v1/sandboxes", params={"label": label})).json()["items"]
        assert [item["id"] for item in listed] == ids[:1]
        await client.delete(f"/v1/sandboxes/{ids[0]}")


# -- wire format ----------------------------------------------------------------------------


def test_wire_types_tolerate_unknown_fields_and_frames() -> None:
    body = b'{"argv": ["true"], "future_field": {"nested": 1}}'
    assert wire.EXEC.decode(body).argv == ["true"]
    assert wire.decode_frame(b'{"type": "progress", "percent": 50}') is None
    frame = wire.decode_frame(b'{"type": "exit", "returncode": 3, "new": true}')
    assert isinstance(frame, wire.ExitFrame)
    assert frame.returncode == 3
    with pytest.raises(msgspec.ValidationError):
        wire.decode_frame(b'{"type": "exit"}')  # a known frame must be valid


def test_unknown_request_fields_are_tolerated(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice, some_future_option=True, labels={"x": "y"})
        response = alice.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            json={"argv": ["printf", "%s", "ok"], "priority": "high"},
        )
        assert response.json()["stdout"] == "b2s="  # base64 of b"ok"
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


def test_openapi_document(process_server: Server) -> None:
    with process_server.client(None) as client:
        document = client.get("/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]
    for name in (
        "CreateSandbox",
        "ExecRequest",
        "ExecResponse",
        "ErrorResponse",
        "ExecFrame",
        "CodeRequest",
        "CodeFrame",
        "Execution",
    ):
        assert name in schemas
    assert "forbid" not in str(schemas)  # wire types never reject unknown fields
    paths = document["paths"]
    assert "post" in paths["/v1/sandboxes/{sandbox_id}/exec/stream"]
    code_run = paths["/v1/sandboxes/{sandbox_id}/code/run"]["post"]
    ndjson = code_run["responses"]["200"]["content"]["application/x-ndjson"]["schema"]
    assert ndjson == {"$ref": "#/components/schemas/CodeFrame"}
    assert paths["/v1/health"]["get"]["security"] == []
    generated = openapi(document["info"]["version"])
    assert document == msgspec.json.decode(msgspec.json.encode(generated))  # what is fuzzed
    # Every schema a route names is in the document (the judge's and the snapshot's were
    # not), and SandboxFusion's routes are described, so that the fuzzer reaches them.
    named = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(document)))
    assert named - set(schemas) == set()
    for path, request, answer in (
        ("/run_code", "RunCodeRequest", "RunCodeResponse"),
        ("/run_jupyter", "RunJupyterRequest", "RunJupyterResponse"),
    ):
        route = paths[path]["post"]
        body = route["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{request}"}
        ok = route["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{answer}"}
    assert "python" in schemas["RunCodeRequest"]["properties"]["language"]["enum"]


def test_metrics_are_prometheus_text(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = _create(alice)
        alice.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["true"]})
        text = alice.get("/metrics").text
        alice.delete(f"/v1/sandboxes/{sandbox_id}")
    assert "# TYPE asyncsandbox_remote_requests_total counter" in text
    assert re.search(
        r'asyncsandbox_remote_requests_total\{operation="exec",method="POST",status="200"\} \d+',
        text,
    )
    assert re.search(
        r'asyncsandbox_remote_request_duration_seconds_bucket\{operation="exec",le="\+Inf"\}', text
    )
    assert "asyncsandbox_remote_session_sandboxes_started_total" in text
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{.*\})? [0-9.e+-]+", line), line


# -- load ---------------------------------------------------------------------------------


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("remote_load", REPO / "bench" / "remote_load.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


async def _load(server: Server, clients: int, rollouts: int) -> None:
    result = await _bench().run_load(server.url, ALICE, clients=clients, rollouts=rollouts)
    summary = result.summary()
    assert summary["errors"] == 0, summary["errors_by_type"]
    assert summary["completed"] == rollouts
    assert summary["leftovers"] == 0
    assert server.sandbox_dirs() == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_load_small(make_server: Callable[..., Server]) -> None:
    """10 clients, 100 rollouts: zero errors and zero leftovers (see bench/remote_load.py)."""
    await _load(make_server(), clients=10, rollouts=100)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_load_full(make_server: Callable[..., Server]) -> None:
    """50 clients, 2,000 rollouts: zero errors and zero leftovers."""
    await _load(make_server("--max-live-per-tenant", "128"), clients=50, rollouts=2000)


# -- fuzzing --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(server_dir: Path) -> Iterator[Server]:
    """A server for the fuzzer: short leases reap what it creates, small quotas bound it."""
    root = new_process_root()
    server = Server(
        server_dir / "fuzz",
        "--lease",
        "10",
        "--max-live-per-tenant",
        "6",
        root=root,
    )
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


class _FuzzTarget:
    """A real sandbox of the fuzzing tenant, so generated calls reach past the 404."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.sandbox_id = ""
        self.calls = 0

    def alive_id(self) -> str:
        with self.server.client(ALICE) as client:
            if not self.sandbox_id or client.get(f"/v1/sandboxes/{self.sandbox_id}").is_error:
                client.request("DELETE", "/v1/sandboxes", params={"label": "fuzz=target"})
                self.sandbox_id = _create(client, labels={"fuzz": "target"})
        return self.sandbox_id


@pytest.fixture(scope="module")
def fuzz_target(fuzz_server: Server) -> _FuzzTarget:
    return _FuzzTarget(fuzz_server)


def _fuzz_test() -> Any:
    import schemathesis
    from hypothesis import HealthCheck, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    # The document the server serves at /openapi.json (test_openapi_document checks that
    # they are the same), loaded at collection time: schemathesis's lazy fixture loader
    # does not work with pytest 9.
    schema = schemathesis.openapi.from_dict(openapi())
    schemathesis.serializer.alias("application/x-tar", "application/octet-stream")

    @pytest.mark.slow  # 50 examples per operation, each a real call
    @schema.parametrize()
    @settings(
        max_examples=int(os.environ.get("ASYNCSANDBOX_FUZZ_EXAMPLES", "50")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    def test_fuzz_api(case: Any, fuzz_target: _FuzzTarget) -> None:
        """The API fuzzed from its own OpenAPI document: no 5xx, answers as documented."""
        if "sandbox_id" in (case.path_parameters or {}):
            fuzz_target.calls += 1
            if fuzz_target.calls % 2:  # half the calls reach a real sandbox of the tenant
                case.path_parameters["sandbox_id"] = fuzz_target.alive_id()
        if case.path in ("/run_code", "/run_jupyter") and isinstance(case.body, dict):
            # SandboxFusion's requests run for real too: bound them by their own fields.
            for key in ("compile_timeout", "run_timeout", "total_timeout"):
                case.body[key] = 2
            case.body.pop("cell_timeout", None)
        elif isinstance(case.body, dict) and ("argv" in case.body or "code" in case.body):
            # Generated commands and code run for real: bound them (a generated `sh` may
            # loop forever).
            case.body["timeout"] = 2
            case.body.pop("max_output_bytes", None)
        response = case.call(
            base_url=fuzz_target.server.url,
            headers={"Authorization": f"Bearer {ALICE}"},
            timeout=60,
        )
        case.validate_response(
            response,
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )

    return test_fuzz_api


test_fuzz_api = _fuzz_test()


def test_the_served_wrapper_passes_on_every_method_of_the_contract() -> None:
    """The server wraps its backend (to keep sandboxes on shutdown); each method of the
    contract it does not pass on is the base class's default. It lacked ``reset``: every
    /run_code sandbox failed its reset (NotImplementedError) and a new one was made per
    request; ``list_snapshots`` listed none, so ``gc`` missed orphaned snapshots; and
    ``use_timeouts`` never reached the served backend."""
    from asyncsandbox_remote._served import ServedBackend, _ServedHandle

    for wrapper, contract in ((ServedBackend, Backend), (_ServedHandle, SandboxHandle)):
        inherited = [
            name
            for name, member in vars(contract).items()
            if (callable(member) or isinstance(member, property))
            and (not name.startswith("_") or name in ("__aenter__", "__aexit__"))
            and getattr(wrapper, name) is member
        ]
        assert inherited == [], f"{wrapper.__name__} does not pass on {inherited}"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the server runs on asyncio
async def test_the_server_answers_while_its_sweep_waits_on_the_backend() -> None:
    """The sweep of what a previous server left runs beside the serving: a backend slow
    to list (Docker, held by a wedged container, answered after a minute) does not keep
    the server from answering. On the old code the server did not start until it ended."""
    from asyncsandbox_remote.server import ServerConfig, Tenant, create_app

    from asyncsandbox.testing import FakeBackend

    listing, release = anyio.Event(), anyio.Event()

    class SlowToList(FakeBackend):
        async def list(self, *, labels: Any) -> Any:
            listing.set()
            await release.wait()
            return await super().list(labels=labels)

    app = create_app(ServerConfig(), [Tenant.from_key("a", "k" * 16)], backend=SlowToList())
    with anyio.fail_after(30):
        async with app.state.server.lifespan():
            await listing.wait()  # the sweep is under way, and the server answers
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
                assert (await client.get("/v1/health")).status_code == 200
            release.set()
