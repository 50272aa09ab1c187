"""The :class:`Toolbox`: the tools' registry (:data:`TOOLS`: arguments, description and
handler of each), and a dispatcher that turns every failure into an observation."""

from __future__ import annotations

import copy
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple, final

from msgspec import UnsetType

from .. import _validate as check
from .._errors import (
    CommandError,
    ExecTimeout,
    FileErrorReason,
    InvalidArgument,
    SandboxError,
    SandboxFileError,
)
from .._log import get_logger
from .._models import ExecResult
from .._sandbox import Sandbox
from ._arguments import (
    Args,
    Bash,
    Editor as EditorArgs,
    Python,
    ReadFile,
    Submit,
    WriteFile,
    parameters,
    parse,
)
from ._editor import Editor, check_range, lines_of
from ._results import (
    MARKER_ROOM,
    Grade,
    ModelError,
    Tests,
    ToolResult,
    clip,
    decode,
    execution_text,
    output,
)

__all__ = ("TOOLS", "TOOL_NAMES", "Tool", "Toolbox")

_OPT_IN = frozenset({"execute_bash", "python"})


# execute_bash: the state of one call is saved for the next (open-instruct's wrapper keeps
# it in /tmp too). $1 is the command.
_STATEFUL_BASH = r"""
__state=/tmp/.asyncsandbox-execute-bash
if [ -f "$__state.env" ]; then set -a; . "$__state.env" 2>/dev/null; set +a; fi
if [ -f "$__state.cwd" ]; then cd -- "$(cat "$__state.cwd")" 2>/dev/null || true; fi
eval "$1"
__status=$?
export -p > "$__state.env" 2>/dev/null
pwd > "$__state.cwd" 2>/dev/null
exit $__status
"""

_FILE_HINTS = {
    FileErrorReason.IS_A_DIRECTORY: " (list it with str_replace_editor `view`, or bash `ls`)",
    FileErrorReason.TOO_LARGE: " (read parts of it with bash, e.g. `sed -n '1,200p' FILE`)",
}


def _positive(name: str, value: object) -> float:
    seconds = check.seconds(name, value, allow_none=False)
    if not seconds:
        raise InvalidArgument(f"{name} must be > 0")
    return seconds


def _check_tests(
    tests: object,
) -> tuple[str, ...] | Callable[[Sandbox], Awaitable[float | Grade]] | None:
    if tests is None or callable(tests):
        return tests
    return check.argv(("sh", "-c", tests) if isinstance(tests, str) else tests)


