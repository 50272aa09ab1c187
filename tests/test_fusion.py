"""SandboxFusion's ``/run_code`` on a REAL ``asyncsandbox serve`` (process backend, on
loopback), driven by the real ``sandbox_fusion`` client (sync and async) and by verl's
raw ``requests.post`` pattern. Neither can send a header: the API key travels in the URL
(``http://user:KEY@host:port``, sent as HTTP Basic). Answers are compared with the same
programs run directly through our own API (Session + ``sandbox.exec``).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import requests
import sandbox_fusion as sf
from sandbox_fusion import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus

from asyncsandbox import ExecTimeout, Session

from ._support import ALICE, Server, eventually, kill_process_sandbox_processes, new_process_root

# -- the programs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Lang:
    """How the test itself runs a language through our API (independent of the server)."""

    source: str
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None


LANGS = {
    "python": Lang("main.py", ("python3", "main.py")),
    "bash": Lang("main.sh", ("bash", "main.sh")),
    "cpp": Lang("main.cpp", ("./main",), ("g++", "-O2", "main.cpp", "-o", "main")),
    "nodejs": Lang("main.js", ("node", "main.js")),
    "perl": Lang("main.pl", ("perl", "main.pl")),
}

# Each reads a name on stdin and prints a greeting and a sum computed by the program.
OK = {
    "python": "name = input()\nprint(f'hello {name}', sum(range(10)))\n",
    "bash": 'read name\ns=0; for i in $(seq 0 9); do s=$((s+i)); done\necho "hello $name $s"\n',
    "cpp": (
        "#include <iostream>\n#include <string>\nint main() { std::string name; "
        "std::cin >> name; int s = 0; for (int i = 0; i < 10; i++) s += i; "
        'std::cout << "hello " << name << " " << s << std::endl; }\n'
    ),
    "nodejs": (
        "const name = require('fs').readFileSync(0, 'utf8').trim();\n"
        "let s = 0; for (let i = 0; i < 10; i++) s += i;\nconsole.log(`hello ${name} ${s}`);\n"
    ),
    "perl": 'my $n = <STDIN>; chomp $n; my $s = 0; $s += $_ for 0..9; print "hello $n $s\\n";\n',
}
# Each prints something, then fails: an exception, or a non-zero exit.
FAIL = {
    "python": "print('before')\nraise ValueError('boom')\n",
    "bash": "echo before\necho boom >&2\nexit 3\n",
    "cpp": (
        "#include <cstdio>\n#include <cstdlib>\n"
        'int main() { puts("before"); fflush(stdout); fprintf(stderr, "boom\\n"); exit(3); }\n'
    ),
    "nodejs": "console.log('before');\nthrow new Error('boom');\n",
    "perl": 'print "before\\n"; die "boom\\n";\n',
}
FOREVER = {
    "python": "print('start', flush=True)\nwhile True:\n    pass\n",
    "bash": "echo start\nwhile true; do :; done\n",
    "cpp": (
        '#include <cstdio>\nint main() { puts("start"); fflush(stdout); '
        "volatile unsigned long i = 0; for (;;) i++; }\n"
    ),
    "nodejs": "console.log('start');\nfor (;;) {}\n",
    "perl": '$| = 1; print "start\\n"; 1 while 1;\n',
}


async def run_directly(language: str, code: str, stdin: str | None) -> tuple[str, int]:
    """The program run through our own API: (stdout, exit status)."""
    lang = LANGS[language]
    async with Session("process", sweep=False) as session, session.sandbox() as sandbox:
        await sandbox.write_file(lang.source, code)
        if lang.compile is not None:
            compiled = await sandbox.exec(lang.compile, timeout=60)
            assert compiled.returncode == 0, compiled.stderr_text
        result = await sandbox.exec(lang.run, stdin=stdin, timeout=30)
        return result.stdout_text, result.returncode


# -- the server ---------------------------------------------------------------------------


# A real server, clients on asyncio: the remote client on trio is proven by
# test_remote.py's conformance run on both loops; the fusion endpoint is the server's.
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fusion_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fusion")


@pytest.fixture(scope="module")
def server(fusion_dir: Path) -> Iterator[Server]:
    root = new_process_root()
    started = Server(fusion_dir / "main", root=root)
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(root, ignore_errors=True)


def keyed(server: Server, key: str = ALICE) -> str:
    """The server's URL with the key in its userinfo, as a SandboxFusion user sets it."""
    scheme, _, rest = server.url.partition("://")
    return f"{scheme}://fusion:{key}@{rest}"


