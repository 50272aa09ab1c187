"""SandboxFusion's ``/run_code`` in each language, on a REAL ``asyncsandbox serve``
(tests/_fusion_support.py), driven by the real ``sandbox_fusion`` client: a passing and a
failing program answer as the same program run directly through our own API (Session +
``sandbox.exec``); a run past its timeout, a compile that fails and one past its timeout
get SandboxFusion's statuses; C goes as C++.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import anyio
import anyio.to_thread
import pytest
import sandbox_fusion as sf
from sandbox_fusion import CommandRunStatus, RunCodeRequest, RunStatus

from asyncsandbox import ExecTimeout, Session

from . import _fusion_support as fusion
from ._fusion_support import COMPILE, FAIL, FOREVER, OK, run
from ._support import until_printed

# The fusion family's fixtures (tests/_fusion_support.py), this module's by name.
anyio_backend = fusion.anyio_backend
fusion_dir = fusion.fusion_dir
server = fusion.server
endpoint = fusion.endpoint


# -- the programs, run directly -----------------------------------------------------------


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
    # The program prints a line, then waits: what is checked is the output until the kill.
    for run_timeout in until_printed(2):
        response = run(
            RunCodeRequest(
                code=FOREVER[language],
                language=language,
                run_timeout=run_timeout,
                compile_timeout=COMPILE,
            )
        )
        if response.run_result is None or response.run_result.stdout:
            break
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
        for timeout in until_printed(2):
            with pytest.raises(ExecTimeout) as info:
                await sandbox.exec(["python3", "main.py"], timeout=timeout)
            if info.value.result.stdout:
                break
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
