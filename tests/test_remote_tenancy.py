"""The server's tenants, against REAL servers on loopback: its API keys (401 without one),
what a tenant sees and touches (its own sandboxes, judgements and snapshots, nothing of
another's), judging on the server (one request, its requests checked, its cases killed when
the client leaves), the quotas per tenant (429) and the size limits of a request (413), and
no secret in its logs.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import httpx
import msgspec
import pytest

from asyncsandbox import BackendUnavailable, InvalidArgument, Session
from asyncsandbox.judge import Checker, Language, Program, TestCase, Verdict

from . import _remote_support as remote
from ._remote_support import answered, create_sandbox, expect_started, heartbeat_command
from ._support import ALICE, BOB, Server, eventually

# The remote family's fixtures (tests/_remote_support.py), this module's by name.
anyio_backend = remote.anyio_backend
server_dir = remote.server_dir
process_server = remote.process_server
make_server = remote.make_server


# -- auth and tenancy ---------------------------------------------------------------------


def test_missing_and_wrong_keys_answer_401(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = create_sandbox(alice)
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
        mine = create_sandbox(alice, labels={"who": "alice"})
        theirs = create_sandbox(bob, labels={"who": "bob"})
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
    judged, execs = answered(process_server, "judge"), answered(process_server, "exec")
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
    assert answered(process_server, "judge").get("200", 0) == judged.get("200", 0) + 2
    assert answered(process_server, "exec") == execs


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


# -- quotas and limits --------------------------------------------------------------------


def test_quotas_answer_429(make_server: Callable[..., Server]) -> None:
    server = make_server("--max-live-per-tenant", "2", "--max-execs-per-tenant", "1")
    with server.client(ALICE) as alice, server.client(BOB) as bob:
        first, _ = create_sandbox(alice), create_sandbox(alice)
        refused = alice.post("/v1/sandboxes", json={})
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert "max_live" in error["message"]
        assert refused.headers["retry-after"]
        create_sandbox(bob)  # quotas are per tenant
        with alice.stream(
            "POST", f"/v1/sandboxes/{first}/exec/stream", json={"argv": heartbeat_command("hb")}
        ) as running:
            # Keep the line iterator: a dropped one closes the connection when collected.
            lines = running.iter_lines()
            expect_started(next(lines))
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
        sandbox_id = create_sandbox(alice)
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
        sandbox_id = create_sandbox(alice)
        alice.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["true"]})
        assert wrong.get("/v1/sandboxes").status_code == 401
        alice.delete(f"/v1/sandboxes/{sandbox_id}")
    assert server.stop() == 0
    logs = server.logs()
    assert "remote.auth.failed" in logs
    assert "POST /v1/sandboxes" in logs
    for secret in (ALICE, BOB, BOB[:-2] + "zz", ALICE[6:], BOB[4:]):
        assert secret not in logs