@final
class Toolbox:
    """Agent tools bound to one :class:`~asyncsandbox.Sandbox` (see the module docstring).

    :param sandbox: where the tools act. The toolbox never starts or stops it (a sandbox
        starts on first use).
    :param tools: the tools to offer, a subset of :data:`TOOL_NAMES`. Default: all, with
        ``submit`` only when ``tests`` is given.
    :param tests: what ``submit`` runs: a shell command (``str``), an argv (exit status 0
        means reward 1.0, else 0.0), or ``async (sandbox) -> float`` returning the reward.
    :param test_timeout: the test command's own timeout (``None``: none); a timeout scores 0.0.
    :param bash_timeout: default ``timeout`` of ``bash``, in seconds.
    :param max_bash_timeout: the most ``bash`` may ask for (larger requests are lowered).
    :param python_timeout: default ``timeout`` of ``python``, in seconds.
    :param max_python_timeout: the most ``python`` may ask for.
    :param max_observation_chars: observations longer than this keep their head and tail.
    :param max_file_bytes: files larger than this are not read (a ``too_large`` error).

    Calls may run concurrently. After a ``submit``, every call returns ``done`` and changes
    nothing: the episode is over.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        tools: Iterable[str] | None = None,
        tests: Tests | None = None,
        test_timeout: float | None = 600.0,
        bash_timeout: float = 30.0,
        max_bash_timeout: float = 600.0,
        python_timeout: float = 30.0,
        max_python_timeout: float = 600.0,
        max_observation_chars: int = 10_000,
        max_file_bytes: int = 1024 * 1024,
    ) -> None:
        if not isinstance(sandbox, Sandbox):
            raise InvalidArgument(f"sandbox must be an asyncsandbox.Sandbox, got {sandbox!r}")
        self.sandbox = sandbox
        """The sandbox the tools act in."""
        self._tests = _check_tests(tests)
        if tools is None:
            names = tuple(
                n for n in TOOL_NAMES if n not in _OPT_IN and (n != "submit" or tests is not None)
            )
        elif isinstance(tools, str):
            raise InvalidArgument("tools must be a sequence of tool names, not a single string")
        else:
            names = tuple(tools)
        for name in names:
            if name not in TOOLS:
                raise InvalidArgument(f"unknown tool {name!r}; known: {', '.join(TOOL_NAMES)}")
        if len(set(names)) != len(names):
            raise InvalidArgument(f"tools has duplicates: {names}")
        if "submit" in names and self._tests is None:
            raise InvalidArgument("the submit tool needs tests= (a command or an async callable)")
        self.names = names
        """The tools offered, in order."""
        self._test_timeout = check.seconds("test_timeout", test_timeout)
        self._bash_timeout = _positive("bash_timeout", bash_timeout)
        self._max_bash_timeout = _positive("max_bash_timeout", max_bash_timeout)
        if self._bash_timeout > self._max_bash_timeout:
            raise InvalidArgument("bash_timeout must not exceed max_bash_timeout")
        self._python_timeout = _positive("python_timeout", python_timeout)
        self._max_python_timeout = _positive("max_python_timeout", max_python_timeout)
        if self._python_timeout > self._max_python_timeout:
            raise InvalidArgument("python_timeout must not exceed max_python_timeout")
        self._max_chars = check.positive_int("max_observation_chars", max_observation_chars)
        if self._max_chars < 4 * MARKER_ROOM:
            raise InvalidArgument(f"max_observation_chars must be >= {4 * MARKER_ROOM}")
        # Keep 4 bytes per character of each stream: then whatever the sandbox drops from an
        # output's middle always falls inside the part clip() drops (see _clip).
        self._output_bytes = 4 * self._max_chars
        self._max_file_bytes = check.positive_int("max_file_bytes", max_file_bytes)
        self._editor = Editor(
            sandbox,
            max_file_bytes=self._max_file_bytes,
            list_timeout=self._max_bash_timeout,
            output_bytes=self._output_bytes,
        )
        self._schemas = [self._schema(name) for name in names]
        self._submitted = False
        self._reward: float | None = None
        self._log = get_logger()

    @property
    def done(self) -> bool:
        """True once ``submit`` was called: the episode is over."""
        return self._submitted

    @property
    def reward(self) -> float | None:
        """The reward of the submission; ``None`` before it, or if the tests could not run."""
        return self._reward

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI tool definitions of the offered tools (``tools=`` of a chat
        completion): ``{"type": "function", "function": {"name", "description",
        "parameters"}}`` with a JSON schema of the arguments. A fresh copy each time."""
        return copy.deepcopy(self._schemas)

    def _schema(self, name: str) -> dict[str, Any]:
        tool = TOOLS[name]
        params = parameters(tool.arguments)
        if name in ("bash", "execute_bash"):
            params["properties"]["timeout"]["description"] = (
                f"Seconds before the command is killed (default {self._bash_timeout:g}, "
                f"at most {self._max_bash_timeout:g})."
            )
        elif name == "python":
            params["properties"]["timeout"]["description"] = (
                f"Seconds before the code is interrupted (default {self._python_timeout:g}, "
                f"at most {self._max_python_timeout:g})."
            )
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description.format(workdir=self.sandbox.config.workdir),
                "parameters": params,
            },
        }

    async def call(
        self, name: str, arguments: str | bytes | Mapping[str, Any] | None = None
    ) -> ToolResult:
        """Run the tool ``name`` with ``arguments`` (the JSON string the model produced, or
        a dict) and return its :class:`ToolResult`. Never raises for a failure: see the
        module docstring for how each becomes an observation.

        Cancellation: propagates (never turned into a result); a running command is killed
        before it does (as :meth:`Sandbox.exec <asyncsandbox.Sandbox.exec>` guarantees).
        """
        label = str(name)  # the model may send anything; never let that raise
        try:
            if self._submitted:
                raise ModelError("the task was already submitted; the episode is over")
            if name not in self.names:
                raise ModelError(f"unknown tool {name!r}; the tools are: {', '.join(self.names)}")
            args = parse(name, arguments, TOOLS[name].arguments)
            return await TOOLS[name].run(self, args)
        except ModelError as exc:
            return self._result(label, f"Error: {exc}", is_error=True)
        except Exception as exc:  # noqa: BLE001 - every failure is an observation; cancellation is a BaseException and propagates
            return self._failure(label, exc)

    def _failure(self, name: str, exc: Exception) -> ToolResult:
        if isinstance(exc, SandboxFileError):
            hint = _FILE_HINTS.get(exc.reason, "")
            return self._result(name, f"Error: {exc}{hint}", is_error=True)
        if isinstance(exc, InvalidArgument | CommandError):
            return self._result(name, f"Error: {exc}", is_error=True)
        if isinstance(exc, SandboxError):
            self._log.warning(
                "tools.call.infrastructure_error",
                tool=name,
                sandbox_id=self.sandbox.id,
                error=repr(exc),
            )
            text = f"Error: the sandbox is unavailable ({exc}). This is an infrastructure failure."
        else:
            self._log.error(
                "tools.call.internal_error", tool=name, sandbox_id=self.sandbox.id, exc_info=exc
            )
            text = f"Error: the tool failed internally ({type(exc).__name__}: {exc})."
        return self._result(name, text, is_error=True, infrastructure_error=True)

    def _result(self, name: str, text: str, *, dropped: int = 0, **flags: Any) -> ToolResult:
        # Every result after a submit says so, whatever the tool: the episode is over.
        return ToolResult(
            name=name,
            observation=clip(text, self._max_chars, dropped),
            done=self._submitted,
            **flags,
        )

    def _exec_result(self, name: str, status: str, result: ExecResult, **flags: Any) -> ToolResult:
        dropped = (result.stdout_size - len(result.stdout)) + (
            result.stderr_size - len(result.stderr)
        )
        return self._result(name, f"{status}\n{output(result)}", dropped=dropped, **flags)

    # -- the tools ------------------------------------------------------------------------

    async def _bash(self, args: Bash) -> ToolResult:
        asked = self._bash_timeout if isinstance(args.timeout, UnsetType) else args.timeout
        timeout = min(asked, self._max_bash_timeout)
        try:
            result = await self.sandbox.exec(
                ["sh", "-c", args.command], timeout=timeout, max_output_bytes=self._output_bytes
            )
        except ExecTimeout as exc:
            status = f"timed out after {timeout:g}s (the command was killed); output so far:"
            return self._exec_result("bash", status, exc.result, is_error=True)
        status = f"exit={result.returncode}"
        if result.oom_killed:
            status += " (killed: out of memory)"
        elif result.signal is not None:
            status += f" (killed by signal {result.signal})"
        return self._exec_result("bash", status, result, is_error=result.returncode != 0)

    async def _execute_bash(self, args: Bash) -> ToolResult:
        asked = self._bash_timeout if isinstance(args.timeout, UnsetType) else args.timeout
        timeout = min(asked, self._max_bash_timeout)
        argv = ["bash", "-c", _STATEFUL_BASH, "execute_bash", args.command]
        try:
            result = await self.sandbox.exec(
                argv, timeout=timeout, max_output_bytes=self._output_bytes
            )
        except ExecTimeout as exc:
            status = f"timed out after {timeout:g}s (the command was killed); output so far"
            return self._open_instruct_result("execute_bash", status, exc.result, is_error=True)
        return self._open_instruct_result(
            "execute_bash", str(result.returncode), result, is_error=result.returncode != 0
        )

    async def _python(self, args: Python) -> ToolResult:
        asked = self._python_timeout if isinstance(args.timeout, UnsetType) else args.timeout
        timeout = min(asked, self._max_python_timeout)
        status = ""
        try:
            execution = await self.sandbox.run_code(
                args.code, timeout=timeout, max_output_bytes=self._output_bytes
            )
        except ExecTimeout as exc:
            if exc.execution is None:  # not the code's own: cannot be
                raise
            execution = exc.execution
            status = (
                f"timed out after {timeout:g}s (interrupted: the interpreter keeps its state); "
                "output so far:\n"
                if not execution.restarted
                else f"timed out after {timeout:g}s and did not stop when interrupted: the "
                "interpreter was restarted; output so far:\n"
            )
        text, images = execution_text(execution)
        return self._result(
            "python",
            status + text,
            is_error=bool(status) or execution.error is not None,
            images=images,
        )

    def _open_instruct_result(
        self, name: str, status: str, result: ExecResult, **flags: Any
    ) -> ToolResult:
        dropped = (result.stdout_size - len(result.stdout)) + (
            result.stderr_size - len(result.stderr)
        )
        text = (
            f"Exit code: {status}\nExecution output of [{name}]:\n"
            f"[STDOUT]\n{result.stdout_text}\n[STDERR]\n{result.stderr_text}"
        )
        return self._result(name, text, dropped=dropped, **flags)

    async def _read_file(self, args: ReadFile) -> ToolResult:
        text = decode(await self.sandbox.read_file(args.path, max_bytes=self._max_file_bytes))
        whole = isinstance(args.start_line, UnsetType) and isinstance(args.end_line, UnsetType)
        if whole or not text:
            return self._result("read_file", text or "(empty file)")
        lines = lines_of(text)
        first = 1 if isinstance(args.start_line, UnsetType) else args.start_line
        last = len(lines) if isinstance(args.end_line, UnsetType) else args.end_line
        check_range(args.path, lines, first, last)
        return self._result("read_file", "\n".join(lines[first - 1 : last]))

    async def _write_file(self, args: WriteFile) -> ToolResult:
        size = await self._editor.write(args.path, args.content)
        return self._result("write_file", f"Wrote {size} bytes to {args.path}.")

    async def _str_replace_editor(self, args: EditorArgs) -> ToolResult:
        return self._result("str_replace_editor", await self._editor.run(args))

    async def _submit(self, args: Submit) -> ToolResult:
        self._submitted = True  # before any await: a second submit must not grade again
        tests = self._tests
        if callable(tests):
            value: object = await tests(self.sandbox)
            observation: str | None = None
            if isinstance(value, Grade):
                observation = value.observation
                value = value.reward
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise TypeError(f"the tests callable returned {value!r}, not a number")
            self._reward = float(value)
            if observation is None:
                observation = f"Submitted: reward={self._reward}."
            return self._result("submit", observation, reward=self._reward)
        assert tests is not None
        try:
            result = await self.sandbox.exec(
                tests, timeout=self._test_timeout, max_output_bytes=self._output_bytes
            )
        except ExecTimeout as exc:
            self._reward = 0.0
            status = f"Submitted: the tests timed out after {self._test_timeout:g}s; reward=0.0."
            result = exc.result
        else:
            self._reward = 1.0 if result.returncode == 0 else 0.0
            verdict = "passed" if result.returncode == 0 else "failed"
            status = (
                f"Submitted: the tests {verdict} (exit={result.returncode}); reward={self._reward}."
            )
        return self._exec_result("submit", status, result, reward=self._reward)


