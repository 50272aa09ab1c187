"""The lifetimes the server keeps, on REAL servers on loopback: a command is killed when
its client disconnects or cancels it by id; a lease reaps the sandboxes of a client that is
gone; SIGTERM removes (or keeps) the sandboxes and kills their commands; creates are
idempotent under a key; and the served backend passes the whole contract on, its sweep of
what a previous server left running beside the serving.
"""

from __future__ import annotations

import functools
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from asyncsandbox_remote import _wire as wire

from asyncsandbox import SandboxDied, Session
from asyncsandbox.abc import Backend, SandboxHandle

from . import _remote_support as remote
from ._remote_support import create_sandbox, expect_started, heartbeat_command
from ._support import (
    ALICE,
    BOB,
    Server,
    eventually,
    eventually_async,
    processes_with,
    unique_marker,
)

# The remote family's fixtures (tests/_remote_support.py), this module's by name.
anyio_backend = remote.anyio_backend
server_dir = remote.server_dir
process_server = remote.process_server
make_server = remote.make_server


# -- cancellation, leases, shutdown -------------------------------------------------------


def test_closing_the_exec_stream_kills_the_process(process_server: Server) -> None:
    marker = unique_marker()
    with process_server.client(ALICE) as alice:
        sandbox_id = create_sandbox(alice)
        body = {"argv": heartbeat_command("s.hb", marker)}
        with alice.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec/stream", json=body) as run:
            lines = run.iter_lines()
            expect_started(next(lines))
            assert processes_with(marker)
        # The connection is closed (the body was not read to its end): the server kills it.
        eventually(lambda: not processes_with(marker), what="the command killed on disconnect")
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


async def test_disconnect_during_unary_exec_kills_the_process(process_server: Server) -> None:
    marker = unique_marker()
    with process_server.client(ALICE) as alice:
        sandbox_id = create_sandbox(alice)
    async with httpx.AsyncClient(
        base_url=process_server.url, headers={"authorization": f"Bearer {ALICE}"}
    ) as client:
        body = {"argv": heartbeat_command("u.hb", marker)}
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
        sandbox_id = create_sandbox(alice)
        marker = unique_marker()
        body = {"argv": heartbeat_command("c.hb", marker), "exec_id": "job-1"}
        with alice.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec/stream", json=body) as run:
            lines = run.iter_lines()
            expect_started(next(lines))
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
        abandoned = create_sandbox(alice)
        busy = create_sandbox(alice)
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
        ids = [create_sandbox(alice) for _ in range(3)]
    assert set(server.sandbox_dirs()) == set(ids)
    async with httpx.AsyncClient(
        base_url=server.url, headers={"authorization": f"Bearer {ALICE}"}, timeout=60
    ) as client:
        body = {"argv": ["sh", "-c", "echo started; exec sleep 600", marker]}
        async with client.stream("POST", f"/v1/sandboxes/{ids[0]}/exec/stream", json=body) as run:
            lines = run.aiter_lines()
            expect_started(await anext(lines))
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
        sandbox_id = create_sandbox(alice)
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


# -- the served backend: what the server wraps, and its sweep at start --------------------


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
