"""Agent tools (asyncsandbox.tools): schemas, every failure as an observation with the right
flags, the editor on real files, submit, and cancellation. Every test runs on asyncio and
trio; behaviour runs on the process backend, failures are scripted on the FakeBackend."""

from __future__ import annotations

import base64
import inspect
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import (
    BackendUnavailable,
    InvalidArgument,
    Sandbox,
    SandboxFileError,
    Session,
    tools as tools_module,
)
from asyncsandbox.testing import FakeBackend, FakeProcess
from asyncsandbox.tools import TOOL_NAMES, Grade, Toolbox, ToolResult

from ._support import eventually_async, processes_with, unique_marker


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tools on a real sandbox run on asyncio: the toolbox's policy is proven on both loops
    # on the fake backend (the tests here that use it), the process backend on trio by the
    # conformance suite (test_conformance.py).
    explicit = any(
        "anyio_backend" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")
    )
    if "process_root" in metafunc.fixturenames and not explicit:
        metafunc.parametrize("anyio_backend", ["asyncio"])


@asynccontextmanager
async def process_toolbox(root: Path, **kwargs: Any) -> AsyncIterator[Toolbox]:
    async with (
        Session("process", backend_options={"root": root}, sweep=False) as session,
        session.sandbox() as sandbox,
    ):
        yield Toolbox(sandbox, **kwargs)


@asynccontextmanager
async def fake_toolbox(fake: FakeBackend | None = None, **kwargs: Any) -> AsyncIterator[Toolbox]:
    async with (
        Session(fake or FakeBackend(), sweep=False) as session,
        session.sandbox() as sandbox,
    ):
        yield Toolbox(sandbox, **kwargs)


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.observation
    assert not result.infrastructure_error
    return result.observation


def model_error(result: ToolResult) -> str:
    """A failure the model caused: an error, not an infrastructure one, episode going on."""
    assert result.is_error, result.observation
    assert not result.infrastructure_error, result.observation
    assert result.observation.startswith("Error: ")
    assert result.reward is None
    return result.observation


def infrastructure_error(result: ToolResult) -> str:
    assert result.is_error
    assert result.infrastructure_error, result.observation
    assert result.observation.startswith("Error: ")
    return result.observation


async def size_of(sandbox: Sandbox, path: str) -> int:
    try:
        return len(await sandbox.read_file(path))
    except SandboxFileError:
        return 0


async def wait_for_size(sandbox: Sandbox, path: str, size: int) -> None:
    async def grown() -> bool:  # the writer is a process in the sandbox
        return await size_of(sandbox, path) >= size

    await eventually_async(grown, within=10, what=f"{path} has {size} bytes")


# -- surface and schemas ----------------------------------------------------------------------


def test_public_surface_is_exported_and_documented() -> None:
    assert isinstance(tools_module.__all__, tuple)
    defined = {
        name
        for name, obj in vars(tools_module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == tools_module.__name__
    }
    assert defined <= set(tools_module.__all__)
    for obj in (Toolbox, ToolResult, Toolbox.call, Toolbox.schemas, ToolResult.message):
        assert inspect.getdoc(obj)
    assert "Cancellation" in (Toolbox.call.__doc__ or "")


async def test_schemas_are_openai_tool_definitions() -> None:
    async with fake_toolbox(tests=["true"]) as toolbox:
        schemas = toolbox.schemas()
        # All but execute_bash and python, which are offered only when asked for.
        assert [s["function"]["name"] for s in schemas] == [
            n for n in TOOL_NAMES if n not in ("execute_bash", "python")
        ]
        json.dumps(schemas)  # plain JSON
        for schema in schemas:
            assert schema["type"] == "function"
            function = schema["function"]
            assert set(function) == {"name", "description", "parameters"}
            assert function["description"]
            params = function["parameters"]
            assert params["type"] == "object"
            assert params["additionalProperties"] is False
            assert set(params["required"]) <= set(params["properties"])
            for prop in params["properties"].values():
                assert "type" in prop
                assert prop["description"]
        by_name = {s["function"]["name"]: s["function"]["parameters"] for s in schemas}
        assert by_name["bash"]["required"] == ["command"]
        assert "default 30, at most 600" in by_name["bash"]["properties"]["timeout"]["description"]
        assert by_name["str_replace_editor"]["properties"]["command"]["enum"] == sorted(
            ["view", "create", "str_replace", "insert"]
        )
        assert by_name["submit"]["properties"] == {}
        assert "/workspace" in schemas[0]["function"]["description"]
        schemas[0]["function"]["name"] = "changed"
        assert toolbox.schemas()[0]["function"]["name"] == "bash"  # a fresh copy each time


async def test_tool_selection() -> None:
    async with fake_toolbox() as toolbox:
        sandbox = toolbox.sandbox
        assert toolbox.names == ("bash", "read_file", "write_file", "str_replace_editor")
        only = Toolbox(sandbox, tools=["read_file", "submit"], tests="true")
        assert [s["function"]["name"] for s in only.schemas()] == ["read_file", "submit"]
        result = await only.call("bash", {"command": "true"})
        assert "unknown tool 'bash'; the tools are: read_file, submit" in model_error(result)
        for bad in (
            {"tools": ["nope"]},
            {"tools": ["submit"]},  # no tests
            {"tools": "bash"},
            {"tools": ["bash", "bash"]},
            {"bash_timeout": 10, "max_bash_timeout": 5},
            {"bash_timeout": 0},
            {"max_observation_chars": 10},
            {"tests": "echo \0"},
        ):
            with pytest.raises(InvalidArgument):
                Toolbox(sandbox, **bad)
        with pytest.raises(InvalidArgument):
            Toolbox("not a sandbox")  # type: ignore[arg-type]


def test_result_message() -> None:
    result = ToolResult(name="bash", observation="exit=0\nhi\n")
    assert result.message("call_1") == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "exit=0\nhi\n",
    }