class Tool(NamedTuple):
    """One tool of the registry."""

    arguments: type[Args]
    """Its arguments (their JSON schema is the tool's ``parameters``)."""
    description: str
    """What the model is told it does (``{workdir}``: the sandbox's working directory)."""
    run: Callable[[Toolbox, Any], Awaitable[ToolResult]]
    """Its handler: the toolbox's, given the arguments once they are valid."""


TOOLS: dict[str, Tool] = {
    "bash": Tool(
        Bash,
        (
            "Run a shell command (`sh -c`) in the sandbox and return its exit status and output. "
            "Commands start in {workdir}; files persist between calls, but shell state (the "
            "current directory, variables) does not. There is no network."
        ),
        Toolbox._bash,
    ),
    "execute_bash": Tool(
        Bash,
        (
            "Execute a bash command in the terminal, in {workdir} at first. The working "
            "directory and exported variables persist between calls.\n"
            "* Long running commands: wrap them with `timeout`, e.g. `timeout 10 <command>`.\n"
            "* Interactive commands are not possible: use `yes`, `-y` flags and the like.\n"
            "* Output may be truncated: filter it with `head`, `tail` or `grep`.\n"
            "There is no network."
        ),
        Toolbox._execute_bash,
    ),
    "python": Tool(
        Python,
        (
            "Run Python code in a persistent interpreter (like a notebook cell) in the "
            "sandbox, starting in {workdir}: variables, imports and the working directory "
            "persist between calls. Shows stdout, stderr, the value of the last expression "
            "and the traceback of an exception; figures (matplotlib) and images come back "
            "as images. There is no network."
        ),
        Toolbox._python,
    ),
    "read_file": Tool(
        ReadFile,
        "Read a text file, whole or lines `start_line` to `end_line`.",
        Toolbox._read_file,
    ),
    "write_file": Tool(
        WriteFile,
        "Create a file, or replace its whole content. Parent directories are created.",
        Toolbox._write_file,
    ),
    "str_replace_editor": Tool(
        EditorArgs,
        (
            "View, create and edit files.\n"
            "* `view`: a file with line numbers (`view_range` limits the lines), or the contents "
            "of a directory, two levels deep.\n"
            "* `create`: a new file with `file_text` (fails if the path exists).\n"
            "* `str_replace`: replace `old_str` with `new_str`. `old_str` must match exactly one "
            "place in the file, whitespace included; add surrounding lines to make it unique.\n"
            "* `insert`: insert `new_str` after line `insert_line` (0: at the top)."
        ),
        Toolbox._str_replace_editor,
    ),
    "submit": Tool(
        Submit,
        "Submit your work: run the task's tests and end the episode. Call it once, when done.",
        Toolbox._submit,
    ),
}
"""Every tool, by name, in the order its schemas list them."""

TOOL_NAMES = tuple(TOOLS)
"""Every tool a :class:`Toolbox` knows, in the order its schemas list them. Offered by
default: all but ``execute_bash`` and ``python`` (and ``submit`` without ``tests``)."""
