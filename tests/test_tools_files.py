"""Agent tools on real files (asyncsandbox.tools), on the process backend: read_file,
write_file, and the editor (str_replace_editor: view, create, str_replace, insert). On
asyncio: the toolbox's policy runs on both loops in tests/test_tools_toolbox.py."""

from __future__ import annotations

from pathlib import Path

from asyncsandbox.tools import ToolResult

from ._tools_support import edit, model_error, ok, process_toolbox, tools_generate_tests

# Tools on a real sandbox run on asyncio (tests/_tools_support.py), this module's by name.
pytest_generate_tests = tools_generate_tests


# -- files ------------------------------------------------------------------------------------


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
