"""What a call of the code interpreter (``Sandbox.run_code``) gives back, on every
backend (tests/_interpreter_support.py): the state that persists from call to call, the
main result, each rich format, matplotlib figures (as PNG, with their chart data), PIL
images and data frames, a notebook's shell lines, exceptions as data, and the environment
of one call.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from asyncsandbox import ExecTimeout, OutputMessage, Result

from . import _interpreter_support as interpreter
from ._interpreter_support import ROOTFS, Target, marker, sandbox, stderr, stdout
from ._support import eventually_async, processes_with

# The interpreter family's fixtures (tests/_interpreter_support.py), this module's by name.
remote_server = interpreter.remote_server
target = interpreter.target


# In a fresh sandbox pyplot is imported (and its font cache built) in 0.6 s of CPU; beside
# CI's other suites the import took 10 to 31 s and the whole test up to 81 s (the landing
# machine): pytest's 120 s is a guard against hangs, not this test's bound.
PYPLOT = pytest.mark.timeout(300)


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


@PYPLOT
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


@PYPLOT
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