@pytest.fixture
def endpoint(server: Server) -> Iterator[str]:
    """The fusion client pointed at the server (its module-level setting), key in the URL."""
    url = keyed(server)
    sf.set_sandbox_endpoint(url)
    try:
        yield url
    finally:
        sf.set_sandbox_endpoint("")


COMPILE = 60
"""The compile timeout of the tests' C++ programs: under CI's load, g++ took longer than
SandboxFusion's default of 10 s."""


def run(request: RunCodeRequest) -> RunCodeResponse:
    """The real client's ``run_code`` (one attempt: a failure shows, not a retry)."""
    response: RunCodeResponse = sf.run_code(request, max_attempts=1, client_timeout=120)
    return response


# -- languages ----------------------------------------------------------------------------


@pytest.mark.usefixtures("endpoint")
@pytest.mark.parametrize("language", sorted(LANGS))
async def test_a_passing_program_answers_as_our_api(language: str) -> None:
    stdin = f"world-{uuid.uuid4().hex[:6]}\n"
    response = await anyio.to_thread.run_sync(
        run,
        RunCodeRequest(code=OK[language], language=language, stdin=stdin, compile_timeout=COMPILE),
    )
    assert response.status == RunStatus.Success, response
    assert response.run_result is not None
    assert response.run_result.status == CommandRunStatus.Finished
    assert response.run_result.stdout == f"hello {stdin.strip()} 45\n"
    assert response.run_result.return_code == 0
    assert response.run_result.execution_time is not None
    assert response.run_result.execution_time > 0
    if language == "cpp":
        assert response.compile_result is not None
        assert response.compile_result.status == CommandRunStatus.Finished
        assert response.compile_result.return_code == 0
    else:
        assert response.compile_result is None
    stdout, returncode = await run_directly(language, OK[language], stdin)
    assert (response.run_result.stdout, response.run_result.return_code) == (stdout, returncode)


@pytest.mark.usefixtures("endpoint")
@pytest.mark.parametrize("language", sorted(LANGS))
async def test_a_failing_program_answers_as_our_api(language: str) -> None:
    response = await anyio.to_thread.run_sync(
        run, RunCodeRequest(code=FAIL[language], language=language, compile_timeout=COMPILE)
    )
    assert response.status == RunStatus.Failed, response
    result = response.run_result
    assert result is not None
    assert result.status == CommandRunStatus.Finished  # the program's own failure
    assert result.return_code not in (None, 0)
    assert result.stdout == "before\n"
    assert "boom" in (result.stderr or "")
    stdout, returncode = await run_directly(language, FAIL[language], None)
    assert (result.stdout, result.return_code) == (stdout, returncode)
    assert sf.summary_run_code_result(response, sf.SummaryMapping(RunFailed="run failed")) == (
        "run failed"
    )


@pytest.mark.usefixtures("endpoint")
@pytest.mark.parametrize("language", sorted(LANGS))
def test_a_program_past_its_run_timeout_is_killed(language: str) -> None:
    # 3 s: under CI's load, node took longer than 1 s to print its first line.
    response = run(
        RunCodeRequest(
            code=FOREVER[language], language=language, run_timeout=3, compile_timeout=COMPILE
        )
    )
    assert response.status == RunStatus.Failed, response
    assert response.run_result is not None
    assert response.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert response.run_result.return_code is None  # as SandboxFusion reports it
    assert response.run_result.stdout == "start\n"  # the output until it was killed
    mapping = sf.SummaryMapping(RunTimeout="run timeout")
    assert sf.summary_run_code_result(response, mapping) == "run timeout"