# -- arguments --------------------------------------------------------------------------------


async def test_invalid_calls_are_observations() -> None:
    async with fake_toolbox(tests="true") as toolbox:
        cases: list[tuple[Any, Any, str]] = [
            ("bash", '{"command": ', "are not valid JSON"),
            ("bash", b"\xff", "are not valid JSON"),
            ("bash", "[1, 2]", "must be a JSON object, not list"),
            ("bash", 42, "must be a JSON object"),
            ("bash", {}, "missing required field `command`"),
            ("bash", {"command": 3}, "Expected `str`, got `int` - at `$.command`"),
            ("bash", {"command": "true", "cmd": "x"}, "unknown field `cmd`"),
            ("bash", {"command": "true", "timeout": -1}, "`$.timeout`"),
            ("bash", {"command": "true", "timeout": "10"}, "Expected `float`, got `str`"),
            ("read_file", {"path": "x", "start_line": 0}, "`$.start_line`"),
            ("str_replace_editor", {"command": "delete", "path": "x"}, "Invalid enum value"),
            ("str_replace_editor", {"command": "view", "path": "x", "view_range": [1]}, "length"),
            ("submit", {"answer": 42}, "unknown field `answer`"),
            ("launch_missiles", {}, "unknown tool 'launch_missiles'"),
            (None, {}, "unknown tool None"),
        ]
        for name, arguments, expected in cases:
            observation = model_error(await toolbox.call(name, arguments))
            assert expected in observation, (name, arguments, observation)
        assert not toolbox.done


async def test_arguments_as_dict_json_or_nothing() -> None:
    async with fake_toolbox(tests="true") as toolbox:
        assert ok(await toolbox.call("read_file", {"path": "/etc/hostname"})) == "fake\n"
        assert ok(await toolbox.call("read_file", '{"path": "/etc/hostname"}')) == "fake\n"
        assert ok(await toolbox.call("read_file", b'{"path": "/etc/hostname"}')) == "fake\n"
    async with fake_toolbox(tests=["true"]) as toolbox:
        assert (await toolbox.call("submit", "")).reward == 1.0  # "" means no arguments
    async with fake_toolbox(tests=["true"]) as toolbox:
        assert (await toolbox.call("submit")).reward == 1.0


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


# -- files ------------------------------------------------------------------------------------


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


