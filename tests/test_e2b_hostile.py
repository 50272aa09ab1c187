"""Hostile input on the E2B routes of a REAL ``asyncsandbox serve`` (process backend, on
loopback): the control plane and envd's unary routes fuzzed from their OpenAPI document
(``/e2b/openapi.json``), and by hand what a document cannot describe: malformed and huge
Connect envelopes, paths that try to leave the sandbox, unknown ids and another tenant's.
Every answer is a clear error; the sandbox and the server go on working.
"""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from asyncsandbox_remote._e2b._openapi import e2b_openapi

from ._support import ALICE, BOB, Server, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose quotas bound what the fuzzer makes."""
    directory = tmp_path_factory.mktemp("e2b-hostile") / "main"
    with serving(directory, "--max-live-per-tenant", "6") as started:
        yield started


class E2bTarget:
    """A real E2B sandbox of a tenant (made again when something killed it)."""

    def __init__(self, server: Server, key: str = ALICE) -> None:
        self.server = server
        self.key = key
        self.id = ""
        self.token = ""
        self.traffic = ""
        self.calls = 0

    def alive(self) -> E2bTarget:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            headers = {"X-API-KEY": self.key}
            found = client.get(f"/sandboxes/{self.id}", headers=headers) if self.id else None
            # (The fuzzer may have killed it, or paused it: a paused one is found too.)
            if found is None or found.is_error or found.json().get("state") != "running":
                made = client.post(
                    "/v2/sandboxes", json={"templateID": "base", "timeout": 600}, headers=headers
                )
                assert made.status_code == 201, made.text
                self.id = made.json()["sandboxID"]
                self.token = made.json()["envdAccessToken"]
                self.traffic = made.json()["trafficAccessToken"]
        return self

    @property
    def headers(self) -> dict[str, str]:
        return {
            "E2b-Sandbox-Id": self.id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": self.token,
        }

    @property
    def interpreter_headers(self) -> dict[str, str]:
        """What the code interpreter's SDK sends (the access token with /execute only)."""
        return {
            "E2b-Sandbox-Id": self.id,
            "E2b-Sandbox-Port": "49999",
            "E2B-Traffic-Access-Token": self.traffic,
        }

    def envd(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        """A unary Connect call (JSON) to the sandbox's envd."""
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.post(
            f"{self.server.url}{path}", json=body or {}, headers=headers, timeout=60, **kwargs
        )

    def run(self, command: str) -> bytes:
        """stdout of ``bash -c command`` in the sandbox (a Start stream, read whole)."""
        request = msgspec.json.encode(
            {"process": {"cmd": "/bin/bash", "args": ["-c", command]}, "stdin": False}
        )
        answer = httpx.post(
            f"{self.server.url}/process.Process/Start",
            content=struct.pack(">BI", 0, len(request)) + request,
            headers={**self.headers, "Content-Type": "application/connect+json"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        out, body = b"", answer.content
        while body:
            flags, length = struct.unpack(">BI", body[:5])
            message = msgspec.json.decode(body[5 : 5 + length])
            body = body[5 + length :]
            if flags & 2:
                assert "error" not in message, message
                continue
            data = message.get("event", {}).get("data", {})
            out += base64.b64decode(data.get("stdout", ""))
        return out


@pytest.fixture(scope="module")
def target(server: Server) -> E2bTarget:
    return E2bTarget(server)


# -- the document and the fuzzer --------------------------------------------------------


def test_the_document_is_served(server: Server) -> None:
    document = httpx.get(f"{server.url}/e2b/openapi.json", timeout=30).json()
    assert document == msgspec.json.decode(
        msgspec.json.encode(e2b_openapi(document["info"]["version"]))
    )
    assert "post" in document["paths"]["/v2/sandboxes"]
    assert "post" in document["paths"]["/filesystem.Filesystem/Stat"]


def _fuzz_test() -> Any:
    import schemathesis
    from hypothesis import HealthCheck, settings
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    # envd's streams carry Connect envelopes, which a document cannot describe: they are
    # fuzzed by hand below.
    streams = "/(Start|Connect|StreamInput|WatchDir)$"
    schema = schemathesis.openapi.from_dict(e2b_openapi()).exclude(path_regex=streams)

    @schemathesis.check
    def no_undocumented_server_error(ctx: Any, response: Any, case: Any) -> None:
        """A 5xx only where the document says why (501: not offered; 502: the sandbox
        was not found; 503, 504): never an internal error."""
        documented = case.operation.definition.raw["responses"]
        if response.status_code >= 500 and str(response.status_code) not in documented:
            raise AssertionError(
                f"{case.operation.label}: undocumented {response.status_code}: "
                f"{response.content[:300]!r}"
            )

    @schema.parametrize()
    @settings(
        max_examples=int(os.environ.get("ASYNCSANDBOX_FUZZ_EXAMPLES", "50")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    def test_fuzz_e2b_api(case: Any, target: E2bTarget) -> None:
        """E2B's routes fuzzed from their own document: no internal error, answers as
        documented. Half the calls reach a real sandbox of the tenant (its id and token)."""
        target.calls += 1
        real = target.calls % 2 == 1
        if "sandbox_id" in (case.path_parameters or {}) and real:
            case.path_parameters["sandbox_id"] = target.alive().id
        if case.headers and "E2b-Sandbox-Id" in case.headers and real:
            interpreter = case.headers.get("E2b-Sandbox-Port") == "49999" or (
                case.operation.path.startswith(("/execute", "/contexts"))
            )
            alive = target.alive()
            case.headers.update(alive.interpreter_headers if interpreter else alive.headers)
        if isinstance(case.body, dict) and "timeout" in case.body:
            case.body["timeout"] = 20  # what the fuzzer makes ends soon
        response = case.call(base_url=target.server.url, headers={"X-API-KEY": ALICE}, timeout=60)
        case.validate_response(
            response,
            checks=[
                no_undocumented_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )

    return test_fuzz_e2b_api


# Slow: about 150 s here under load (every operation, 50 examples each); -m slow runs it.
test_fuzz_e2b_api = pytest.mark.slow(_fuzz_test())


def test_the_target_survived_the_fuzzer(target: E2bTarget) -> None:
    """(Run after the fuzzer: its sandbox, or a new one, still runs commands.)"""
    assert target.alive().run("echo still here") == b"still here\n"


# -- Connect envelopes ------------------------------------------------------------------


def _stream(
    target: E2bTarget, body: bytes, method: str = "process.Process/Start"
) -> httpx.Response:
    return httpx.post(
        f"{target.server.url}/{method}",
        content=body,
        headers={**target.headers, "Content-Type": "application/connect+json"},
        timeout=60,
    )


def _end_error(answer: httpx.Response) -> dict[str, Any]:
    """The error of a Connect stream's answer (its end message, or a unary error)."""
    if answer.status_code != 200:
        error: dict[str, Any] = answer.json()
        return error
    body = answer.content
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        message = msgspec.json.decode(body[5 : 5 + length])
        body = body[5 + length :]
        if flags & 2:
            return dict(message["error"])
    raise AssertionError(f"no end message in {answer.content[:300]!r}")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        # (Connect's codes: a message over the limit is resource_exhausted; a stream of
        # zero or two messages to a method that takes one is a cardinality violation,
        # unimplemented; a compressed message without an encoding is internal.)
        (b"\x00\x7f\xff\xff\xff{}", "resource_exhausted"),  # announces 2 GiB
        (b"\x00\x01\x00\x00\x01" + b"{" * 16, "resource_exhausted"),  # 16 MiB + 1 announced
        (b"\x00\x00\x00\x00\x10{", "unimplemented"),  # truncated: no whole message
        (b"\x00\x00\x00\x00\x02}{", "invalid_argument"),  # not JSON
        (b'\x00\x00\x00\x00\x0a{"tag": 7}', "invalid_argument"),  # a field of the wrong type
        (b"\x01\x00\x00\x00\x02{}", "internal"),  # compressed, without an encoding
        (b"", "unimplemented"),  # no message at all
        (b"\x00\x00\x00\x00\x02{}" * 2, "unimplemented"),  # two messages to a unary input
    ],
)
def test_malformed_envelopes_are_clear_errors(target: E2bTarget, body: bytes, code: str) -> None:
    error = _end_error(_stream(target.alive(), body))
    assert (error["code"], bool(error["message"])) == (code, True), error
    assert target.run("echo fine") == b"fine\n"


def test_a_huge_frame_is_refused_without_reading_it(target: E2bTarget) -> None:
    """A valid request in a frame over the limit (16 MiB) is refused, never run nor
    buffered whole; the sandbox and the server go on."""
    padding = "x" * (20 * 1024 * 1024)
    request = msgspec.json.encode(
        {"process": {"cmd": "/bin/sh", "args": ["-c", "touch /tmp/ran", padding]}}
    )
    answer = _stream(target.alive(), struct.pack(">BI", 0, len(request)) + request)
    assert _end_error(answer)["code"] == "resource_exhausted"
    assert target.run("ls /tmp/ran 2>/dev/null || echo never ran") == b"never ran\n"
    assert target.run("echo fine") == b"fine\n"


def test_a_wrong_content_type_or_method_is_refused(target: E2bTarget) -> None:
    target.alive()
    text = httpx.post(
        f"{target.server.url}/process.Process/List",
        content=b"{}",
        headers={**target.headers, "Content-Type": "text/plain"},
        timeout=30,
    )
    assert text.status_code == 415
    unknown = target.envd("/process.Process/Nope")
    assert unknown.status_code in (404, 501)
    get = httpx.get(f"{target.server.url}/process.Process/List", headers=target.headers)
    assert get.status_code in (405, 415)
    assert target.run("echo fine") == b"fine\n"


# -- what the fuzzer found ----------------------------------------------------------------


def test_envd_routes_without_a_sandbox_are_refused_clearly(server: Server) -> None:
    """envd's paths without E2b-Sandbox-Id are no route of the server's own API: they
    answer E2B's error saying what is missing (they answered the API's 404)."""
    for path in ("/filesystem.Filesystem/Stat", "/process.Process/List", "/health"):
        answer = httpx.post(f"{server.url}{path}", json={}, headers={"X-API-KEY": ALICE})
        assert answer.status_code == 400, (path, answer.text)
        assert "E2b-Sandbox-Id" in answer.json()["message"]


def test_a_message_of_the_wrong_shape_is_invalid_argument(target: E2bTarget) -> None:
    """A field of the wrong JSON type, a number out of range, an unknown enum: the
    client's error (400 invalid_argument), never the server's (they answered 500)."""
    target.alive()
    for method, body in (
        ("/filesystem.Filesystem/Stat", {"path": {}}),
        ("/filesystem.Filesystem/ListDir", {"path": "/", "depth": -1}),
        ("/process.Process/SendSignal", {"process": {"pid": 1}, "signal": {}}),
        ("/process.Process/SendInput", {"process": {"pid": 1}, "input": {"stdin": [1]}}),
    ):
        answer = target.envd(method, body)
        assert answer.status_code == 400, (method, answer.text)
        assert answer.json()["code"] == "invalid_argument"


def test_a_move_onto_itself_does_nothing(target: E2bTarget) -> None:
    """As envd's rename: it answered 500 (mv refused it, an "internal" error). Another
    refusal of mv is about the files, a failed precondition, never internal."""
    target.alive()
    target.run("mkdir -p /home/user/d/sub")
    same = target.envd("/filesystem.Filesystem/Move", {"source": "d", "destination": "d"})
    assert same.status_code == 200, same.text
    assert same.json()["entry"]["path"] == "/home/user/d"
    into = target.envd("/filesystem.Filesystem/Move", {"source": "d", "destination": "d/sub/d"})
    assert (into.status_code, into.json()["code"]) == (400, "failed_precondition"), into.text


# -- paths, ids, tenants ----------------------------------------------------------------


def test_paths_cannot_leave_the_sandbox(target: E2bTarget, server: Server) -> None:
    """../, absolute host paths and symlinks name the sandbox's own files: a host file no
    sandbox may see stays unseen."""
    target.alive()
    assert server.root is not None
    secret = server.root.parent / f"host-secret-{os.getpid()}"
    secret.write_text("host only")
    try:
        for path in (f"../../../../{secret}", str(secret), f"/home/user/../../{secret}"):
            stat = target.envd("/filesystem.Filesystem/Stat", {"path": path})
            assert stat.status_code == 404, stat.text
            read = httpx.get(
                f"{server.url}/files",
                params={"path": path, "username": "user"},
                headers=target.headers,
            )
            assert read.status_code == 404
            assert b"host only" not in read.content
        target.run(f"ln -sf {secret} /home/user/escape")
        read = httpx.get(
            f"{server.url}/files",
            params={"path": "/home/user/escape", "username": "user"},
            headers=target.headers,
        )
        assert read.status_code == 404
        assert b"host only" not in read.content
        nul = target.envd("/filesystem.Filesystem/Stat", {"path": "a\x00b"})
        assert nul.status_code == 400
    finally:
        secret.unlink()


def test_unknown_ids_are_not_found(target: E2bTarget) -> None:
    target.alive()
    for method, body in (
        ("/process.Process/SendSignal", {"process": {"pid": 4242}, "signal": "SIGNAL_SIGKILL"}),
        ("/process.Process/SendInput", {"process": {"tag": "nope"}, "input": {"stdin": "eA=="}}),
        ("/process.Process/CloseStdin", {"process": {"pid": 1}}),
        ("/filesystem.Filesystem/GetWatcherEvents", {"watcherId": "nope"}),
        ("/filesystem.Filesystem/RemoveWatcher", {"watcherId": "../../x"}),
    ):
        answer = target.envd(method, body)
        assert answer.status_code == 404, (method, answer.text)
        assert answer.json()["code"] == "not_found"
    unknown = httpx.post(
        f"{target.server.url}/process.Process/List",
        json={},
        headers={**target.headers, "E2b-Sandbox-Id": "x" * 5000},
    )
    assert unknown.status_code == 502
    assert "was not found" in unknown.json()["message"]


def test_another_tenants_ids_reach_nothing(target: E2bTarget, server: Server) -> None:
    """Bob's sandbox with Alice's token, Alice's with Bob's, Bob's watcher and pid in
    Alice's sandbox, Bob's sandbox on Alice's control plane: refused or not found."""
    alice = target.alive()
    bob = E2bTarget(server, BOB).alive()
    try:
        crossed = {**bob.headers, "X-Access-Token": alice.token}
        answer = httpx.post(f"{server.url}/process.Process/List", json={}, headers=crossed)
        assert answer.status_code == 401
        watcher = bob.envd("/filesystem.Filesystem/CreateWatcher", {"path": "/home/user"})
        assert watcher.status_code == 200, watcher.text
        theirs = alice.envd(
            "/filesystem.Filesystem/GetWatcherEvents", {"watcherId": watcher.json()["watcherId"]}
        )
        assert theirs.status_code == 404
        for verb, path in (
            ("GET", f"/sandboxes/{bob.id}"),
            ("DELETE", f"/sandboxes/{bob.id}"),
            ("POST", f"/sandboxes/{bob.id}/timeout"),
            ("POST", f"/sandboxes/{bob.id}/snapshots"),
        ):
            answer = httpx.request(
                verb,
                f"{server.url}{path}",
                json={"timeout": 5, "memory": False},
                headers={"X-API-KEY": ALICE},
            )
            assert answer.status_code == 404, (verb, path, answer.text)
        assert bob.run("echo bob") == b"bob\n"
    finally:
        httpx.delete(f"{server.url}/sandboxes/{bob.id}", headers={"X-API-KEY": BOB})


def test_a_gzip_bomb_is_refused(target: E2bTarget, server: Server, tmp_path: Path) -> None:
    """An upload that inflates past the server's file limit is refused (413), not
    inflated without bound."""
    import gzip

    bomb = gzip.compress(b"\x00" * (300 * 1024 * 1024), compresslevel=9)
    answer = httpx.post(
        f"{server.url}/files",
        params={"path": "/tmp/bomb", "username": "user"},
        content=bomb,
        headers={
            **target.alive().headers,
            "Content-Type": "application/octet-stream",
            "Content-Encoding": "gzip",
        },
        timeout=120,
    )
    assert answer.status_code == 413, answer.text
    assert target.run("ls /tmp/bomb 2>&1 || true").startswith(b"ls: cannot access")


# -- the code interpreter (port 49999) ----------------------------------------------------


def _execute(target: E2bTarget, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(
        f"{target.server.url}/execute",
        headers={**target.alive().interpreter_headers, **kwargs.pop("headers", {})},
        timeout=120,
        **({"json": body} if not isinstance(body, bytes) else {"content": body}),
        **kwargs,
    )


def test_interpreter_requests_of_the_wrong_shape_are_clear_errors(target: E2bTarget) -> None:
    assert _execute(target, b"{not json").status_code == 400
    assert _execute(target, {"code": 5}).status_code == 400
    assert _execute(target, {"code": "1", "env_vars": {"A": 1}}).status_code == 400
    both = _execute(target, {"code": "1", "context_id": "x", "language": "python"})
    assert (both.status_code, both.text) == (
        400,
        "Only one of context_id or language can be provided",
    )
    assert _execute(target, {"code": "1", "context_id": "../../etc"}).status_code == 404
    contexts = f"{target.server.url}/contexts"
    headers = target.interpreter_headers
    assert httpx.delete(f"{contexts}/nope", headers=headers).status_code == 404
    assert httpx.post(f"{contexts}/nope/restart", headers=headers).status_code == 404
    assert httpx.post(contexts, content=b"[]", headers=headers).status_code == 400
    # An environment the interpreter refuses is the execution's error, as E2B's are.
    lines = [
        msgspec.json.decode(line)
        for line in _execute(target, {"code": "1", "env_vars": {"A=B": "x"}}).text.splitlines()
    ]
    assert [line["type"] for line in lines] == ["error", "end_of_execution"]
    assert lines[0]["name"] == "InvalidArgument"
    assert target.run("echo fine") == b"fine\n"


def test_a_huge_execute_is_refused_without_running_it(target: E2bTarget) -> None:
    """A body past the interpreter's limit (16 MiB) is refused as declared, never read
    whole nor run."""
    code = "open('/tmp/ran-huge', 'w').write('x')\n#" + "x" * (20 * 1024 * 1024)
    answer = _execute(target, {"code": code})
    assert answer.status_code == 413
    assert target.run("ls /tmp/ran-huge 2>/dev/null || echo never ran") == b"never ran\n"