async def test_our_api_times_out_the_same_program() -> None:
    """The same program through our API: run_timeout is exec's own timeout."""
    async with Session("process", sweep=False) as session, session.sandbox() as sandbox:
        await sandbox.write_file("main.py", FOREVER["python"])
        with pytest.raises(ExecTimeout) as info:
            await sandbox.exec(["python3", "main.py"], timeout=3)  # as above: 3 s, for load
    assert info.value.result.stdout == b"start\n"


@pytest.mark.usefixtures("endpoint")
def test_a_program_that_does_not_compile_fails_with_its_compile_result() -> None:
    code = "int main() { return undefined_name; }\n"
    response = run(RunCodeRequest(code=code, language="cpp", compile_timeout=COMPILE))
    assert response.status == RunStatus.Failed, response
    assert response.run_result is None
    compiled = response.compile_result
    assert compiled is not None
    assert compiled.status == CommandRunStatus.Finished
    assert compiled.return_code not in (None, 0)
    assert "undefined_name" in (compiled.stderr or "")
    mapping = sf.SummaryMapping(CompileFailed="compile failed")
    assert sf.summary_run_code_result(response, mapping) == "compile failed"


@pytest.mark.usefixtures("endpoint")
def test_a_compile_past_its_compile_timeout() -> None:
    code = "#include <bits/stdc++.h>\nint main() { std::cout << 1; }\n"
    response = run(RunCodeRequest(code=code, language="cpp", compile_timeout=0.05))
    assert response.status == RunStatus.Failed, response
    assert response.run_result is None
    assert response.compile_result is not None
    assert response.compile_result.status == CommandRunStatus.TimeLimitExceeded
    mapping = sf.SummaryMapping(CompileTimeout="compile timeout")
    assert sf.summary_run_code_result(response, mapping) == "compile timeout"


@pytest.mark.usefixtures("endpoint")
def test_c_goes_as_cpp() -> None:
    code = (
        '#include <stdio.h>\nint main(void) { int x; scanf("%d", &x); printf("%d\\n", x * 2); }\n'
    )
    response = run(RunCodeRequest(code=code, language="cpp", stdin="21", compile_timeout=COMPILE))
    assert response.status == RunStatus.Success, response
    assert response.run_result is not None
    assert response.run_result.stdout == "42\n"


# -- files, memory ------------------------------------------------------------------------

LEAVES_AN_ANSWER = """\
import os, sys
a, b = map(int, sys.stdin.read().split())
parent = os.getpid()
if os.fork() == 0:
    while os.getppid() == parent:  # the moment the program has exited
        pass
    os.write(1, b"%d\\n" % (a + b))
    os._exit(0)
os._exit(0)
"""


@pytest.mark.usefixtures("endpoint")
def test_the_output_is_the_programs_own() -> None:
    """A program that exits at once, leaving a process that prints the answer the moment
    it is gone (a reward hack against a verl-style `stdout == expected` reward): nothing
    written after the program ended is its output. Failed on the old /run_code (an exec)
    in about half the requests."""
    for n in range(12):
        answer = run(RunCodeRequest(code=LEAVES_AN_ANSWER, language="python", stdin=f"{n} 1\n"))
        assert answer.status == RunStatus.Success, answer
        assert answer.run_result is not None
        assert answer.run_result.stdout == "", (n, answer.run_result)


