"""Agent tools that run code (asyncsandbox.tools), on the process backend: bash (a shell per
call: exit status and output, timeouts), execute_bash (open-instruct's, whose shell state
persists), observations bounded and decoded, and python (an interpreter that keeps its
state: values, output, errors, images, timeouts). On asyncio: the toolbox's policy runs on
both loops in tests/test_tools_toolbox.py."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import anyio

from ._tools_support import model_error, ok, process_toolbox, tools_generate_tests

# Tools on a real sandbox run on asyncio (tests/_tools_support.py), this module's by name.
pytest_generate_tests = tools_generate_tests

# -- bash -------------------------------------------------------------------------------------


async def test_bash_exit_status_and_output(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        assert ok(await toolbox.call("bash", '{"command": "echo hi"}')) == "exit=0\nhi\n"
        result = await toolbox.call("bash", {"command": "echo out; echo err >&2; exit 3"})
        assert result.is_error
        assert not result.infrastructure_error
        assert result.observation == "exit=3\nout\n[stderr]\nerr\n"
        assert ok(await toolbox.call("bash", {"command": "true"})) == "exit=0\n(no output)"
        result = await toolbox.call("bash", {"command": "printf 'no newline'; echo e >&2"})
        assert result.observation == "exit=0\nno newline\n[stderr]\ne\n"
        killed = await toolbox.call("bash", {"command": "kill -9 $$"})
        assert killed.is_error
        assert killed.observation.startswith("exit=137")
        # Files persist between calls, shell state does not.
        await toolbox.call("bash", {"command": "mkdir sub && cd sub && echo 1 > f"})
        assert ok(await toolbox.call("bash", {"command": "pwd; cat sub/f"})) == (
            "exit=0\n/workspace\n1\n"
        )


async def test_execute_bash_keeps_shell_state_and_speaks_open_instructs_format(
    process_root: Path,
) -> None:
    tools = ["execute_bash", "str_replace_editor", "submit"]
    async with process_toolbox(process_root, tools=tools, tests="true") as toolbox:
        assert [s["function"]["name"] for s in toolbox.schemas()] == tools
        schema = toolbox.schemas()[0]["function"]
        assert "persist between calls" in schema["description"]
        assert schema["parameters"]["required"] == ["command"]
        first = await toolbox.call(
            "execute_bash", {"command": "mkdir -p sub && cd sub && export GREETING=hi && echo ok"}
        )
        assert ok(first) == (
            "Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\nok\n\n[STDERR]\n"
        )
        # The working directory and exported variables persist, as in open-instruct.
        again = await toolbox.call(
            "execute_bash", {"command": "pwd; echo $GREETING; echo e >&2; exit 2"}
        )
        assert again.is_error
        assert not again.infrastructure_error
        assert again.observation == (
            "Exit code: 2\nExecution output of [execute_bash]:\n[STDOUT]\n"
            "/workspace/sub\nhi\n\n[STDERR]\ne\n"
        )
        timed = await toolbox.call(
            "execute_bash", {"command": "echo part; sleep 30", "timeout": 0.5}
        )
        assert timed.is_error
        assert timed.observation.startswith(
            "Exit code: timed out after 0.5s (the command was killed)"
        )
        assert "[STDOUT]\npart\n" in timed.observation
        assert "unknown tool 'bash'" in model_error(await toolbox.call("bash", {"command": "true"}))


async def test_bash_timeout_kills_and_reports_partial_output(process_root: Path) -> None:
    # Limits of seconds, not fractions: on a busy machine (CI runs two suites at once) a
    # command may take half a second to print its first line.
    async with process_toolbox(process_root, bash_timeout=2, max_bash_timeout=3) as toolbox:
        result = await toolbox.call("bash", {"command": "echo partial; sleep 60"})
        assert result.is_error
        assert not result.infrastructure_error
        assert result.observation == (
            "timed out after 2s (the command was killed); output so far:\npartial\n"
        )
        with anyio.fail_after(30):  # asked for 600 s: lowered to the maximum
            result = await toolbox.call("bash", {"command": "sleep 60", "timeout": 600})
        assert result.observation.startswith("timed out after 3s")
        result = await toolbox.call("bash", {"command": "echo quick", "timeout": 2.9})
        assert ok(result) == "exit=0\nquick\n"


async def test_observations_are_bounded_and_decoded(process_root: Path) -> None:
    async with process_toolbox(process_root, max_observation_chars=1000) as toolbox:
        command = r"printf START; head -c 100000 /dev/zero | tr '\0' x; printf END"
        observation = ok(await toolbox.call("bash", {"command": command}))
        assert len(observation) <= 1000
        assert observation.startswith("exit=0\nSTARTxxx")
        assert observation.endswith("xxxEND")
        match = re.search(r"\n\[\.\.\. (\d+) characters truncated \.\.\.\]\n", observation)
        assert match is not None
        full = len("exit=0\n") + len("START") + 100000 + len("END")
        assert int(match[1]) == full - (len(observation) - len(match[0]))
        # Large stdout and stderr together: still bounded, both ends kept.
        command = "head -c 50000 /dev/zero | tr '\\0' o; head -c 50000 /dev/zero | tr '\\0' e >&2"
        observation = ok(await toolbox.call("bash", {"command": command}))
        assert len(observation) <= 1000
        assert observation.startswith("exit=0\nooo")
        assert observation.endswith("eee")
        # Bytes that are not UTF-8 never raise.
        observation = ok(await toolbox.call("bash", {"command": r"printf 'a\377\376b'"}))
        assert observation == "exit=0\na\ufffd\ufffdb"
        await toolbox.sandbox.write_file("binary.dat", b"\xff\xfeok")
        assert ok(await toolbox.call("read_file", {"path": "binary.dat"})) == "\ufffd\ufffdok"


# -- python -----------------------------------------------------------------------------------


async def test_python_keeps_state_and_shows_values_output_and_errors(process_root: Path) -> None:
    async with process_toolbox(process_root, tools=["python"]) as toolbox:
        (schema,) = toolbox.schemas()
        params = schema["function"]["parameters"]
        assert params["required"] == ["code"]
        assert "default 30, at most 600" in params["properties"]["timeout"]["description"]
        first = await toolbox.call("python", {"code": "import math\nx = 6 * 7\nprint('set', x)"})
        assert first.observation == "set 42\n"
        assert not first.is_error
        assert first.images == ()
        shown = await toolbox.call("python", json.dumps({"code": "x + 1"}))
        assert shown.observation == "Out: 43\n"
        mixed = await toolbox.call(
            "python",
            {"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\ndisplay('d')\nx"},
        )
        assert mixed.observation == "out\n[stderr]\nerr\nOut: 'd'\nOut: 42\n"
        failed = await toolbox.call("python", {"code": "print('before')\n1 / 0"})
        assert failed.is_error
        assert not failed.infrastructure_error
        assert failed.observation.startswith("before\nTraceback (most recent call last):")
        assert failed.observation.endswith("ZeroDivisionError: division by zero\n")
        assert (await toolbox.call("python", {"code": "x"})).observation == "Out: 42\n"
        assert (await toolbox.call("python", {"code": "y = 1"})).observation == "(no output)"
        bad = await toolbox.call("python", {"command": "x"})
        assert "invalid arguments for python" in model_error(bad)


async def test_python_images_come_back_as_data(process_root: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n-fake-image"
    code = f"class Picture:\n    def _repr_png_(self): return {png!r}\nPicture()"
    async with process_toolbox(process_root, tools=["python"]) as toolbox:
        result = await toolbox.call("python", {"code": code})
        assert result.observation == "Out: [image 1: image/png, shown as an image]\n"
        (image,) = result.images
        assert image.mime_type == "image/png"
        assert image.data == png
        assert base64.b64decode(image.base64) == png
        assert image.data_url == "data:image/png;base64," + base64.b64encode(png).decode()
        tool_message, user_message = result.messages("call-1")
        assert tool_message == result.message("call-1")
        assert user_message["role"] == "user"
        parts = user_message["content"]
        assert parts[0]["type"] == "text"
        assert parts[1] == {"type": "image_url", "image_url": {"url": image.data_url}}
        json.dumps(result.messages("call-1"))  # plain JSON for a chat API
        plain = await toolbox.call("python", {"code": "1"})
        assert plain.messages("call-2") == [plain.message("call-2")]


async def test_python_timeout_interrupts_and_the_state_stays(process_root: Path) -> None:
    async with process_toolbox(
        process_root, tools=["python"], python_timeout=1, max_python_timeout=2
    ) as toolbox:
        await toolbox.call("python", {"code": "kept = 'yes'"})
        slow = await toolbox.call(
            "python", {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}
        )
        assert slow.is_error
        assert slow.observation.startswith(
            "timed out after 1s (interrupted: the interpreter keeps its state); output so far:"
            "\nstarted\nTraceback"
        )
        assert "KeyboardInterrupt" in slow.observation
        capped = await toolbox.call("python", {"code": "time.sleep(60)", "timeout": 100})
        assert capped.observation.startswith("timed out after 2s")
        assert (await toolbox.call("python", {"code": "kept"})).observation == "Out: 'yes'\n"
        died = await toolbox.call("python", {"code": "import os; os._exit(1)"})
        assert died.is_error
        assert not died.infrastructure_error  # the code's doing
        assert "InterpreterDied" in died.observation
        assert "the interpreter was restarted" in died.observation