async def test_read_file(process_root: Path) -> None:
    async with process_toolbox(process_root, max_file_bytes=1000) as toolbox:
        sandbox = toolbox.sandbox
        await sandbox.write_file("f.txt", "one\ntwo\nthree\nfour\n")
        await sandbox.write_file("empty.txt", "")
        await sandbox.write_file("big.txt", "x" * 2000)
        assert ok(await toolbox.call("read_file", {"path": "f.txt"})) == "one\ntwo\nthree\nfour\n"
        read = {"path": "f.txt", "start_line": 2, "end_line": 3}
        assert ok(await toolbox.call("read_file", read)) == "two\nthree"
        assert ok(await toolbox.call("read_file", {"path": "f.txt", "start_line": 3})) == (
            "three\nfour"
        )
        read = {"path": "/workspace/f.txt", "end_line": 99}
        assert ok(await toolbox.call("read_file", read)) == "one\ntwo\nthree\nfour"
        assert ok(await toolbox.call("read_file", {"path": "empty.txt"})) == "(empty file)"
        observation = model_error(
            await toolbox.call("read_file", {"path": "f.txt", "start_line": 9})
        )
        assert "out of range" in observation
        read = {"path": "f.txt", "start_line": 3, "end_line": 2}
        assert "before the first" in model_error(await toolbox.call("read_file", read))
        observation = model_error(await toolbox.call("read_file", {"path": "missing.txt"}))
        assert observation == "Error: not found: /workspace/missing.txt"
        observation = model_error(await toolbox.call("read_file", {"path": "/workspace"}))
        assert "is a directory" in observation
        observation = model_error(await toolbox.call("read_file", {"path": "big.txt"}))
        assert "too large" in observation
        assert "sed -n" in observation
        observation = model_error(await toolbox.call("read_file", {"path": "bad\0path"}))
        assert "NUL" in observation