@pytest.mark.usefixtures("endpoint")
@pytest.mark.parametrize("language", ["python", "cpp"])
def test_files_in_and_fetch_files_out(language: str) -> None:
    data = bytes(range(256)) * 3  # not UTF-8
    code = {
        "python": (
            "import helper\n"
            "data = open('in/data.bin', 'rb').read()\n"
            "open('out.bin', 'wb').write(data[::-1])\n"
            "print(helper.VALUE, len(data))\n"
        ),
        "cpp": (
            '#include <fstream>\n#include <iostream>\n#include <iterator>\n#include "helper.h"\n'
            'int main() { std::ifstream in("in/data.bin", std::ios::binary);\n'
            "  std::string d((std::istreambuf_iterator<char>(in)), {});\n"
            '  std::ofstream out("out.bin", std::ios::binary);\n'
            "  out << std::string(d.rbegin(), d.rend());\n"
            '  std::cout << VALUE << " " << d.size() << std::endl; }\n'
        ),
    }[language]
    helper = {"python": b"VALUE = 'seven'\n", "cpp": b'#define VALUE "seven"\n'}[language]
    response = run(
        RunCodeRequest(
            code=code,
            language=language,
            files={
                "in/data.bin": base64.b64encode(data).decode(),
                "helper.py" if language == "python" else "helper.h": base64.b64encode(
                    helper
                ).decode(),
            },
            fetch_files=["out.bin", "missing.txt", "in/data.bin"],
        )
    )
    assert response.status == RunStatus.Success, response
    assert response.run_result is not None
    assert response.run_result.stdout == f"seven {len(data)}\n"
    assert set(response.files) == {"out.bin", "in/data.bin"}  # the missing one left out
    assert base64.b64decode(response.files["out.bin"]) == data[::-1]
    assert base64.b64decode(response.files["in/data.bin"]) == data


def test_memory_limit(server: Server) -> None:
    """verl sends memory_limit_MB (the client's model lacks it): the sandbox's limit."""
    hog = "x = bytearray({mb} * 1024 * 1024)\nprint(len(x) // (1024 * 1024))\n"

    def post(limit: int, mb: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "code": hog.format(mb=mb),
            "language": "python",
            "memory_limit_MB": limit,
        }
        response = requests.post(f"{keyed(server)}/run_code", json=payload, timeout=120)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    over = post(64, 300)
    assert over["status"] == "Failed", over
    assert over["run_result"]["status"] == "Finished"
    assert over["run_result"]["return_code"] == 137  # OOM-killed, as on Docker
    under = post(512, 300)  # the same program fits a larger limit
    assert under["status"] == "Success", under
    assert under["run_result"]["stdout"] == "300\n"


# -- clients ------------------------------------------------------------------------------


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
            "compile_timeout": 10,
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


# -- auth, errors -------------------------------------------------------------------------


def test_auth(server: Server) -> None:
    payload = {"code": "print(1)", "language": "python"}
    no_key = requests.post(f"{server.url}/run_code", json=payload, timeout=60)
    assert no_key.status_code == 401
    assert no_key.json()["error"]["code"] == "unauthorized"
    for wrong in ("not-a-key-of-anyone-at-all", ALICE[:-1], ""):
        answer = requests.post(f"{keyed(server, wrong)}/run_code", json=payload, timeout=60)
        assert answer.status_code == 401, wrong
        bearer = requests.post(
            f"{server.url}/run_code",
            json=payload,
            headers={"Authorization": f"Bearer {wrong}"},
            timeout=60,
        )
        assert bearer.status_code == 401, wrong
    with pytest.raises(Exception, match="401"):  # the client's own error for it
        sf.run_code(RunCodeRequest(code="print(1)", language="python"), server.url, 1)
    bearer = requests.post(
        f"{server.url}/run_code",
        json=payload,
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=60,
    )
    assert bearer.status_code == 200
    assert bearer.json()["run_result"]["stdout"] == "1\n"
    basic = requests.post(f"{server.url}/run_code", json=payload, auth=("x", ALICE), timeout=60)
    assert basic.json()["run_result"]["stdout"] == "1\n"
    # The key in the URL also opens our own API (the same auth).
    info = requests.get(f"{keyed(server)}/v1/info", timeout=60)
    assert info.json()["tenant"] == "alice"


