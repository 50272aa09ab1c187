"""The code interpreter (``Sandbox.run_code``) on real backends: the process backend,
Docker, and the remote backend through a real server (its runs are in the slow suite: the
interpreter is the process backend's behind it, and the wire's own run_code tests,
streaming and interrupts, are in test_remote.py).

Every semantic of the interpreter is here, each on every backend: state, the main result,
each rich format, matplotlib figures, errors, contexts, timeouts, interrupt-ignoring code,
dying interpreters, output floods, late background output, many contexts at once,
recycling, and hostile code going for the runner's protocol.
"""

from __future__ import annotations

import functools
import os
import shutil
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from asyncsandbox_remote import RemoteBackend

from asyncsandbox import (
    CodeContext,
    ExecTimeout,
    Execution,
    ExecutionError,
    InvalidArgument,
    OutputMessage,
    Resources,
    Result,
    Sandbox,
    SandboxDefaults,
    Session,
    WarmPool,
)
from asyncsandbox.abc import Backend
from asyncsandbox.testing import FakeBackend

from ._support import (
    ALICE,
    Server,
    docker_test_image,
    eventually_async,
    new_process_root,
    pool_ready,
    processes_gone,
    processes_with,
    require_docker,
)

IS_ROOT = os.geteuid() == 0
ROOTFS = os.environ.get("ASYNCSANDBOX_TEST_ROOTFS")


