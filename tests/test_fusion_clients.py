"""The clients of ``/run_code`` beside the real client's sync call, on a REAL server
(tests/_fusion_support.py): the ``sandbox_fusion`` async client (aiohttp), and verl's
pattern, many raw ``requests.post`` from a thread pool with the key in the URL, served
from the sandboxes of ended requests.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import anyio.to_thread
import pytest
import requests
import sandbox_fusion as sf
from sandbox_fusion import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus

from . import _fusion_support as fusion
from ._fusion_support import COMPILE, FAIL, FOREVER, OK, keyed
from ._support import Server, eventually

# The fusion family's fixtures (tests/_fusion_support.py), this module's by name.
anyio_backend = fusion.anyio_backend
fusion_dir = fusion.fusion_dir
server = fusion.server


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiohttp runs on asyncio only
async def test_the_async_client(server: Server) -> None:
    url = keyed(server)
    requests_ = [
        RunCodeRequest(code=OK["python"], language="python", stdin="async"),
        RunCodeRequest(code=FAIL["bash"], language="bash"),
        RunCodeRequest(code=OK["cpp"], language="cpp", stdin="cpp", compile_timeout=COMPILE),
        RunCodeRequest(code=FOREVER["python"], language="python", run_timeout=1),
    ]
    answers: list[RunCodeResponse | None] = [None] * len(requests_)

    async def one(i: int) -> None:
        answers[i] = await sf.run_code_async(requests_[i], endpoint=url, max_attempts=1)

    async with anyio.create_task_group() as tg:
        for i in range(len(requests_)):
            tg.start_soon(one, i)
    ok, failed, cpp, forever = answers
    assert ok is not None
    assert ok.status == RunStatus.Success
    assert ok.run_result is not None
    assert ok.run_result.stdout == "hello async 45\n"
    assert failed is not None
    assert failed.status == RunStatus.Failed
    assert failed.run_result is not None
    assert failed.run_result.return_code == 3
    assert cpp is not None
    assert cpp.run_result is not None
    assert cpp.run_result.stdout == "hello cpp 45\n"
    assert forever is not None
    assert forever.run_result is not None
    assert forever.run_result.status == CommandRunStatus.TimeLimitExceeded


def test_verl_concurrent_requests(server: Server) -> None:
    """verl's pattern: many raw ``requests.post`` from a thread pool, key in the URL."""
    url = f"{keyed(server)}/run_code"

    def call(i: int) -> tuple[int, dict[str, Any]]:
        payload: dict[str, Any] = {
            "compile_timeout": 60,
            "run_timeout": 10,
            "code": "import sys\nn = int(sys.stdin.read())\nprint(n * n)\n"
            if i % 2
            else f"read n\necho $((n * n))\nexit {i % 3}\n",
            "stdin": str(i),
            "memory_limit_MB": 1024,
            "language": "python" if i % 2 else "bash",
            "files": {},
            "fetch_files": [],
        }
        response = requests.post(url, json=payload, timeout=120)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        return i, response.json()

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(call, range(64)))
    assert len(results) == 64
    for i, answer in results:
        expected_code = 0 if i % 2 else i % 3
        assert answer["run_result"]["stdout"] == f"{i * i}\n", (i, answer)
        assert answer["run_result"]["return_code"] == expected_code, (i, answer)
        assert answer["status"] == ("Success" if expected_code == 0 else "Failed"), (i, answer)
    # Requests after the first sixteen were given the sandboxes of ended ones, reset (on
    # the old code each reset failed on the server: a sandbox was created per request).
    assert _metric(server, "session_pool_hits_total") >= 64 - 16
    # What is left of the requests' sandboxes is ready for the next ones, and nothing else.
    eventually(
        lambda: len(server.sandbox_dirs()) == _metric(server, "session_pool_ready"), within=30
    )


def _metric(server: Server, name: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=60).text
    found = re.search(rf"^asyncsandbox_remote_{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{name} is not in /metrics"
    return float(found.group(1))
