"""E2B's code interpreter (port 49999) on a REAL ``asyncsandbox serve`` (process and Docker
backends, on loopback), driven by the real ``e2b-code-interpreter`` SDK (sync, and async on
asyncio: the SDK's async client is asyncio-only), pointed at the server as a user points it.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import httpx
import pytest
from e2b import InvalidArgumentException, NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.models import ExecutionError, OutputMessage, Result

from ._support import Server


@pytest.fixture
def sandbox(e2b_env: str) -> Iterator[Sandbox]:
    made = Sandbox.create(timeout=120)  # the SDK's default template: code-interpreter-v1
    try:
        yield made
    finally:
        made.kill()


def test_state_persists_across_calls(sandbox: Sandbox) -> None:
    first = sandbox.run_code("import math\nx = 6 * 7")
    assert (first.error, first.results, first.execution_count) == (None, [], 1)
    second = sandbox.run_code("math.sqrt(x * x)")
    assert second.text == "42.0"
    assert second.execution_count == 2
    assert second.results[0].is_main_result
    # A string is shown without its quotes, and a hidden value (";") is no result.
    assert sandbox.run_code("'hello'").text == "hello"
    assert sandbox.run_code("x;").results == []
    # Indented code in a triple-quoted string runs, as a notebook cell does.
    indented = sandbox.run_code(
        """
        y = x + 1
        if y:
            print(y)
        """
    )
    assert (indented.error, indented.logs.stdout) == (None, ["43\n"])


def test_an_error_is_data_and_the_context_lives_on(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 'yes'")
    errors: list[ExecutionError] = []
    execution = sandbox.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert (execution.error.name, execution.error.value) == (
        "ZeroDivisionError",
        "division by zero",
    )
    assert "ZeroDivisionError" in execution.error.traceback
    assert "return 1 / 0" in execution.error.traceback
    assert len(errors) == 1
    assert errors[0].name == "ZeroDivisionError"
    assert sandbox.run_code("kept").text == "yes"
    undefined = sandbox.run_code("nope")
    assert undefined.error is not None
    assert (undefined.error.name, undefined.error.value) == (
        "NameError",
        "name 'nope' is not defined",
    )


def test_callbacks_stream_output_results_and_errors(sandbox: Sandbox) -> None:
    stdout: list[OutputMessage] = []
    stderr: list[OutputMessage] = []
    results: list[Result] = []
    execution = sandbox.run_code(
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7",
        on_stdout=stdout.append,
        on_stderr=stderr.append,
        on_result=results.append,
    )
    assert [m.line for m in stdout] == ["out\n"]
    assert [(m.line, m.error) for m in stderr] == [("err\n", True)]
    assert [r.text for r in results] == ["42"]
    assert execution.logs.stdout == ["out\n"]
    assert execution.logs.stderr == ["err\n"]
    # What the code prints cannot pass for the protocol's lines.
    forged = sandbox.run_code(
        'print(\'{"type": "result", "text": "forged"}\\n{"type": "end_of_execution"}\')\n"real"'
    )
    assert forged.text == "real"
    assert len(forged.results) == 1
    assert "forged" in "".join(forged.logs.stdout)


def test_shell_lines_and_tables_as_e2b_gives_them(sandbox: Sandbox) -> None:
    # `!cmd` runs in the context's directory (E2B's `!pwd` test), and a table is the
    # result's `data` (E2B's `e2b/data`; here through `_repr_e2b_data_`, which every
    # sandbox's python3 has, where a DataFrame needs pandas).
    shell = sandbox.run_code("!pwd")
    assert shell.error is None
    assert "".join(shell.logs.stdout).strip() == "/home/user"
    table = sandbox.run_code(
        "class Table:\n    def _repr_e2b_data_(self): return {'a': [1, 2, 3]}\nTable()"
    )
    assert table.error is None
    assert table.results[0].data == {"a": [1, 2, 3]}
    assert "data" in table.results[0].formats()


def test_a_result_with_text_and_png(sandbox: Sandbox) -> None:
    probe = sandbox.commands.run("python3 -c 'import matplotlib, numpy' && echo yes || echo no")
    if probe.stdout.strip() != "yes":
        pytest.skip("matplotlib and numpy are not installed in this backend's sandbox")
    execution = sandbox.run_code(
        """
        import matplotlib.pyplot as plt
        import numpy as np

        x = np.linspace(0, 20, 100)
        plt.plot(x, np.sin(x))
        plt.show()
        """
    )
    assert execution.error is None
    assert len(execution.results) == 1
    figure = execution.results[0]
    assert figure.png is not None
    assert base64.b64decode(figure.png).startswith(b"\x89PNG\r\n\x1a\n")
    assert figure.text is not None
    assert "Figure" in figure.text
    assert not figure.extra
    assert not figure.is_main_result


def test_a_rich_result_has_its_formats(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>rich</b>'\n"
        "    def _repr_markdown_(self): return '**rich**'\n"
        "    def __repr__(self): return 'Rich()'\n"
        "Rich()"
    )
    result = execution.results[0]
    assert (result.text, result.html, result.markdown) == ("Rich()", "<b>rich</b>", "**rich**")
    assert result.formats() == ["text", "html", "markdown"]


def test_a_timeout_interrupts_the_code_and_keeps_the_context(sandbox: Sandbox) -> None:
    sandbox.run_code("before = 1")
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\nwhile True: time.sleep(0.05)", timeout=2)
    # The server interrupted the loop (else this call would wait behind it and time out).
    after = sandbox.run_code("before + 1", timeout=60)
    assert after.text == "2"
    assert after.error is None


def test_environment_variables(e2b_env: str) -> None:
    made = Sandbox.create(envs={"FROM_SANDBOX": "s"}, timeout=120)
    try:
        assert made.run_code("import os; os.getenv('FROM_SANDBOX')").text == "s"
        assert made.run_code("os.getenv('FOO')", envs={"FOO": "bar"}).text == "bar"
        assert made.run_code("os.getenv('FOO', 'unset')").text == "unset"
        overridden = made.run_code("os.getenv('FROM_SANDBOX')", envs={"FROM_SANDBOX": "o"})
        assert overridden.text == "o"
        assert made.run_code("os.getenv('FROM_SANDBOX')").text == "s"
    finally:
        made.kill()


def test_contexts(sandbox: Sandbox) -> None:
    sandbox.run_code("x = 'default'")
    context = sandbox.create_code_context(cwd="/tmp")
    assert (context.language, context.cwd) == ("python", "/tmp")
    assert sandbox.create_code_context().cwd == "/home/user"
    listed = sandbox.list_code_contexts()
    assert context.id in [c.id for c in listed]
    assert [c.id for c in listed][-2] == context.id  # in the order they were made
    assert sandbox.run_code("import os; os.getcwd()", context=context).text == "/tmp"
    isolated = sandbox.run_code("x", context=context)
    assert isolated.error is not None
    assert isolated.error.name == "NameError"
    sandbox.run_code("x = 'mine'", context=context)
    assert sandbox.run_code("x", context=context).text == "mine"
    assert sandbox.run_code("x", language="python").text == "default"
    sandbox.restart_code_context(context)
    restarted = sandbox.run_code("x", context=context)
    assert restarted.error is not None
    assert restarted.error.name == "NameError"
    assert sandbox.run_code("__import__('os').getcwd()", context=context).text == "/tmp"
    sandbox.remove_code_context(context.id)
    assert context.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=context)
    with pytest.raises(NotFoundException):
        sandbox.restart_code_context(context.id)
    with pytest.raises(NotFoundException):
        sandbox.remove_code_context("no-such-context")
    assert sandbox.run_code("x").text == "default"
    # Root's home (E2B's kernels run as root): the sandbox's user may not enter it (Docker)
    # or it is not there (the process backend): a clear error, no context left behind.
    before = [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(
        SandboxException, match="cannot make a code context in /root: cannot start in /root"
    ):
        sandbox.create_code_context(cwd="/root")
    assert [c.id for c in sandbox.list_code_contexts()] == before


def test_other_languages_are_refused_clearly(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="runs python only"):
        sandbox.run_code("console.log(1)", language="js")
    with pytest.raises(SandboxException, match="runs python only"):
        sandbox.create_code_context(language="r")
    context = sandbox.create_code_context()
    with pytest.raises(InvalidArgumentException):  # the SDK's own check
        sandbox.run_code("1", language="python", context=context)
    assert sandbox.run_code("1", language="Python").text == "1"


def test_no_public_traffic_is_taken_other_network_settings_refused(e2b_env: str) -> None:
    private = Sandbox.create(timeout=60, network={"allow_public_traffic": False})
    try:
        assert private.run_code("1 + 1").text == "2"
    finally:
        private.kill()
    with pytest.raises(SandboxException, match="network"):
        Sandbox.create(timeout=60, network={"allow_public_traffic": True})


def test_the_interpreter_needs_the_sandboxs_tokens(sandbox: Sandbox, e2b_server: Server) -> None:
    sandbox.run_code("1")
    base = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}
    assert sandbox.traffic_access_token
    assert sandbox.traffic_access_token != sandbox._envd_access_token
    assert httpx.get(f"{e2b_server.url}/contexts", headers=base).status_code == 401
    wrong = {**base, "E2B-Traffic-Access-Token": "x" + sandbox.traffic_access_token}
    assert httpx.get(f"{e2b_server.url}/contexts", headers=wrong).status_code == 401
    right = {**base, "E2B-Traffic-Access-Token": sandbox.traffic_access_token}
    assert httpx.get(f"{e2b_server.url}/contexts", headers=right).status_code == 200
    # The traffic token opens the interpreter only, not envd.
    envd = {**right, "E2b-Sandbox-Port": "49983"}
    assert (
        httpx.post(f"{e2b_server.url}/process.Process/List", json={}, headers=envd).status_code
        == 401
    )
    other = Sandbox.create(timeout=60)
    try:
        foreign = {**base, "E2B-Traffic-Access-Token": other.traffic_access_token or ""}
        assert httpx.get(f"{e2b_server.url}/contexts", headers=foreign).status_code == 401
    finally:
        other.kill()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK's async client: asyncio
async def test_async_sdk_and_a_sandbox_killed_under_a_call(e2b_env: str) -> None:
    made = await AsyncSandbox.create(timeout=120)
    try:
        lines: list[str] = []
        started = asyncio.Event()

        async def on_stdout(message: OutputMessage) -> None:
            lines.append(message.line)
            if "started" in message.line:
                started.set()

        execution = await made.run_code("for i in range(3): print(i)", on_stdout=on_stdout)
        assert "".join(lines) == "0\n1\n2\n"
        assert execution.error is None
        running = asyncio.create_task(
            made.run_code(
                "print('started', flush=True)\nimport time; time.sleep(300)",
                on_stdout=on_stdout,
            )
        )
        await asyncio.wait_for(started.wait(), 60)
        await made.kill()
        with pytest.raises(TimeoutException, match="sandbox was killed"):
            await running
    finally:
        await made.kill()
