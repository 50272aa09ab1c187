"""The file editor (``str_replace_editor``), and the reads and writes the file tools share:
text in and out of one sandbox's files, edits that keep a file's mode, and errors the
model can act on (:class:`ModelError`)."""

from __future__ import annotations

from msgspec import UnsetType

from .._errors import ExecTimeout, FileErrorReason, InvalidArgument, SandboxFileError
from .._sandbox import Sandbox
from ._arguments import Editor as EditorArgs
from ._results import ModelError, decode

__all__ = ("Editor", "check_range", "lines_of")


class Editor:
    """The editor's commands on the files of ``sandbox``.

    :param max_file_bytes: files larger than this are not read.
    :param list_timeout: the limit of listing a directory (``view`` of one).
    :param output_bytes: the output kept of that listing.
    """

    def __init__(
        self, sandbox: Sandbox, *, max_file_bytes: int, list_timeout: float, output_bytes: int
    ) -> None:
        self.sandbox = sandbox
        self._max_file_bytes = max_file_bytes
        self._list_timeout = list_timeout
        self._output_bytes = output_bytes

    async def run(self, args: EditorArgs) -> str:
        """Run the command of ``args``; the observation."""
        edit = {
            "view": self.view,
            "create": self.create,
            "str_replace": self.str_replace,
            "insert": self.insert,
        }[args.command]
        return await edit(args)

    async def view(self, args: EditorArgs) -> str:
        try:
            text = await self.read_text(args.path, strict=False)
        except SandboxFileError as exc:
            if exc.reason is not FileErrorReason.IS_A_DIRECTORY:
                raise
            return await self.list_directory(args.path)
        lines = lines_of(text)
        if not lines:
            return "(empty file)"
        first, last = 1, len(lines)
        if not isinstance(args.view_range, UnsetType):
            first, last = args.view_range
            last = len(lines) if last == -1 else last
            check_range(args.path, lines, first, last)
        return numbered(lines, first, last)

    async def list_directory(self, path: str) -> str:
        result = await self.sandbox.exec(
            ["find", path, "-maxdepth", "2", "-not", "-path", "*/.*"],
            timeout=self._list_timeout,
            max_output_bytes=self._output_bytes,
        )
        if result.returncode != 0:
            raise ModelError(f"cannot list {path}: {result.stderr_text.strip()}")
        entries = "\n".join(sorted(result.stdout_text.splitlines()))
        return f"{path} contains (two levels deep, hidden entries excluded):\n{entries}"

    async def create(self, args: EditorArgs) -> str:
        if isinstance(args.file_text, UnsetType):
            raise ModelError("`create` needs `file_text`, the content of the new file")
        try:
            await self.sandbox.read_file(args.path, max_bytes=1)
        except SandboxFileError as exc:
            if exc.reason is not FileErrorReason.NOT_FOUND:
                if exc.reason is not FileErrorReason.TOO_LARGE:  # too large: it exists
                    raise
            else:
                await self.sandbox.write_file(args.path, args.file_text)
                return f"Created {args.path}."
        raise ModelError(
            f"{args.path} already exists; `create` makes new files only. Edit it with "
            "`str_replace` or `insert`, or replace it with write_file."
        )

    async def str_replace(self, args: EditorArgs) -> str:
        old = "" if isinstance(args.old_str, UnsetType) else args.old_str
        if not old:
            raise ModelError("`str_replace` needs a non-empty `old_str`")
        new = "" if isinstance(args.new_str, UnsetType) else args.new_str
        text = await self.read_text(args.path, strict=True)
        found = occurrences(text, old)
        if not found:
            raise ModelError(
                f"`old_str` was not found in {args.path}; nothing was replaced. It must match "
                "the file exactly, whitespace and indentation included (view the file)."
            )
        if len(found) > 1:
            lines = ", ".join(str(text.count("\n", 0, i) + 1) for i in found)
            raise ModelError(
                f"`old_str` occurs {len(found)} times in {args.path} (starting on lines "
                f"{lines}); nothing was replaced. Include more surrounding lines to make it "
                "unique."
            )
        at = found[0]
        updated = text[:at] + new + text[at + len(old) :]
        await self.write(args.path, updated)
        first = text.count("\n", 0, at) + 1
        return edited(args.path, updated, first, first + new.count("\n"))

    async def insert(self, args: EditorArgs) -> str:
        if isinstance(args.insert_line, UnsetType) or isinstance(args.new_str, UnsetType):
            raise ModelError("`insert` needs `insert_line` and `new_str`")
        text = await self.read_text(args.path, strict=True)
        lines = lines_of(text)
        after = args.insert_line
        if after > len(lines):
            raise ModelError(
                f"insert_line {after} is past the end of {args.path}, which has {len(lines)} "
                f"lines (use 0 to {len(lines)})"
            )
        added = lines_of(args.new_str) or [""]
        updated_lines = lines[:after] + added + lines[after:]
        keep_final_newline = text.endswith("\n") or not text
        updated = "\n".join(updated_lines) + ("\n" if keep_final_newline else "")
        await self.write(args.path, updated)
        return edited(args.path, updated, after + 1, after + len(added))

    async def read_text(self, path: str, *, strict: bool) -> str:
        data = await self.sandbox.read_file(path, max_bytes=self._max_file_bytes)
        if not strict:
            return decode(data)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            # Editing a decoded-with-replacement copy would corrupt the file.
            raise ModelError(f"{path} is not UTF-8 text; edit it with bash instead") from None

    async def write(self, path: str, text: str) -> int:
        """Write ``text``, keeping the permission bits of a file that exists."""
        data = text.encode()
        mode = await self.mode(path)
        await self.sandbox.write_file(path, data, mode=0o644 if mode is None else mode)
        return len(data)

    async def mode(self, path: str) -> int | None:
        # The file API sets the mode it is given; without this, editing a script would
        # silently make it non-executable. Any failure here means: a new file.
        try:
            result = await self.sandbox.exec(["stat", "-L", "-c", "%a", "--", path], timeout=30)
            return int(result.stdout_text.strip(), 8) if result.returncode == 0 else None
        except (ValueError, InvalidArgument, ExecTimeout):
            return None


# -- pure helpers ---------------------------------------------------------------------------


def lines_of(text: str) -> list[str]:
    """Lines as ``sed`` and ``cat -n`` count them (split on ``\\n`` only)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def check_range(path: str, lines: list[str], first: int, last: int) -> None:
    if not 1 <= first <= len(lines):
        raise ModelError(f"line {first} is out of range: {path} has {len(lines)} lines")
    if last < first:
        raise ModelError(f"the last line ({last}) is before the first ({first})")


def numbered(lines: list[str], first: int, last: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines[first - 1 : last], first))


def edited(path: str, text: str, first: int, last: int, context: int = 4) -> str:
    lines = lines_of(text)
    shown = numbered(lines, max(1, first - context), min(len(lines), last + context))
    return f"Edited {path}. The changed lines, with context:\n{shown}"


def occurrences(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at != -1:
        found.append(at)
        at = text.find(part, at + len(part))
    return found
