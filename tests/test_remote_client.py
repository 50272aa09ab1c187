"""The remote backend, the client of ``asyncsandbox serve``, against REAL servers on loopback.

The conformance suite runs through remote -> process (the client on asyncio and trio) and
remote -> docker. The other tests check what the client promises: it is found by name and
configured from the environment; an unreachable server, a command that cannot start and a
kill the server does not confirm are each reported as what they are; the command's timeout
is the server's to enforce; it speaks TLS; and retries live in one layer, the Session's
RetryPolicy, which tries again a call that never reached the server and never one that did.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shutil
import signal
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from asyncsandbox_remote import RemoteAttributes, RemoteBackend

from asyncsandbox import (
    BackendUnavailable,
    ExecTimeout,
    InvalidArgument,
    LaunchError,
    RequestNotSent,
    RetryPolicy,
    Sandbox,
    Session,
    Timeouts,
)
from asyncsandbox.testing import CHECKS, Check

from . import _remote_support as remote
from ._remote_support import answered, heartbeat_command
from ._support import (
    ALICE,
    Server,
    TcpProxy,
    docker_pids_squeezed,
    kill_process_sandbox_processes,
    process_launcher_broken,
    processes_with,
    tcp_proxy,
    unique_marker,
)

NO_RETRIES = RetryPolicy(attempts=1)
T = TypeVar("T")

# The remote family's fixtures (tests/_remote_support.py), this module's by name.
anyio_backend = remote.anyio_backend
server_dir = remote.server_dir
process_server = remote.process_server
make_server = remote.make_server
docker_server = remote.docker_server


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
    container's name (the server's own hook, see tests/_support/_docker.py)."""
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


def test_the_client_has_no_deadline_options_of_its_own() -> None:
    with pytest.raises(InvalidArgument, match=r"timeout=.*Timeouts\(operation=5\.0\)"):
        RemoteBackend("http://127.0.0.1:1", ALICE, timeout=5.0)
    with pytest.raises(InvalidArgument, match=r"connect_timeout=.*Timeouts\(operation=5\.0"):
        RemoteBackend("http://127.0.0.1:1", ALICE, connect_timeout=5.0)


async def test_the_clients_deadlines_are_the_sessions_timeouts(
    make_server: Callable[..., Server],
) -> None:
    """The client's deadlines are the Session's Timeouts. A command silent for longer than
    ``operation`` runs to its end: the server pings its answer while it is quiet (its ping
    interval is in its terms), and the client waits that long and ``operation`` more.
    Then the server freezes (SIGSTOP): a file read, which the runtime puts no deadline on
    (a sandbox's call), ends with BackendUnavailable once ``operation`` passed without an
    answer, and says so. The client used to wait 60 s there, a constant of its own
    (``RemoteBackend(timeout=60.0)``)."""
    server = make_server()
    timeouts = Timeouts(operation=4, cleanup=4)
    backend = RemoteBackend(server.url, ALICE, lease_seconds=LONG_LEASE)
    async with Session(backend, timeouts=timeouts, sweep=False) as s, s.sandbox() as sb:
        quiet = await sb.exec(["sh", "-c", "sleep 6; echo quiet"])
        assert quiet.stdout == b"quiet\n"
        server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(BackendUnavailable, match=r"ReadTimeout after 4s of silence"):
                await sb.read_file("anything")
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert (await sb.exec(["echo", "answering again"])).stdout == b"answering again\n"


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
        assert answered(server, "create_sandbox") == {"503": 3}
        # Each failed create was abandoned (its outcome unknown to a client): once each.
        assert answered(server, "abandon_create") == {"204": 3}
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
    heartbeat = heartbeat_command("t.hb", marker)

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
    assert answered(server, "exec_stream") == {"200": 2}
    assert answered(server, "cancel_exec") == {}
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


@pytest.mark.parametrize("attempts", [1, 3])
async def test_retries_of_a_call_that_never_left_stop_at_the_policys_attempts(
    make_server: Callable[..., Server], tmp_path: Path, attempts: int
) -> None:
    """The Session's RetryPolicy alone says how often a call that never left is tried:
    with ``attempts`` tries, opening the backend fails after ``attempts`` dropped
    connections and succeeds after one fewer; then a command, and a file read, over a
    link that drops every connection, is tried exactly ``attempts`` times (one connection
    each, and no kill sent for a command that never left) and fails with RequestNotSent
    (retryable). The client used to try each 4 times itself (its ``attempts``) within
    each of the Session's tries, and 4 more to cancel the command."""
    retries = RetryPolicy(attempts=attempts, backoff=0.001)
    server, cert = await _tls_server(make_server, tmp_path)
    async with tcp_proxy(_port(server)) as proxy:

        def session() -> Session:
            backend = RemoteBackend(proxy.url(), ALICE, verify=str(cert), lease_seconds=LONG_LEASE)
            return Session(backend, retries=retries, sweep=False)

        proxy.drop(attempts)
        with pytest.raises(RequestNotSent, match="cannot reach"):
            async with session():
                pass
        assert proxy.connections == proxy.dropped == attempts
        proxy.drop(attempts - 1)
        async with session() as s, s.sandbox() as sb:
            assert proxy.dropped == 2 * attempts - 1
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: sb.exec(["echo", "never"]),
                lambda: sb.read_file("nothing"),
            ]
            for call in calls:
                await proxy.cut()
                connections = proxy.connections
                with pytest.raises(RequestNotSent, match="cannot reach") as info:
                    await _dropping(proxy, attempts, call())
                assert info.value.retryable
                assert proxy.connections - connections == attempts
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


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_command_whose_answer_was_lost_is_sent_once(
    make_server: Callable[..., Server],
) -> None:
    """The command's request reaches the server, and its connection is closed as the
    answer begins (the proxy severs it): it may have run. The RetryPolicy allows 3
    attempts, yet it is never sent again: the server received one exec, and the error is
    an infrastructure error, BackendUnavailable (not RequestNotSent, not retryable), so a
    trainer masks it. A write whose answer was lost is not sent again either."""
    server = make_server()  # plain HTTP: the proxy sees the server's first answer bytes
    retries = RetryPolicy(attempts=3, backoff=0.001)
    async with tcp_proxy(_port(server)) as proxy:
        backend = RemoteBackend(proxy.url("http"), ALICE, lease_seconds=LONG_LEASE)
        async with Session(backend, retries=retries, sweep=False) as s, s.sandbox() as sb:
            calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                ("exec_stream", lambda: sb.exec(["sh", "-c", "echo ran >> runs.txt"])),
                ("write_file", lambda: sb.write_file("w.txt", b"written")),
            ]
            for operation, call in calls:
                await proxy.cut()  # the call needs a new connection
                severed = proxy.severed
                proxy.sever(1)
                with pytest.raises(BackendUnavailable, match="lost the connection") as info:
                    await call()
                assert proxy.severed - severed == 1
                assert not isinstance(info.value, RequestNotSent)
                assert not info.value.retryable
                assert sum(answered(server, operation).values()) == 1, operation
            assert (await sb.exec(["echo", "after"])).stdout == b"after\n"
