"""When the sandbox fails a ``/run_code`` request, not the program, on a REAL server
(tests/_fusion_support.py): a sandbox that dies under its program answers SandboxError
(which the real client raises), and a client that leaves gets its program killed.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from sandbox_fusion import RunCodeRequest

from . import _fusion_support as fusion
from ._fusion_support import keyed, run, wait_until_started
from ._support import ALICE, Server, eventually, kill_process_sandbox_processes

# The fusion family's fixtures (tests/_fusion_support.py), this module's by name.
fusion_dir = fusion.fusion_dir
server = fusion.server
endpoint = fusion.endpoint


def test_an_infrastructure_failure_is_sandbox_error(server: Server) -> None:
    """The sandbox dies under the program (its processes killed from outside): ours, not
    the program's, so SandboxError (the client raises it), not Failed."""
    answer: dict[str, Any] = {}
    # Its own marker: an ended request's sandbox, waiting for its reset, may still hold
    # another test's (then the wrong sandbox was killed, and the program ran to its limit).
    marker = f"started-{uuid.uuid4().hex[:8]}"

    def post() -> None:
        payload = {"code": f"echo started > {marker}; sleep 60", "language": "bash"}
        response = requests.post(f"{keyed(server)}/run_code", json=payload, timeout=120)
        answer.update(response.json())

    sandbox_id = _kill_once_started(server, post, marker)
    assert answer["status"] == "SandboxError", answer
    assert answer["message"].startswith("infrastructure error: "), answer
    assert answer["run_result"] is None  # no result of the program: it did not end
    eventually(lambda: sandbox_id not in server.sandbox_dirs(), within=30)  # not recycled: removed


def _kill_once_started(server: Server, request: Callable[[], None], marker: str) -> str:
    """Send ``request`` from a thread (its program writes ``started``, then sleeps) and,
    once the program started, SIGKILL its sandbox's processes from outside; then wait for
    the request to end. The sandbox's id."""
    thread = threading.Thread(target=request)
    thread.start()
    try:
        sandbox_id = wait_until_started(server.root, marker)
        if not kill_process_sandbox_processes(sandbox_id):
            pytest.skip("killing a process sandbox from outside needs its cgroup (root)")
    finally:
        thread.join(60)
    return sandbox_id


@pytest.mark.usefixtures("endpoint")
def test_the_client_raises_on_sandbox_error(server: Server) -> None:
    errors: list[BaseException] = []
    marker = f"started-{uuid.uuid4().hex[:8]}"

    def call() -> None:
        try:
            run(RunCodeRequest(code=f"touch {marker}; sleep 60", language="bash"))
        except Exception as exc:  # noqa: BLE001 - what the client raises is the point
            errors.append(exc)

    _kill_once_started(server, call, marker)
    assert len(errors) == 1
    assert "Sandbox responded with error" in str(errors[0])


def test_a_client_that_leaves_gets_its_program_killed(server: Server) -> None:
    """The program would run for 100 s: the client's leaving, once it runs, kills it long
    before that, and its sandbox is removed or reset (the next request's, fresh)."""
    marker = f"started-{uuid.uuid4().hex[:8]}"
    # A sleep of its own (its seconds unique): other suites on the machine sleep too.
    seconds = f"100.{uuid.uuid4().int % 10**8:08d}"
    payload = {
        "code": f"touch {marker}; exec sleep {seconds}",
        "language": "bash",
        "run_timeout": 200,
    }
    url = urllib.parse.urlsplit(server.url)
    assert url.hostname is not None
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    credentials = base64.b64encode(f"fusion:{ALICE}".encode()).decode()
    connection.request(
        "POST",
        f"{url.path.rstrip('/')}/run_code",
        body=json.dumps(payload),
        headers={"Content-Type": "application/json", "Authorization": f"Basic {credentials}"},
    )
    sandbox_id = wait_until_started(server.root, marker)  # not before: then nothing runs
    assert server.root is not None
    started = next((server.root / sandbox_id).glob(f"fs/**/{marker}"))
    # The program is `touch MARKER; exec sleep ...`: the marker comes a moment before sleep.
    eventually(lambda: _sleepers(seconds) == 1, within=20, what="the program sleeping")
    assert connection.sock is not None
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    eventually(lambda: _sleepers(seconds) == 0 and not started.exists(), within=20)

    def counted() -> bool:  # once the sandbox is released, a moment after its program died
        metrics = requests.get(f"{server.url}/metrics", timeout=60).text
        killed = r"^asyncsandbox_remote_disconnect_kills_total [1-9]"
        return re.search(killed, metrics, re.MULTILINE) is not None

    eventually(counted, within=20, what="the kill counted")


def _sleepers(seconds: str) -> int:
    """Processes on this machine running ``sleep SECONDS`` (the test's program)."""
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            count += (proc / "cmdline").read_bytes() == f"sleep\x00{seconds}\x00".encode()
        except OSError:
            continue
    return count