class Target:
    """Where a test's sandboxes run: a backend, made anew for each session."""

    def __init__(self, kind: str, make: Callable[..., Backend]) -> None:
        self.kind = kind
        self.make = make


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real server (``asyncsandbox serve``, the process backend) on loopback."""
    root = new_process_root()
    server = Server(tmp_path_factory.mktemp("interpreter-remote"), root=root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["process", "docker", pytest.param("remote", marks=pytest.mark.slow)])
def target(request: pytest.FixtureRequest, anyio_backend: str, process_root: Path) -> Target:
    """The backend a test runs on (Docker: on asyncio only, as the backend says)."""
    kind = str(request.param)
    if kind == "docker":
        if anyio_backend != "asyncio":
            pytest.skip("the Docker backend runs on asyncio only")
        require_docker()
        from asyncsandbox_docker import DockerBackend

        return Target(kind, functools.partial(DockerBackend, default_image=docker_test_image()))
    if kind == "remote":
        if anyio_backend != "asyncio":
            # The interpreter's logic runs on both loops on the process backend, and the
            # remote client on both loops in tests/test_remote.py's conformance: its trio
            # run here would repeat both.
            pytest.skip("the remote backend's interpreter: asyncio (see the comment)")
        server: Server = request.getfixturevalue("remote_server")
        return Target(kind, lambda **options: RemoteBackend(server.url, ALICE, **options))
    from asyncsandbox._process import ProcessBackend

    return Target(kind, functools.partial(ProcessBackend, root=process_root))


def session(
    target: Target, *, backend_options: dict[str, Any] | None = None, **kwargs: Any
) -> Session:
    defaults = kwargs.pop("defaults", None) or SandboxDefaults(tags=("test-interpreter",))
    return Session(target.make(**(backend_options or {})), defaults=defaults, sweep=False, **kwargs)


@asynccontextmanager
async def sandbox(target: Target, **overrides: Any) -> AsyncIterator[Sandbox]:
    async with session(target) as s, s.sandbox(**overrides) as sb:
        yield sb


def marker() -> str:
    """A unique number to mark the processes of one test (``sleep MARKER``)."""
    return f"{int(uuid.uuid4().int % 10**8) + 10**8}.5"


def stdout(execution: Execution) -> str:
    return "".join(execution.logs.stdout)


def stderr(execution: Execution) -> str:
    return "".join(execution.logs.stderr)


# -- state and results ----------------------------------------------------------------------


async def test_state_persists_and_the_last_expression_is_the_main_result(target: Target) -> None:
    async with sandbox(target) as sb:
        first = await sb.run_code("import math\nx = 6 * 7\nprint('set')")
        assert first.error is None
        assert first.results == []  # the last statement is no expression
        assert stdout(first) == "set\n"
        second = await sb.run_code("y = x + 1\nmath.sqrt(x * y - 6)")
        assert second.text == repr((42 * 43 - 6) ** 0.5)
        assert [r.is_main_result for r in second.results] == [True]
        assert (first.execution_count, second.execution_count) == (1, 2)
        quiet = await sb.run_code("x + 1;  # hidden, as in a notebook")
        assert quiet.results == []
        assert quiet.text is None
        none = await sb.run_code("None")
        assert none.results == []
        assert (await sb.run_code("_")).text == repr((42 * 43 - 6) ** 0.5)  # the last value shown
        assert (await sb.run_code("'text'")).text == "'text'"


async def test_rich_formats_become_result_fields(target: Target) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    code = textwrap.dedent(
        f"""
        class Rich:
            def _repr_html_(self): return "<b>bold</b>"
            def _repr_markdown_(self): return "**bold**"
            def _repr_svg_(self): return "<svg></svg>"
            def _repr_png_(self): return {png!r}
            def _repr_jpeg_(self): return b"\\xff\\xd8jpeg"
            def _repr_json_(self): return {{"a": [1, 2]}}
            def _repr_latex_(self): return "$x^2$"
            def __repr__(self): return "Rich()"

        class Bundle:
            def _repr_mimebundle_(self, include=None, exclude=None):
                return {{"text/plain": "bundled", "application/x-custom": "custom"}}

        display("shown first")
        display(Bundle())
        Rich()
        """
    )
    async with sandbox(target) as sb:
        execution = await sb.run_code(code)
        assert execution.error is None, execution.error
        shown, bundle, main = execution.results
        assert shown == Result(text="'shown first'")
        assert bundle.text == "bundled"
        assert bundle.extra == {"application/x-custom": "custom"}
        assert not bundle.is_main_result
        assert main.is_main_result
        assert main.text == "Rich()"
        assert main.html == "<b>bold</b>"
        assert main.markdown == "**bold**"
        assert main.svg == "<svg></svg>"
        assert main.png == png
        assert main.jpeg == b"\xff\xd8jpeg"
        assert main.json == {"a": [1, 2]}
        assert main.latex == "$x^2$"
        assert set(main.formats()) == {
            "text",
            "html",
            "markdown",
            "svg",
            "png",
            "jpeg",
            "json",
            "latex",
        }


async def test_matplotlib_figures_come_back_as_png(target: Target) -> None:
    # The process backend's sandboxes see this machine's python3, unless given a root
    # filesystem (CI's has matplotlib, as the Docker test image does).
    overrides = {"image": ROOTFS} if target.kind in ("process", "remote") and ROOTFS else {}
    async with sandbox(target, **overrides) as sb:
        # (pyplot builds its font cache on first import, saying so on stderr: not here)
        probe = await sb.run_code("import matplotlib.pyplot")
        if probe.error is not None:
            pytest.skip(
                f"no matplotlib in the {target.kind} sandbox's python3: {probe.error.value}"
            )
        code = textwrap.dedent(
            """
            import matplotlib.pyplot as plt
            plt.plot([1, 2, 3], [1, 4, 9])
            plt.show()
            print("between")
            fig, ax = plt.subplots()
            ax.bar(["a", "b"], [3, 5]);
            """
        )
        async with sb.run_code_stream(code) as stream:
            events = [event async for event in stream]
            execution = await stream.wait()
        assert execution.error is None, execution.error
        # plt.show() shows the figure then, before what is printed after it (and without
        # Agg's "cannot be shown" warning); the figure left open comes at the end.
        assert [type(e) for e in events] == [Result, OutputMessage, Result]
        assert stdout(execution) == "between\n"
        assert stderr(execution) == ""
        shown, left_open = execution.results
        for result in (shown, left_open):
            assert result.png is not None
            assert result.png.startswith(b"\x89PNG\r\n\x1a\n")
            assert result.text is not None
            assert result.text.startswith("<Figure")
            assert not result.is_main_result
        # Shown and closed: nothing is shown twice.
        assert (await sb.run_code("plt.get_fignums()")).text == "[]"


async def test_shell_lines_run_as_in_a_notebook(target: Target) -> None:
    # IPython's `!cmd` lines: a shell command in the context's directory, its output
    # (stdout and stderr, merged as IPython's) as the cell's; `{expr}` and `$name`
    # expanded from the code's namespace; `x = !cmd` gives its lines; `_exit_code`.
    code = textwrap.dedent(
        """
        name = "world"
        !echo hello {name.upper()} $name; pwd; echo to-stderr >&2
        for i in range(2):
            !echo "loop $i"
        lines = !printf 'a\\nb\\n'
        lines
        """
    )
    async with sandbox(target) as sb:
        ran = await sb.run_code(code)
        assert ran.error is None, ran.error
        assert stdout(ran) == (
            f"hello WORLD world\n{sb.config.workdir}\nto-stderr\nloop 0\nloop 1\n"
        )
        assert ran.text == "['a', 'b']"
        failed = await sb.run_code("!exit 3\n_exit_code")
        assert failed.text == "3"
        # Python that parses stays Python: a `!` line inside a string is text.
        text = await sb.run_code('x = """\n!echo no\n"""\nx')
        assert text.text == repr("\n!echo no\n")
        assert stdout(text) == ""
        # What is neither Python nor a shell line is the cell's own syntax error.
        broken = await sb.run_code("!echo fine\ndef f(:")
        assert broken.error is not None
        assert broken.error.name == "SyntaxError"
        assert stdout(broken) == ""
        # A shell line that times out is interrupted, its command tree killed.
        mark = marker()
        with pytest.raises(ExecTimeout) as raised:
            await sb.run_code(f"!sleep {mark} & sleep {mark}", timeout=2)
        execution = raised.value.execution
        assert execution is not None
        assert execution.error is not None
        assert execution.error.name == "KeyboardInterrupt"
        assert not execution.restarted
        await eventually_async(
            lambda: not processes_with(mark), within=30, what="the command's tree is killed"
        )
        assert (await sb.run_code("name")).text == "'world'"


async def test_pil_images_and_dataframes_become_results(target: Target) -> None:
    # As E2B's code interpreter shows them: a PIL image shown (`show()`) or saved to a
    # file name is a PNG result; a pandas DataFrame's columns are its `e2b/data` (and any
    # object's `_repr_e2b_data_`).
    overrides = {"image": ROOTFS} if target.kind in ("process", "remote") and ROOTFS else {}
    async with sandbox(target, **overrides) as sb:
        own = await sb.run_code(
            "class Table:\n"
            "    def _repr_e2b_data_(self): return {'a': [1, 2]}\n"
            "    def __repr__(self): return 'Table()'\n"
            "Table()"
        )
        assert own.error is None, own.error
        assert own.results[0].extra == {"e2b/data": {"a": [1, 2]}}
        probe = await sb.run_code("import PIL.Image")
        if probe.error is not None:
            pytest.skip(f"no PIL in the {target.kind} sandbox's python3: {probe.error.value}")
        code = textwrap.dedent(
            """
            from PIL import Image
            image = Image.new("RGB", (4, 4), "red")
            image.show()
            print("shown")
            image.save("red.png")
            import os
            os.path.getsize("red.png") > 0
            """
        )
        execution = await sb.run_code(code)
        assert execution.error is None, execution.error
        shown, saved, main = execution.results
        for result in (shown, saved):
            assert result.png is not None
            assert result.png.startswith(b"\x89PNG\r\n\x1a\n")
            assert not result.is_main_result
        assert main.text == "True"
        assert stdout(execution) == "shown\n"
        probe = await sb.run_code("import pandas")
        if probe.error is not None:
            pytest.skip(f"no pandas in the {target.kind} sandbox's python3: {probe.error.value}")
        frame = await sb.run_code(
            "import pandas as pd\n"
            "pd.DataFrame({'a': [1, 2, None], 'when': pd.to_datetime(['2024-01-02'] * 3)})"
        )
        assert frame.error is None, frame.error
        data = frame.results[0].extra["e2b/data"]
        assert data["a"] == [1.0, 2.0, None]
        assert data["when"][0].startswith("2024-01-02T00:00:00")


async def test_figures_carry_their_chart_data(target: Target) -> None:
    # E2B's chart format (`e2b/chart`, the SDK's `result.chart`), read from what matplotlib
    # drew: the kind of chart, its labels, units, ticks, scale and data.
    overrides = {"image": ROOTFS} if target.kind in ("process", "remote") and ROOTFS else {}
    async with sandbox(target, **overrides) as sb:
        probe = await sb.run_code("import matplotlib.pyplot as plt")
        if probe.error is not None:
            pytest.skip(f"no matplotlib in the {target.kind} sandbox: {probe.error.value}")
        code = textwrap.dedent(
            """
            import datetime
            days = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(3)]
            plt.plot(days, [1.0, 4.0, 9.0], label="squares")
            plt.plot(days, [2.0, 2.5, 3.0])
            plt.xlabel("Day"); plt.ylabel("Load [kW]"); plt.title("Load")
            plt.show()
            plt.bar(["a", "b", "c"], [3, 5, 4], label="counts")
            plt.xlabel("Letter (-)")
            plt.show()
            plt.pie([3, 1], labels=["big", "small"])
            plt.show()
            plt.boxplot([[1, 2, 3, 4, 5, 30], [2, 3, 4]], labels=["one", "two"], patch_artist=True)
            plt.show()
            fig, (left, right) = plt.subplots(1, 2)
            fig.suptitle("Two")
            left.scatter([1, 2], [3, 4], label="dots")
            right.add_artist(plt.Circle((0, 0), 1))
            right.set_title("Circle")
            plt.show()
            plt.figure()
            plt.show()
            """
        )
        execution = await sb.run_code(code)
        assert execution.error is None, execution.error
        charts: list[Any] = [result.extra.get("e2b/chart") for result in execution.results]
        line, bar, pie, box, super_chart, blank = charts
        assert blank is None  # a figure with nothing drawn: no chart
        assert line["type"] == "line"
        assert (line["title"], line["x_label"], line["y_label"]) == ("Load", "Day", "Load [kW]")
        assert (line["x_unit"], line["y_unit"]) == (None, "kW")
        assert (line["x_scale"], line["y_scale"]) == ("datetime", "linear")
        assert line["x_ticks"][0].startswith("2024-01-01")
        assert [e["label"] for e in line["elements"]] == ["squares", "Line 1"]
        assert line["elements"][0]["points"] == [
            ["2024-01-01", 1.0],
            ["2024-01-02", 4.0],
            ["2024-01-03", 9.0],
        ]
        assert bar["type"] == "bar"
        assert bar["x_unit"] == "-"
        assert bar["elements"] == [
            {"label": "a", "group": "counts", "value": 3.0},
            {"label": "b", "group": "counts", "value": 5.0},
            {"label": "c", "group": "counts", "value": 4.0},
        ]
        assert pie["type"] == "pie"
        assert pie["elements"] == [
            {"label": "big", "angle": 270.0, "radius": 1.0},
            {"label": "small", "angle": 90.0, "radius": 1.0},
        ]
        assert box["type"] == "box_and_whisker"
        first, second = box["elements"]
        assert first == {
            "label": "one",
            "min": 1.0,
            "first_quartile": 2.25,
            "median": 3.5,
            "third_quartile": 4.75,
            "max": 5.0,
            "outliers": [30.0],
        }
        assert (second["label"], second["median"], second["outliers"]) == ("two", 3.0, [])
        assert super_chart["type"] == "superchart"
        assert super_chart["title"] == "Two"
        scatter, unknown = super_chart["elements"]
        assert scatter["type"] == "scatter"
        assert scatter["elements"] == [{"label": "dots", "points": [[1.0, 3.0], [2.0, 4.0]]}]
        assert unknown == {"type": "unknown", "title": "Circle", "elements": []}
        # A chart past 1 MiB of JSON is left out: the image still comes.
        big = await sb.run_code("plt.plot(range(100_000)); plt.show()")
        (figure,) = big.results
        assert figure.png is not None
        assert "e2b/chart" not in figure.extra


async def test_exceptions_are_data_and_the_state_stays(target: Target) -> None:
    async with sandbox(target) as sb:
        failed = await sb.run_code("a = 1\nprint('before')\nb = a / 0\nc = 3")
        assert failed.error is not None
        assert failed.error.name == "ZeroDivisionError"
        assert failed.error.value == "division by zero"
        assert "b = a / 0" in failed.error.traceback  # the cell's own line
        assert "_runner" not in failed.error.traceback
        assert "<string>" not in failed.error.traceback
        assert stdout(failed) == "before\n"
        broken = await sb.run_code("def f(:\n    pass")
        assert broken.error is not None
        assert broken.error.name == "SyntaxError"
        assert "def f(:" in broken.error.traceback
        after = await sb.run_code("[a, 'b' in globals(), 'c' in globals()]")
        assert after.error is None
        assert after.text == "[1, False, False]"
        exited = await sb.run_code("import sys; sys.exit(4)")
        assert exited.error is not None
        assert exited.error.name == "SystemExit"
        assert (await sb.run_code("a")).text == "1"  # exit() ends a cell, not the context


async def test_env_applies_to_one_call(target: Target) -> None:
    async with sandbox(target, env={"KEPT": "sandbox"}) as sb:
        code = "import os; (os.environ.get('ONLY_NOW'), os.environ.get('KEPT'))"
        now = await sb.run_code(code, env={"ONLY_NOW": "yes", "KEPT": "call"})
        assert now.text == "('yes', 'call')"
        assert (await sb.run_code(code)).text == "(None, 'sandbox')"
        assert (await sb.run_code("os.environ['MPLBACKEND']")).text == "'Agg'"


# -- contexts -------------------------------------------------------------------------------


async def test_contexts_are_isolated_and_keep_their_directory(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("shared = 'default'")
        other = await sb.create_code_context(cwd="/tmp")
        assert other == CodeContext(id=other.id, language="python", cwd="/tmp")
        assert (await sb.run_code("'shared' in globals()", context=other)).text == "False"
        await sb.run_code("shared = 'other'", context=other.id)
        assert (await sb.run_code("shared")).text == "'default'"
        assert (await sb.run_code("import os; os.getcwd()", context=other)).text == "'/tmp'"
        assert (await sb.run_code("import os; os.getcwd()")).text == repr(sb.config.workdir)
        ids = {c.id for c in await sb.list_code_contexts()}
        assert ids == {"default", other.id}
        await sb.remove_code_context(other)
        assert {c.id for c in await sb.list_code_contexts()} == {"default"}
        with pytest.raises(InvalidArgument, match="no code context"):
            await sb.run_code("1", context=other)
        with pytest.raises(InvalidArgument, match="context or a language"):
            await sb.run_code("1", context="default", language="python")
        with pytest.raises(InvalidArgument, match="python"):
            await sb.run_code("1", language="javascript")
        with pytest.raises(InvalidArgument):
            await sb.create_code_context(cwd="/no/such/directory")
        await sb.restart_code_context("default")
        assert (await sb.run_code("'shared' in globals()")).text == "False"


async def test_a_relative_directory_is_under_the_workdir(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.exec(["mkdir", "-p", "made"])
        context = await sb.create_code_context(cwd="made")
        assert (await sb.run_code("import os; os.getcwd()", context=context)).text == repr(
            f"{sb.config.workdir}/made"
        )


# -- timeouts, interrupts, deaths -----------------------------------------------------------


async def test_a_timeout_interrupts_and_the_state_stays(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("kept = 'yes'")
        with pytest.raises(ExecTimeout) as raised:
            await sb.run_code(
                "import time\nprint('started', flush=True)\ntime.sleep(600)", timeout=1
            )
        execution = raised.value.execution
        assert execution is not None
        assert execution.timed_out
        assert not execution.restarted
        assert execution.error is not None
        assert execution.error.name == "KeyboardInterrupt"
        assert "time.sleep(600)" in execution.error.traceback
        assert stdout(execution) == "started\n"
        assert raised.value.result.returncode == 130
        assert raised.value.result.timed_out
        assert raised.value.result.stdout == b"started\n"
        after = await sb.run_code("kept")
        assert after.text == "'yes'"
        assert not after.restarted


async def test_code_that_ignores_the_interrupt_is_killed_with_all_it_started(
    target: Target,
) -> None:
    mark = marker()
    code = textwrap.dedent(
        f"""
        import signal, subprocess, os, time
        subprocess.Popen(["sleep", "{mark}"], start_new_session=True)  # a daemon of its own
        if os.fork() == 0:  # and an orphan, double-forked
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{mark}"])
            os._exit(0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("ignoring", flush=True)
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                pass
        """
    )
    async with sandbox(target) as sb:
        await sb.run_code("lost = 1")
        started = anyio.current_time()
        with pytest.raises(ExecTimeout) as raised:
            await sb.run_code(code, timeout=2)
        execution = raised.value.execution
        assert execution is not None
        assert execution.restarted
        assert execution.timed_out
        assert execution.error is not None
        assert execution.error.name == "InterpreterRestarted"
        assert raised.value.result.returncode == 137
        assert stdout(execution) == "ignoring\n"
        assert anyio.current_time() - started < 60  # the grace, not forever
        await eventually_async(
            lambda: not processes_with(mark), within=30, what="the leftovers are killed"
        )
        fresh = await sb.run_code("'lost' in globals()")
        assert fresh.text == "False"
        assert fresh.execution_count == 1
        assert {c.id for c in await sb.list_code_contexts()} == {"default"}


@pytest.mark.parametrize(
    ("code", "how"),
    [
        ("import os; os._exit(3)", "exited with status 3"),
        ("import ctypes; ctypes.string_at(0)", "killed by SIGSEGV"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ],
    ids=["exit", "segfault", "sigkill"],
)
async def test_a_dying_interpreter_is_reported_and_replaced(
    target: Target, code: str, how: str
) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("before = 1")
        other = await sb.create_code_context()
        await sb.run_code("untouched = 1", context=other)
        died = await sb.run_code(f"print('last words', flush=True)\n{code}")
        assert died.error is not None
        assert died.error.name == "InterpreterDied"
        assert how in died.error.value
        assert died.restarted
        assert stdout(died) == "last words\n"
        fresh = await sb.run_code("'before' in globals()")
        assert fresh.error is None
        assert fresh.text == "False"
        assert not fresh.restarted  # reported once, by the call it died in
        # The other context has nothing to do with it.
        survived = await sb.run_code("untouched", context=other)
        assert survived.text == "1"
        assert not survived.restarted


async def test_an_interpreter_killed_for_memory_is_reported(target: Target) -> None:
    if target.kind == "process" and not IS_ROOT:
        pytest.skip("the process backend enforces memory limits as root (cgroups)")
    async with sandbox(target, resources=Resources(memory_mb=256)) as sb:
        await sb.run_code("before = 1")
        hog = await sb.run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))")
        assert hog.error is not None
        if hog.error.name == "MemoryError":  # the allocation failed before the killer came
            pytest.skip("the sandbox refused the memory instead of killing for it")
        assert hog.error.name == "InterpreterDied", hog.error
        assert "SIGKILL" in hog.error.value
        assert (await sb.run_code("'before' in globals()")).text == "False"


def blocked_writing(name: str) -> bool:
    """Whether the host thread named ``name`` (its ``comm``) waits to write to a full pipe:
    the kernel's events pipe, when the host reads no more of its output."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                if (task / "comm").read_text().strip() == name:
                    return "pipe_write" in (task / "wchan").read_text()
        except OSError:
            continue
    return False


FLOOD_IN_MAIN = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)  # PR_SET_NAME: for the host to find
print("x" * (64 << 20))
time.sleep(600)
"""
FLOOD_IN_A_THREAD = """
import ctypes, threading, time
def flood():
    ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)
    print("x" * (64 << 20))