def test_requests_that_cannot_run_get_clear_errors(server: Server) -> None:
    url = f"{keyed(server)}/run_code"
    for language in ("cobol", "fortran"):
        answer = requests.post(url, json={"code": "", "language": language}, timeout=60)
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert "bash, c, c++, cpp, java, javascript, nodejs, perl, python" in message
    bodies: list[dict[str, Any]] = [
        {"language": "python"},  # no code
        {"code": "print(1)", "language": "python", "files": {"a": "%%% not base64"}},
        {"code": "print(1)", "language": "python", "run_timeout": -1},
        {"code": "print(1)", "language": "python", "files": {"../../etc/x": "eA=="}},
    ]
    for body in bodies:
        answer = requests.post(url, json=body, timeout=60)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.headers["content-type"] == "application/json"
    for path in ("/get_prompts", "/submit", "/get_prompt_by_id"):
        answer = requests.post(f"{keyed(server)}{path}", json={}, timeout=60)
        assert answer.status_code == 501, (path, answer.text)
        assert answer.json()["error"]["code"] == "not_supported"
        assert "/run_code" in answer.json()["error"]["message"]
    jupyter = f"{keyed(server)}/run_jupyter"
    jupyter_bodies: list[dict[str, Any]] = [
        {"cells": ["1"], "kernel": "ir"},
        {"cells": "1"},
        {"cells": ["1"], "total_timeout": 0},
        {"cells": ["1"], "files": {"a": "%%% not base64"}},
    ]
    for body in jupyter_bodies:
        answer = requests.post(jupyter, json=body, timeout=60)
        assert answer.status_code == 400, (body, answer.text)


# -- /run_jupyter ---------------------------------------------------------------------------


def run_jupyter(server: Server, **request: Any) -> sf.RunJupyterResponse:
    """The real client's ``run_jupyter`` (one attempt: a failure shows, not a retry)."""
    response: sf.RunJupyterResponse = sf.run_jupyter(
        sf.RunJupyterRequest(**request), keyed(server), max_attempts=1, client_timeout=120
    )
    return response


def test_run_jupyter_runs_the_cells_in_one_kernel(server: Server) -> None:
    """SandboxFusion's own example cells (its RunJupyterRequest's), then more: state
    carries over, every cell runs after one that raised, files go in and come out."""
    cells = [
        "a = 123",
        "a",
        "print(a)",
        'import sys; sys.stderr.write("stderr message")',
        'raise RuntimeError("error message")',
        "open('out.txt', 'w').write(open('in.txt').read().upper()); a + 1",
        (
            "class Rich:\n    def _repr_html_(self): return '<b>x</b>'\n"
            "    def _repr_png_(self): return b'png-bytes'\n"
            "    def __repr__(self): return 'Rich()'\n"
            "display(Rich())\nRich()"
        ),
        "x = 1;",
    ]
    response = run_jupyter(
        server,
        cells=cells,
        files={"in.txt": base64.b64encode(b"hello").decode()},
        fetch_files=["out.txt", "missing.txt"],
    )
    assert response.status == RunStatus.Success, response.message
    assert response.driver is not None
    assert response.driver.status == CommandRunStatus.Finished
    assert response.driver.return_code == 0
    assert len(response.cells) == len(cells)
    assign, show, printed, stderr, raised, files, rich, quiet = response.cells
    assert (assign.stdout, assign.stderr, assign.display, assign.error) == ("", "", [], [])
    assert show.display == [{"text/plain": "123"}]
    assert printed.stdout == "123\n"
    assert printed.display == []
    assert stderr.stderr == "stderr message"
    assert stderr.display == [{"text/plain": "14"}]  # write()'s value, as Jupyter shows it
    (error,) = raised.error
    assert error["ename"] == "RuntimeError"
    assert error["evalue"] == "error message"
    assert isinstance(error["traceback"], list)
    assert any("RuntimeError" in line for line in error["traceback"])
    assert files.display == [{"text/plain": "124"}]
    png = base64.b64encode(b"png-bytes").decode()
    expected = {
        "text/plain": "Rich()",
        "text/html": "<b>x</b>",
        "image/png": png,
    }
    assert rich.display == [expected, expected]
    assert quiet.display == []
    assert response.files == {"out.txt": base64.b64encode(b"HELLO").decode()}