async def test_write_file(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        result = await toolbox.call("write_file", {"path": "deep/er/f.txt", "content": "héllo\n"})
        assert ok(result) == "Wrote 7 bytes to deep/er/f.txt."
        assert await sandbox.read_file("deep/er/f.txt") == "héllo\n".encode()
        await toolbox.call("write_file", {"path": "deep/er/f.txt", "content": "replaced"})
        assert await sandbox.read_file("deep/er/f.txt") == b"replaced"
        result = await toolbox.call("write_file", {"path": "deep", "content": "x"})
        assert "is a directory" in model_error(result)
        result = await toolbox.call("write_file", {"path": "/usr/evil", "content": "x"})
        assert "permission" in model_error(result)


# -- the editor -------------------------------------------------------------------------------


def edit(command: str, path: str, **arguments: Any) -> dict[str, Any]:
    return {"command": command, "path": path, **arguments}


async def test_editor_view(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        await sandbox.write_file("pkg/mod.py", "a = 1\nb = 2\nc = 3\n")
        await sandbox.write_file("pkg/sub/deep/hidden_too_deep.py", "")
        await sandbox.write_file("pkg/.secret", "")
        await sandbox.write_file("empty.py", "")
        observation = ok(await toolbox.call("str_replace_editor", edit("view", "pkg/mod.py")))
        assert observation == "     1\ta = 1\n     2\tb = 2\n     3\tc = 3"
        view = edit("view", "pkg/mod.py", view_range=[2, -1])
        assert ok(await toolbox.call("str_replace_editor", view)) == "     2\tb = 2\n     3\tc = 3"
        view = edit("view", "pkg/mod.py", view_range=[5, 6])
        assert "out of range" in model_error(await toolbox.call("str_replace_editor", view))
        assert ok(await toolbox.call("str_replace_editor", edit("view", "empty.py"))) == (
            "(empty file)"
        )
        listing = ok(await toolbox.call("str_replace_editor", edit("view", "pkg")))
        lines = listing.splitlines()
        assert lines[0] == "pkg contains (two levels deep, hidden entries excluded):"
        assert lines[1:] == ["pkg", "pkg/mod.py", "pkg/sub", "pkg/sub/deep"]
        result = await toolbox.call("str_replace_editor", edit("view", "nowhere"))
        assert "not found" in model_error(result)


async def test_editor_create(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        create = edit("create", "new/file.py", file_text="print('hi')\n")
        assert ok(await toolbox.call("str_replace_editor", create)) == "Created new/file.py."
        assert await sandbox.read_file("new/file.py") == b"print('hi')\n"
        create = edit("create", "new/file.py", file_text="overwrite?")
        assert "already exists" in model_error(await toolbox.call("str_replace_editor", create))
        assert await sandbox.read_file("new/file.py") == b"print('hi')\n"
        create = edit("create", "new", file_text="x")
        assert "is a directory" in model_error(await toolbox.call("str_replace_editor", create))
        result = await toolbox.call("str_replace_editor", edit("create", "other.py"))
        assert "needs `file_text`" in model_error(result)


async def test_editor_str_replace(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        original = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
        await sandbox.write_file("m.py", original)

        async def replace(old: str, new: str | None = None) -> ToolResult:
            arguments = edit("str_replace", "m.py", old_str=old)
            if new is not None:
                arguments["new_str"] = new
            return await toolbox.call("str_replace_editor", arguments)

        observation = model_error(await replace("    return 1", "    return 2"))
        assert "occurs 2 times" in observation
        assert "lines 2, 6" in observation
        observation = model_error(await replace("return  1", "x"))
        assert "was not found" in observation
        assert await sandbox.read_file("m.py") == original.encode()  # nothing changed
        assert "non-empty `old_str`" in model_error(await replace(""))

        observation = ok(
            await replace("def g():\n    return 1", "def g():\n    return 2\n    # done")
        )
        assert observation.startswith("Edited m.py.")
        assert "     6\t    return 2\n     7\t    # done" in observation
        expected = "def f():\n    return 1\n\n\ndef g():\n    return 2\n    # done\n"
        assert await sandbox.read_file("m.py") == expected.encode()
        ok(await replace("\n\n\n", "\n"))  # new_str may join lines; omitted means delete
        ok(await replace("    # done\n"))
        assert (
            await sandbox.read_file("m.py") == b"def f():\n    return 1\ndef g():\n    return 2\n"
        )

        # Permission bits survive an edit: a script stays executable.
        await sandbox.write_file("run.sh", "#!/bin/sh\necho one\n", mode=0o755)
        arguments = edit("str_replace", "run.sh", old_str="one", new_str="two")
        ok(await toolbox.call("str_replace_editor", arguments))
        assert ok(await toolbox.call("bash", {"command": "./run.sh"})) == "exit=0\ntwo\n"

        await sandbox.write_file("latin1.txt", "caf\xe9".encode("latin-1"))
        arguments = edit("str_replace", "latin1.txt", old_str="caf", new_str="bar")
        assert "not UTF-8" in model_error(await toolbox.call("str_replace_editor", arguments))
        assert await sandbox.read_file("latin1.txt") == b"caf\xe9"


async def test_editor_insert(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        await sandbox.write_file("f.txt", "one\ntwo\n")

        async def insert(after: int, text: str, path: str = "f.txt") -> ToolResult:
            arguments = edit("insert", path, insert_line=after, new_str=text)
            return await toolbox.call("str_replace_editor", arguments)

        assert "     1\tzero" in ok(await insert(0, "zero"))
        ok(await insert(2, "one and a half\n"))
        ok(await insert(4, "three\nfour"))
        assert await sandbox.read_file("f.txt") == b"zero\none\none and a half\ntwo\nthree\nfour\n"
        observation = model_error(await insert(7, "x"))
        assert "past the end" in observation
        assert "has 6 lines" in observation
        await sandbox.write_file("no_newline.txt", "a\nb")
        ok(await insert(2, "c", path="no_newline.txt"))
        assert await sandbox.read_file("no_newline.txt") == b"a\nb\nc"
        await sandbox.write_file("empty.txt", "")
        ok(await insert(0, "first", path="empty.txt"))
        assert await sandbox.read_file("empty.txt") == b"first\n"
        result = await toolbox.call("str_replace_editor", edit("insert", "f.txt", new_str="x"))
        assert "needs `insert_line`" in model_error(result)


# -- submit -----------------------------------------------------------------------------------


async def test_submit_runs_the_test_command(process_root: Path) -> None:
    async with process_toolbox(process_root, tests="test -f solved && echo PASS") as toolbox:
        result = await toolbox.call("submit", {})
        assert result.done
        assert result.reward == 0.0
        assert not result.is_error
        assert result.observation.startswith("Submitted: the tests failed (exit=1); reward=0.0.")
        assert toolbox.done
        assert toolbox.reward == 0.0
        # The episode is over: nothing runs any more, and a second submit grades nothing.
        result = await toolbox.call("bash", {"command": "touch solved"})
        assert result.done
        assert "already submitted" in model_error(result)
        assert "already submitted" in model_error(await toolbox.call("submit", {}))
        assert toolbox.reward == 0.0
        assert await size_of(toolbox.sandbox, "solved") == 0  # the touch did not run

    async with process_toolbox(process_root, tests=["sh", "-c", "test -f solved"]) as toolbox:
        assert not (await toolbox.call("bash", {"command": "touch solved"})).done
        result = await toolbox.call("submit", {})
        assert (result.reward, result.done, result.is_error) == (1.0, True, False)
        assert result.observation.startswith("Submitted: the tests passed (exit=0); reward=1.0.")
        assert toolbox.reward == 1.0


async def test_submit_test_timeout_scores_zero(process_root: Path) -> None:
    async with process_toolbox(
        # 2 s: under CI's load, 0.5 s passed before the shell printed its first line
        process_root,
        tests="echo running; sleep 60",
        test_timeout=2,
    ) as tb:
        result = await tb.call("submit", {})
        assert (result.reward, result.done, result.infrastructure_error) == (0.0, True, False)
        assert result.observation.startswith("Submitted: the tests timed out after 2s")
        assert "running" in result.observation


async def test_submit_with_a_grader_callable() -> None:
    async def grader(sandbox: Sandbox) -> float:
        return 0.25 * len(await sandbox.read_file("answer.txt"))

    async with fake_toolbox(tests=grader) as toolbox:
        ok(await toolbox.call("write_file", {"path": "answer.txt", "content": "42"}))
        result = await toolbox.call("submit", {})
        assert (result.reward, result.done) == (0.5, True)
        assert toolbox.reward == 0.5

    async def graded(sandbox: Sandbox) -> Grade:
        return Grade(reward=0.75, observation="Test execution complete.\nReward: 0.75")

    async with fake_toolbox(tests=graded) as toolbox:
        result = await toolbox.call("submit", {})
        assert (result.reward, result.done) == (0.75, True)
        assert result.observation == "Test execution complete.\nReward: 0.75"

    async def broken(sandbox: Sandbox) -> float:
        raise ValueError("grader bug")

    async with fake_toolbox(tests=broken) as toolbox:
        result = await toolbox.call("submit", {})
        assert "ValueError: grader bug" in infrastructure_error(result)
        assert (result.reward, result.done) == (None, True)
        assert toolbox.reward is None

    async def not_a_number(sandbox: Sandbox) -> float:
        return "yes"  # type: ignore[return-value]

    async with fake_toolbox(tests=not_a_number) as toolbox:
        infrastructure_error(await toolbox.call("submit", {}))


# -- infrastructure failures and cancellation -------------------------------------------------


async def test_infrastructure_failures_are_flagged() -> None:
    fake = FakeBackend()
    async with fake_toolbox(fake, tests=["true"]) as toolbox:
        sandbox = toolbox.sandbox
        await sandbox.start()
        assert sandbox.id is not None
        fake.kill(sandbox.id)
        for name, arguments in [
            ("bash", {"command": "true"}),
            ("read_file", {"path": "x"}),
            ("write_file", {"path": "x", "content": "x"}),
            ("str_replace_editor", edit("view", "x")),
        ]:
            observation = infrastructure_error(await toolbox.call(name, arguments))
            assert "died" in observation
            assert "infrastructure failure" in observation
        result = await toolbox.call("submit", {})
        infrastructure_error(result)
        assert (result.reward, result.done) == (None, True)

    async def unavailable(p: FakeProcess) -> int:
        raise BackendUnavailable("daemon gone")

    async with fake_toolbox(FakeBackend(commands={"sh": unavailable})) as toolbox:
        result = await toolbox.call("bash", {"command": "true"})
        assert "daemon gone" in infrastructure_error(result)

    async with fake_toolbox() as toolbox:
        await toolbox.sandbox.stop()
        infrastructure_error(await toolbox.call("read_file", {"path": "x"}))


async def test_cancellation_propagates() -> None:
    entered, left = anyio.Event(), anyio.Event()

    async def block(p: FakeProcess) -> int:
        entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            left.set()
        return 0

    async with fake_toolbox(FakeBackend(commands={"sh": block})) as toolbox:
        results: list[ToolResult] = []
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    results.append(await toolbox.call("bash", {"command": "anything"}))

                tg.start_soon(call)
                await entered.wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert results == []  # cancellation is never turned into an observation
        with anyio.fail_after(5):
            await left.wait()


async def test_cancelling_a_call_kills_the_command(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        marker = unique_marker()  # on the shell's command line
        command = f": {marker}; while :; do echo . >> beat; sleep 0.02; done"
        results: list[ToolResult] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(await toolbox.call("bash", {"command": command, "timeout": 600}))

            tg.start_soon(call)
            await wait_for_size(sandbox, "beat", 10)
            tg.cancel_scope.cancel()
        assert results == []
        # The shell that alone writes the file is gone: it grows no more.
        await eventually_async(lambda: not processes_with(marker), what="the command killed")
        assert await size_of(sandbox, "beat") >= 10
        assert ok(await toolbox.call("bash", {"command": "echo alive"})) == "exit=0\nalive\n"