threading.Thread(target=flood, daemon=True).start()
time.sleep(600)
"""


async def test_cancelling_a_call_interrupts_it_and_the_state_stays(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("kept = 2")
        printed = anyio.Event()

        async def on_stdout(message: OutputMessage) -> None:
            printed.set()

        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sb.run_code(
                    "import time\nprint('running', flush=True)\ntime.sleep(600)",
                    on_stdout=on_stdout,
                )

            tg.start_soon(run)
            await printed.wait()
            tg.cancel_scope.cancel()
        after = await sb.run_code("kept")
        assert after.error is None, after.error
        assert after.text == "2"
        assert not after.restarted


@pytest.mark.parametrize("flood", [FLOOD_IN_MAIN, FLOOD_IN_A_THREAD], ids=["main", "thread"])
async def test_an_interrupt_while_the_code_is_blocked_writing_takes_effect(
    target: Target, flood: str, anyio_backend: str
) -> None:
    """The interrupt comes while a thread of the code is inside the runner, writing its
    output (where an interrupt must wait: half a frame would break the channel), blocked
    there because nobody reads the output: it takes effect once the write is whole (the
    main thread's), or at once (another thread's write is none of the main thread's
    business); the context keeps its state. (The race that made the test above flaky,
    made certain.)"""
    if target.kind == "remote" and anyio_backend == "trio":
        pytest.skip(
            "the remote client leaves httpcore's body generators to the garbage collector "
            "when a call is cancelled mid-body (trio warns of each): not the interpreter's"
        )
    name = f"k{uuid.uuid4().hex[:12]}"
    async with sandbox(target) as sb:
        await sb.run_code("kept = 2")
        printed = anyio.Event()

        async def on_stdout(message: OutputMessage) -> None:
            printed.set()
            await anyio.Event().wait()  # read no more: the code blocks on its output

        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sb.run_code(flood.format(name=name), on_stdout=on_stdout)

            tg.start_soon(run)
            await printed.wait()
            await eventually_async(
                lambda: blocked_writing(name), within=30, what="the code blocks writing"
            )
            tg.cancel_scope.cancel()
        after = await sb.run_code("kept")
        assert after.error is None, after.error
        assert after.text == "2"
        assert not after.restarted


async def test_a_context_lost_under_a_cancelled_call_is_reported_by_the_next(
    target: Target,
) -> None:
    """Cancelled, the call never returns the execution that says its interpreter was
    restarted (the code ignored the interrupt): the next call of the context says so."""
    code = textwrap.dedent(
        """
        import signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("ignoring", flush=True)
        time.sleep(600)
        """
    )
    async with sandbox(target) as sb:
        await sb.run_code("lost = 1")
        other = await sb.create_code_context()
        await sb.run_code("untouched = 1", context=other)
        printed = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sb.run_code(code, on_stdout=lambda _: printed.set())

            tg.start_soon(run)
            await printed.wait()
            tg.cancel_scope.cancel()
        fresh = await sb.run_code("'lost' in globals()")
        assert fresh.text == "False"
        assert fresh.restarted
        assert fresh.execution_count == 1
        again = await sb.run_code("1")
        assert not again.restarted  # said once
        survived = await sb.run_code("untouched", context=other)
        assert survived.text == "1"
        assert not survived.restarted


async def test_restarting_a_context_ends_its_running_call(target: Target) -> None:
    async with sandbox(target) as sb:
        printed = anyio.Event()
        ended: list[Execution] = []

        async with anyio.create_task_group() as tg:

            async def run() -> None:
                ended.append(
                    await sb.run_code(
                        "import time\nprint('running', flush=True)\ntime.sleep(600)",
                        on_stdout=lambda _: printed.set(),
                    )
                )

            tg.start_soon(run)
            await printed.wait()
            await sb.restart_code_context("default")
        (execution,) = ended
        assert execution.restarted
        assert execution.error is not None
        assert execution.error.name == "InterpreterRestarted"


# -- output ---------------------------------------------------------------------------------


async def test_an_output_flood_is_bounded(target: Target) -> None:
    code = textwrap.dedent(
        """
        import sys
        print("HEAD")
        line = "x" * 1023 + "\\n"
        for _ in range(50 * 1024):  # 50 MiB
            sys.stdout.write(line)
        print("TAIL")
        """
    )
    async with sandbox(target) as sb:
        execution = await sb.run_code(code, max_output_bytes=64 * 1024, timeout=300)
        assert execution.error is None
        text = stdout(execution)
        assert execution.logs.stdout_truncated
        assert execution.truncated
        assert text.startswith("HEAD\n")
        assert text.endswith("TAIL\n")
        assert len(text) <= 64 * 1024
        assert (await sb.run_code("1 + 1")).text == "2"


async def test_output_streams_as_it_comes(target: Target) -> None:
    """on_stdout sees output while the code still runs: the code waits for a file that
    the callback writes once it saw the first line."""
    code = textwrap.dedent(
        """
        import os, time
        print("waiting", flush=True)
        while not os.path.exists("go"):
            time.sleep(0.02)
        print("went")
        42
        """
    )
    async with sandbox(target) as sb:
        seen: list[str] = []

        async def on_stdout(message: OutputMessage) -> None:
            seen.append(message.line)
            if message.line == "waiting\n":
                await sb.write_file("go", "")

        results: list[Result] = []
        execution = await sb.run_code(
            code, on_stdout=on_stdout, on_result=results.append, timeout=60
        )
        assert seen == ["waiting\n", "went\n"]
        assert results == execution.results
        assert execution.text == "42"
        async with sb.run_code_stream("print('a'); display(1); 1/0") as stream:
            events = [event async for event in stream]
            final = await stream.wait()
        assert [type(e) for e in events] == [OutputMessage, Result, ExecutionError]
        assert final.error == events[-1]


async def test_late_background_output_never_lands_in_the_next_call(target: Target) -> None:
    code = textwrap.dedent(
        """
        import threading, time, sys
        go = threading.Event()
        def chatter():
            go.wait()
            while True:
                print("late", flush=True)
                sys.stderr.write("late\\n")
                display("late result")
                time.sleep(0.001)
        threading.Thread(target=chatter, daemon=True).start()
        print("own")
        """
    )
    async with sandbox(target) as sb:
        first = await sb.run_code(code)
        assert stdout(first) == "own\n"
        await sb.run_code("go.set()")
        # The thread chatters from now on, between calls and during the next ones.
        for _ in range(3):
            later = await sb.run_code(
                "import time\nfor _ in range(20):\n    print('mine')\n    time.sleep(0.005)\n7"
            )
            assert stdout(later) == "mine\n" * 20
            assert stderr(later) == ""
            assert [r.text for r in later.results] == ["7"]
        # A thread started in this call is this call's.
        own = await sb.run_code(
            "t = threading.Thread(target=print, args=('from a thread',)); t.start(); t.join()"
        )
        assert stdout(own) == "from a thread\n"


# -- many at once -------------------------------------------------------------------------


@pytest.mark.slow  # load: 8 sandboxes at once per backend
async def test_32_contexts_over_8_sandboxes_at_once(target: Target) -> None:
    async with session(target) as s:
        sandboxes = [s.sandbox() for _ in range(8)]
        results: dict[tuple[int, int], str | None] = {}
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(sb.start)
        try:

            async def work(i: int, sb: Sandbox) -> None:
                contexts = [None, *[await sb.create_code_context() for _ in range(3)]]

                async def one(j: int, context: CodeContext | None) -> None:
                    await sb.run_code(
                        f"value = {i * 10 + j}\nimport time; time.sleep(0.2)", context=context
                    )
                    results[i, j] = (await sb.run_code("value", context=context)).text

                async with anyio.create_task_group() as inner:
                    for j, context in enumerate(contexts):
                        inner.start_soon(one, j, context)

            async with anyio.create_task_group() as tg:
                for i, sb in enumerate(sandboxes):
                    tg.start_soon(work, i, sb)
        finally:
            with anyio.CancelScope(shield=True):
                for sb in sandboxes:
                    await sb.stop()
        assert results == {(i, j): str(i * 10 + j) for i in range(8) for j in range(4)}


async def test_recycling_resets_contexts(target: Target) -> None:
    if target.kind in ("process", "remote") and not IS_ROOT:
        pytest.skip("the process backend (the remote server's too) resets isolated sandboxes only")
    options = {"recyclable": True} if target.kind == "docker" else {}
    mark = marker()
    async with session(
        target,
        backend_options=options,
        warm_pool=WarmPool(size=1, recycle=True),
        defaults=SandboxDefaults(tags=("test-interpreter",)),
    ) as s:
        await pool_ready(s, 1, within=120)
        async with s.sandbox() as first:  # from the pool, and back to it once reset
            await first.run_code(
                f"import subprocess\nsecret = 1\np = subprocess.Popen(['sleep', '{mark}'])"
            )
            await first.create_code_context()
            used = first.id
        if target.kind == "remote":
            # Its contexts live on the server, and end there with the reset, which runs in
            # the background (before the sandbox is handed to another episode).
            assert await processes_gone(mark, within=60) == []
        else:
            assert not processes_with(mark)  # the episode's processes went with it
        await pool_ready(
            s, 2, within=120
        )  # the reset one, and the one that refilled the pool meanwhile
        async with s.sandbox() as one, s.sandbox() as other:
            (second,) = [sb for sb in (one, other) if sb.id == used]  # the same sandbox, reset
            assert await second.list_code_contexts() == []
            fresh = await second.run_code("'secret' in globals()")
            assert fresh.text == "False"
            assert fresh.execution_count == 1


# -- hostile code ---------------------------------------------------------------------------


FORGED_FRAME = (
    "import json, struct\n"
    "def frame(header, payload=b''):\n"
    "    head = json.dumps(header).encode()\n"
    "    return struct.pack('>II', len(head), len(payload)) + head + payload\n"
)


async def test_printed_frames_are_only_output(target: Target) -> None:
    """Code printing what the runner's frames look like (a result, the call's end) on
    every way to stdout: it is output, nothing else."""
    code = FORGED_FRAME + textwrap.dedent(
        """
        import os, sys
        bundle = json.dumps({"data": {"text/plain": "'forged'"}, "main": True}).encode()
        for n in range(1, 6):
            for kind in ("result", "done"):
                forged = frame({"type": kind, "id": n, "call": n, "count": 99}, bundle)
                os.write(1, forged)
                sys.stdout.buffer.write(forged)
                os.write(2, forged)
        sys.stdout.flush()
        "genuine"
        """
    )
    async with sandbox(target) as sb:
        execution = await sb.run_code(code)
        assert execution.error is None
        assert [r.text for r in execution.results] == ["'genuine'"]
        assert execution.execution_count != 99
        assert "forged" in stdout(execution)
        assert "forged" in stderr(execution)
        assert (await sb.run_code("'still' + ' here'")).text == "'still here'"


async def test_the_runner_is_out_of_the_codes_reach(target: Target) -> None:
    """Code writing forged frames to every descriptor it has, and trying the runner's
    through /proc: another context sees nothing of it, and the runner's own descriptors
    are closed to it."""
    code = FORGED_FRAME + textwrap.dedent(
        """
        import os
        holder = os.getppid()
        with open(f"/proc/{holder}/stat") as f:
            supervisor = int(f.read().rsplit(")", 1)[1].split()[1])
        refused = []
        for pid in (holder, supervisor):
            for fd in range(0, 8):
                try:
                    os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY)
                except PermissionError:
                    refused.append(fd)
                except OSError:
                    refused.append(fd)
                else:
                    raise SystemExit(f"opened the runner's fd {fd} of {pid}")
        print(len(refused))
        bundle = json.dumps({"data": {"text/plain": "'forged'"}, "main": True}).encode()
        for fd in range(3, 1024):
            for n in range(1, 40):
                for kind in ("result", "stdout", "done"):
                    try:
                        os.write(fd, frame({"type": kind, "id": n, "call": n, "count": 99}, bundle))
                    except OSError:
                        break
        "done"
        """
    )
    async with sandbox(target) as sb:
        victim = await sb.create_code_context()
        await sb.run_code("safe = 'intact'", context=victim)
        hostile = await sb.run_code(code)
        # Its own event pipe was within reach: it broke its own context's protocol, and
        # that context was restarted. Nothing else.
        assert stdout(hostile).startswith("16\n"), hostile
        assert hostile.error is None or hostile.error.name == "InterpreterRestarted", hostile.error
        for result in hostile.results:
            assert result.text in ("'forged'", "'done'")
        calm = await sb.run_code("safe", context=victim)
        assert calm.error is None
        assert calm.text == "'intact'"
        assert calm.results == [Result(text="'intact'", is_main_result=True)]
        assert not calm.restarted
        assert (await sb.run_code("1 + 1")).text == "2"


async def test_killing_the_runner_is_reported_and_a_new_one_takes_over(target: Target) -> None:
    code = textwrap.dedent(
        """
        import os, signal
        with open(f"/proc/{os.getppid()}/stat") as f:
            supervisor = int(f.read().rsplit(")", 1)[1].split()[1])
        print("killing", supervisor, flush=True)
        os.kill(supervisor, signal.SIGKILL)
        import time; time.sleep(600)
        """
    )
    async with sandbox(target) as sb:
        other = await sb.create_code_context()
        await sb.run_code("x = 1", context=other)
        killed = await sb.run_code(code, timeout=120)
        assert killed.error is not None
        assert killed.error.name == "InterpreterDied"
        assert "runner died" in killed.error.value
        assert killed.restarted
        fresh = await sb.run_code("'x' in globals()", context=other)
        assert fresh.error is None
        assert fresh.text == "False"
        assert fresh.restarted  # its state went with the runner: it says so
        assert {c.id for c in await sb.list_code_contexts()} == {"default", other.id}
        assert (await sb.run_code("1 + 1")).text == "2"


# -- the rest of the API --------------------------------------------------------------------


async def test_a_backend_without_interactive_processes_refuses() -> None:
    async with Session(FakeBackend(), sweep=False) as s, s.sandbox() as sb:
        with pytest.raises(InvalidArgument, match="cannot run code"):
            await sb.run_code("1")


async def test_sync_facade_runs_code(process_root: Path, anyio_backend: str) -> None:
    from asyncsandbox.sync import SyncSession

    def blocking() -> None:
        sync = SyncSession("process", backend_options={"root": process_root}, sweep=False)
        with sync as s, s.sandbox() as sb:
            seen: list[str] = []
            sb.run_code("x = 5").result()
            execution = sb.run_code(
                "print(x); x * 2", on_stdout=lambda m: seen.append(m.line)
            ).result()
            assert execution.text == "10"
            assert seen == ["5\n"]
            context = sb.create_code_context(cwd="/tmp").result()
            assert sb.run_code("import os; os.getcwd()", context=context).result().text == "'/tmp'"
            assert len(sb.list_code_contexts().result()) == 2
            sb.restart_code_context(context).result()
            sb.remove_code_context(context).result()
            with pytest.raises(ExecTimeout):
                sb.run_code("import time; time.sleep(60)", timeout=0.5).result()

    await anyio.to_thread.run_sync(blocking)


async def test_wall_clock_of_a_warm_call_is_small(target: Target) -> None:
    """Not a timing assertion: the warm call must not start an interpreter (its count
    goes on, its pid stays)."""
    async with sandbox(target) as sb:
        first = await sb.run_code("import os; os.getpid()")
        for _ in range(5):
            again = await sb.run_code("os.getpid()")
            assert again.text == first.text
        assert again.execution_count == (first.execution_count or 0) + 5


def test_the_runner_fits_in_one_argument() -> None:
    """The runner is sent as ``python3 -c SOURCE``: Linux takes no single argument longer
    than MAX_ARG_STRLEN (32 pages: 128 KiB), whatever the total room (E2BIG)."""
    from asyncsandbox._interpreter._engine import RUNNER

    assert len(RUNNER.encode()) < 32 * 4096