def test_run_jupyter_timeouts(server: Server) -> None:
    """A cell past cell_timeout is interrupted (KeyboardInterrupt, as a notebook's
    interrupt) and the next runs; past total_timeout the run is Failed, as SandboxFusion
    answers its killed driver."""
    response = run_jupyter(
        server,
        cells=["kept = 1", "import time\ntime.sleep(60)", "kept + 1"],
        cell_timeout=1,
        total_timeout=60,
    )
    assert response.status == RunStatus.Success, response.message
    slept = response.cells[1]
    assert [e["ename"] for e in slept.error] == ["KeyboardInterrupt"]
    assert response.cells[2].display == [{"text/plain": "2"}]
    response = run_jupyter(server, cells=["1", "import time\ntime.sleep(60)"], total_timeout=2)
    assert response.status == RunStatus.Failed
    assert response.driver is not None
    assert response.driver.status == CommandRunStatus.TimeLimitExceeded
    assert response.cells == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiohttp runs on asyncio only
async def test_run_jupyter_async_client(server: Server) -> None:
    request = sf.RunJupyterRequest(cells=["import os", "os.getcwd() != ''"])
    response = await sf.run_jupyter_async(request, keyed(server), max_attempts=1)
    assert response.status == RunStatus.Success, response.message
    assert response.cells[1].display == [{"text/plain": "True"}]


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


def _wait_until_started(root: Path | None, marker: str = "started") -> str:
    """Wait until a program in a sandbox under ``root`` wrote its ``marker`` file; the
    sandbox's id. (Other sandboxes may be there: ended requests' ones, reset, ready.)"""
    assert root is not None
    eventually(lambda: any(root.glob(f"*/fs/**/{marker}")), within=30)
    return next(root.glob(f"*/fs/**/{marker}")).relative_to(root).parts[0]


def _kill_once_started(server: Server, request: Callable[[], None], marker: str) -> str:
    """Send ``request`` from a thread (its program writes ``started``, then sleeps) and,
    once the program started, SIGKILL its sandbox's processes from outside; then wait for
    the request to end. The sandbox's id."""
    thread = threading.Thread(target=request)
    thread.start()
    try:
        sandbox_id = _wait_until_started(server.root, marker)
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
    sandbox_id = _wait_until_started(server.root, marker)  # not before: then nothing runs
    assert server.root is not None
    started = next((server.root / sandbox_id).glob(f"fs/**/{marker}"))
    assert _sleepers(seconds) == 1
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


def test_quotas_apply(fusion_dir: Path) -> None:
    """A /run_code request holds one of the tenant's max_live sandboxes while it runs."""
    root = new_process_root()
    server = Server(fusion_dir / "quota", "--max-live-per-tenant", "1", root=root)
    try:
        url = f"{keyed(server)}/run_code"
        # Runs until the test lets it end (it creates ``release`` beside ``started``).
        held = "touch started; while [ ! -e release ]; do sleep 0.05; done; echo done"
        slow = {"code": held, "language": "bash"}
        answers: list[requests.Response] = []
        thread = threading.Thread(
            target=lambda: answers.append(requests.post(url, json=slow, timeout=60))
        )
        thread.start()
        try:
            _wait_until_started(root)
            refused = requests.post(url, json={"code": "echo", "language": "bash"}, timeout=60)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "quota_exceeded"
        finally:
            for started in root.glob("*/fs/**/started"):
                (started.parent / "release").touch()
            thread.join(60)
        assert answers[0].json()["run_result"]["stdout"] == "done\n"
        again = requests.post(url, json={"code": "echo again", "language": "bash"}, timeout=60)
        assert again.json()["run_result"]["stdout"] == "again\n"  # the slot came back
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
