"""Agent tools for multi-step rollouts in one persistent sandbox: OpenAI-compatible tool
schemas, and a dispatcher that turns every failure into an observation the model can read::

    async with session.sandbox() as sandbox:
        toolbox = Toolbox(sandbox, tests="python3 -m pytest -q tests")
        messages, masked = [{"role": "user", "content": task}], False
        while not toolbox.done:
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=toolbox.schemas()
            )
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = await toolbox.call(call.function.name, call.function.arguments)
                messages.append(result.message(call.id))
                masked = masked or result.infrastructure_error
        reward = toolbox.reward  # None: never submitted (or the tests could not run)

The tools (``Toolbox(..., tools=[...])`` selects a subset):

``bash``
    ``command`` runs as ``["sh", "-c", command]`` in the sandbox's workdir; files persist
    between calls, shell state (``cd``, variables) does not. ``timeout`` in seconds, with a
    default and a maximum (``bash_timeout``, ``max_bash_timeout``).
``execute_bash``
    open-instruct's bash tool (its SWE-RL environment), offered only when asked for
    (``tools=[...]``): ``command`` runs in ``bash``, and the working directory and exported
    variables persist from one call to the next. Its observation is open-instruct's::

        Exit code: 0
        Execution output of [execute_bash]:
        [STDOUT]
        ...
        [STDERR]
        ...
``python``
    offered only when asked for (``tools=[...]``): ``code`` runs in the sandbox's stateful
    Python interpreter (:meth:`Sandbox.run_code <asyncsandbox.Sandbox.run_code>`, its
    default context): variables, imports and the working directory persist from one call to
    the next, the value of the last expression is shown, and images the code displays
    (matplotlib figures, ``_repr_png_``) come back as :attr:`ToolResult.images`. ``timeout``
    in seconds (``python_timeout``, ``max_python_timeout``): past it the code is
    interrupted and the interpreter keeps its state.
``read_file``
    ``path``, optionally ``start_line``/``end_line`` (1-based, inclusive): the text.
``write_file``
    ``path``, ``content``: create or replace a file (parent directories are created).
``str_replace_editor``
    ``command`` is ``view`` (a file with line numbers, optionally ``view_range``, or a
    directory listing two levels deep), ``create`` (a new file, ``file_text``),
    ``str_replace`` (``old_str`` must occur exactly once; it becomes ``new_str``) or
    ``insert`` (``new_str`` after line ``insert_line``; 0 is the top).
``submit``
    Runs the task's tests and ends the episode (``done``) with a ``reward``. Available when
    the environment says what the tests are (``tests=``): a command (exit status 0 means
    reward 1.0, anything else 0.0, a timeout 0.0) or an ``async (sandbox) -> float``, which
    may return a :class:`Grade` instead, to say what the observation shows.

Observations (:attr:`ToolResult.observation`):

* ``bash``: a status line, then stdout, then ``[stderr]`` and stderr when there is any::

      exit=1
      partial output
      [stderr]
      Traceback (most recent call last): ...

  The status line is ``exit=<code>``, with ``(killed by signal N)`` or ``(killed: out of
  memory)`` when that happened, or ``timed out after <T>s (the command was killed); output
  so far:`` followed by the partial output.
* ``python``: stdout, then ``[stderr]`` and stderr, then each displayed value as
  ``Out: <text>`` (an image as ``[image N: image/png, shown as an image]``), then the
  traceback of an exception; ``(no output)`` for none. A timeout starts it with
  ``timed out after <T>s (interrupted: the interpreter keeps its state); output so far:``,
  and an interpreter that had to be restarted ends it with a note that its state is gone.
* Failures read ``Error: <what happened>`` with a hint where one helps.
* Output is decoded as UTF-8 with replacement (never an exception). An observation longer
  than ``max_observation_chars`` keeps its head and tail around a
  ``[... N characters truncated ...]`` marker.

Failures are results, never exceptions: invalid JSON, missing or wrong-typed arguments,
unknown tools, missing files, directories, files too large, ambiguous edits, timeouts and
non-zero exits are the model's doing (``is_error``); a dead sandbox, an unreachable backend
or any other :class:`~asyncsandbox.InfrastructureError`, a sandbox stopped under the tools,
and a failing ``tests`` callable are not (``infrastructure_error`` too, so a trainer can
mask the episode instead of scoring it; they are also logged). Only cancellation
propagates.
"""

from __future__ import annotations

import base64
import copy
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, final

import msgspec
from msgspec import UNSET, Meta, UnsetType

from . import _validate as check
from ._errors import (
    CommandError,
    ExecTimeout,
    FileErrorReason,
    InvalidArgument,
    SandboxError,
    SandboxFileError,
)
from ._interpreter._models import Execution
from ._log import get_logger
from ._models import ExecResult
from ._sandbox import Sandbox

__all__ = ("Toolbox", "ToolResult", "ToolImage", "Grade", "TOOL_NAMES", "Tests")

TOOL_NAMES = (
    "bash",
    "execute_bash",
    "python",
    "read_file",
    "write_file",
    "str_replace_editor",
    "submit",
)
"""Every tool a :class:`Toolbox` knows, in the order its schemas list them. Offered by
default: all but ``execute_bash`` and ``python`` (and ``submit`` without ``tests``)."""
_OPT_IN = frozenset({"execute_bash", "python"})
_IMAGE_TYPES = (("png", "image/png"), ("jpeg", "image/jpeg"))


class Grade(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``tests`` callable may return instead of a number: the reward, and the
    observation ``submit`` shows the model (e.g. the tests' exit code and output)."""

    reward: float
    observation: str


Tests = str | Sequence[str] | Callable[[Sandbox], Awaitable[float | Grade]]
"""What ``submit`` runs: a shell command (``str``), an argv, or ``async (sandbox) -> float``
(or a :class:`Grade`)."""

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

_MARKER = "\n[... {} characters truncated ...]\n"
_MARKER_ROOM = 64  # more than the marker ever takes


class ToolImage(msgspec.Struct, frozen=True, kw_only=True):
    """An image a tool call produced (``python``: a figure, an object's ``_repr_png_``)."""

    mime_type: str
    """``image/png`` or ``image/jpeg``."""
    data: bytes

    @property
    def base64(self) -> str:
        """``data`` in base64 (what Anthropic's and MCP's image content carry)."""
        return base64.b64encode(self.data).decode("ascii")

    @property
    def data_url(self) -> str:
        """``data:<mime>;base64,...``: an OpenAI ``image_url``."""
        return f"data:{self.mime_type};base64,{self.base64}"


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one tool call."""

    name: str
    """The tool that was called (as the model named it)."""
    observation: str
    """What to show the model (bounded by ``max_observation_chars``)."""
    is_error: bool = False
    """The call failed or the command exited non-zero (an invalid call, a missing file...)."""
    infrastructure_error: bool = False
    """The failure is not the model's fault (the sandbox died, the backend is unreachable):
    mask the episode instead of scoring it."""
    reward: float | None = None
    """``submit`` only: the reward of the submission."""
    done: bool = False
    """The episode is over (the task was submitted)."""
    images: tuple[ToolImage, ...] = ()
    """Images the call produced (``python``), in the order the observation names them."""

    def message(self, tool_call_id: str) -> dict[str, str]:
        """The OpenAI chat message answering the tool call ``tool_call_id`` (its text:
        OpenAI's tool messages take no images, see :meth:`messages`)."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.observation}

    def messages(self, tool_call_id: str) -> list[dict[str, Any]]:
        """The OpenAI chat messages answering the tool call: :meth:`message`, then, if the
        call produced images, a user message showing them (``image_url`` parts with data
        URLs), which is how a chat model gets to see a tool's images."""
        answer: list[dict[str, Any]] = [dict(self.message(tool_call_id))]
        if self.images:
            parts: list[dict[str, Any]] = [
                {"type": "text", "text": f"The images of tool call {tool_call_id}:"}
            ]
            parts += [
                {"type": "image_url", "image_url": {"url": image.data_url}} for image in self.images
            ]
            answer.append({"role": "user", "content": parts})
        return answer


# -- arguments: one Struct per tool validates them, and its JSON schema is the tool's ---------


class _Args(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class _Bash(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    command: Annotated[str, Meta(description="The shell command, e.g. `ls -la src`.")]
    timeout: (
        Annotated[float, Meta(gt=0, description="Seconds before it is killed.")] | UnsetType
    ) = UNSET


class _Python(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    code: Annotated[str, Meta(description="Python code; the last expression's value is shown.")]
    timeout: (
        Annotated[float, Meta(gt=0, description="Seconds before it is interrupted.")] | UnsetType
    ) = UNSET


_Path = Annotated[str, Meta(description="Path of the file; relative to the working directory.")]


class _ReadFile(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: _Path
    start_line: Annotated[int, Meta(ge=1, description="First line to read (1-based).")] | (
        UnsetType
    ) = UNSET
    end_line: Annotated[int, Meta(ge=1, description="Last line to read (inclusive).")] | (
        UnsetType
    ) = UNSET


class _WriteFile(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: _Path
    content: Annotated[str, Meta(description="The complete new content of the file.")]


class _Editor(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    command: Annotated[
        Literal["view", "create", "str_replace", "insert"], Meta(description="What to do.")
    ]
    path: Annotated[str, Meta(description="Path of the file or directory.")]
    file_text: Annotated[str, Meta(description="`create`: content of the new file.")] | (
        UnsetType
    ) = UNSET
    old_str: (
        Annotated[
            str, Meta(description="`str_replace`: the exact text to replace; it must occur once.")
        ]
        | UnsetType
    ) = UNSET
    new_str: (
        Annotated[
            str, Meta(description="`str_replace`: the replacement. `insert`: the text to insert.")
        ]
        | UnsetType
    ) = UNSET
    insert_line: (
        Annotated[int, Meta(ge=0, description="`insert`: insert after this line (0: at the top).")]
        | UnsetType
    ) = UNSET
    view_range: (
        Annotated[
            list[int],
            Meta(
                min_length=2,
                max_length=2,
                description="`view`: [first, last] line to show, 1-based; last -1: to the end.",
            ),
        ]
        | UnsetType
    ) = UNSET


class _Submit(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


_SPECS: dict[str, tuple[type[_Args], str]] = {
    "bash": (
        _Bash,
        (
            "Run a shell command (`sh -c`) in the sandbox and return its exit status and output. "
            "Commands start in {workdir}; files persist between calls, but shell state (the "
            "current directory, variables) does not. There is no network."
        ),
    ),
    "execute_bash": (
        _Bash,
        (
            "Execute a bash command in the terminal, in {workdir} at first. The working "
            "directory and exported variables persist between calls.\n"
            "* Long running commands: wrap them with `timeout`, e.g. `timeout 10 <command>`.\n"
            "* Interactive commands are not possible: use `yes`, `-y` flags and the like.\n"
            "* Output may be truncated: filter it with `head`, `tail` or `grep`.\n"
            "There is no network."
        ),
    ),
    "python": (
        _Python,
        (
            "Run Python code in a persistent interpreter (like a notebook cell) in the "
            "sandbox, starting in {workdir}: variables, imports and the working directory "
            "persist between calls. Shows stdout, stderr, the value of the last expression "
            "and the traceback of an exception; figures (matplotlib) and images come back "
            "as images. There is no network."
        ),
    ),
    "read_file": (
        _ReadFile,
        "Read a text file, whole or lines `start_line` to `end_line`.",
    ),
    "write_file": (
        _WriteFile,
        "Create a file, or replace its whole content. Parent directories are created.",
    ),
    "str_replace_editor": (
        _Editor,
        (
            "View, create and edit files.\n"
            "* `view`: a file with line numbers (`view_range` limits the lines), or the contents "
            "of a directory, two levels deep.\n"
            "* `create`: a new file with `file_text` (fails if the path exists).\n"
            "* `str_replace`: replace `old_str` with `new_str`. `old_str` must match exactly one "
            "place in the file, whitespace included; add surrounding lines to make it unique.\n"
            "* `insert`: insert `new_str` after line `insert_line` (0: at the top)."
        ),
    ),
    "submit": (
        _Submit,
        "Submit your work: run the task's tests and end the episode. Call it once, when done.",
    ),
}


def _parameters(kind: type[_Args]) -> dict[str, Any]:
    schema = msgspec.json.schema(kind)
    params: dict[str, Any] = schema["$defs"][kind.__name__]
    params.pop("title", None)
    params.setdefault("properties", {})
    params.setdefault("required", [])
    params["additionalProperties"] = False
    for prop in params["properties"].values():
        if "enum" in prop:
            prop.setdefault("type", "string")  # msgspec omits it; some model APIs want it
    return params


# -- the toolbox ----------------------------------------------------------------------------


class _ModelError(Exception):
    """A failure caused by the call itself; its message is the observation."""


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
            if name not in _SPECS:
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
        if self._max_chars < 4 * _MARKER_ROOM:
            raise InvalidArgument(f"max_observation_chars must be >= {4 * _MARKER_ROOM}")
        # Keep 4 bytes per character of each stream: then whatever the sandbox drops from an
        # output's middle always falls inside the part _clip() drops (see _clip).
        self._output_bytes = 4 * self._max_chars
        self._max_file_bytes = check.positive_int("max_file_bytes", max_file_bytes)
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
        kind, description = _SPECS[name]
        params = _parameters(kind)
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
                "description": description.format(workdir=self.sandbox.config.workdir),
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
                raise _ModelError("the task was already submitted; the episode is over")
            if name not in self.names:
                raise _ModelError(f"unknown tool {name!r}; the tools are: {', '.join(self.names)}")
            args = _parse(name, arguments, _SPECS[name][0])
            handler: Callable[[Any], Awaitable[ToolResult]] = getattr(self, f"_{name}")
            return await handler(args)
        except _ModelError as exc:
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
            observation=_clip(text, self._max_chars, dropped),
            done=self._submitted,
            **flags,
        )

    def _exec_result(self, name: str, status: str, result: ExecResult, **flags: Any) -> ToolResult:
        dropped = (result.stdout_size - len(result.stdout)) + (
            result.stderr_size - len(result.stderr)
        )
        return self._result(name, f"{status}\n{_output(result)}", dropped=dropped, **flags)

    # -- the tools ------------------------------------------------------------------------

    async def _bash(self, args: _Bash) -> ToolResult:
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

    async def _execute_bash(self, args: _Bash) -> ToolResult:
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

    async def _python(self, args: _Python) -> ToolResult:
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
        text, images = _execution_text(execution)
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

    async def _read_file(self, args: _ReadFile) -> ToolResult:
        text = _decode(await self.sandbox.read_file(args.path, max_bytes=self._max_file_bytes))
        whole = isinstance(args.start_line, UnsetType) and isinstance(args.end_line, UnsetType)
        if whole or not text:
            return self._result("read_file", text or "(empty file)")
        lines = _lines(text)
        first = 1 if isinstance(args.start_line, UnsetType) else args.start_line
        last = len(lines) if isinstance(args.end_line, UnsetType) else args.end_line
        _check_range(args.path, lines, first, last)
        return self._result("read_file", "\n".join(lines[first - 1 : last]))

    async def _write_file(self, args: _WriteFile) -> ToolResult:
        size = await self._write(args.path, args.content)
        return self._result("write_file", f"Wrote {size} bytes to {args.path}.")

    async def _str_replace_editor(self, args: _Editor) -> ToolResult:
        edit = {
            "view": self._view,
            "create": self._create,
            "str_replace": self._str_replace,
            "insert": self._insert,
        }[args.command]
        return self._result("str_replace_editor", await edit(args))

    async def _view(self, args: _Editor) -> str:
        try:
            text = await self._read_text(args.path, strict=False)
        except SandboxFileError as exc:
            if exc.reason is not FileErrorReason.IS_A_DIRECTORY:
                raise
            return await self._list_directory(args.path)
        lines = _lines(text)
        if not lines:
            return "(empty file)"
        first, last = 1, len(lines)
        if not isinstance(args.view_range, UnsetType):
            first, last = args.view_range
            last = len(lines) if last == -1 else last
            _check_range(args.path, lines, first, last)
        return _numbered(lines, first, last)

    async def _list_directory(self, path: str) -> str:
        result = await self.sandbox.exec(
            ["find", path, "-maxdepth", "2", "-not", "-path", "*/.*"],
            timeout=self._max_bash_timeout,
            max_output_bytes=self._output_bytes,
        )
        if result.returncode != 0:
            raise _ModelError(f"cannot list {path}: {result.stderr_text.strip()}")
        entries = "\n".join(sorted(result.stdout_text.splitlines()))
        return f"{path} contains (two levels deep, hidden entries excluded):\n{entries}"

    async def _create(self, args: _Editor) -> str:
        if isinstance(args.file_text, UnsetType):
            raise _ModelError("`create` needs `file_text`, the content of the new file")
        try:
            await self.sandbox.read_file(args.path, max_bytes=1)
        except SandboxFileError as exc:
            if exc.reason is not FileErrorReason.NOT_FOUND:
                if exc.reason is not FileErrorReason.TOO_LARGE:  # too large: it exists
                    raise
            else:
                await self.sandbox.write_file(args.path, args.file_text)
                return f"Created {args.path}."
        raise _ModelError(
            f"{args.path} already exists; `create` makes new files only. Edit it with "
            "`str_replace` or `insert`, or replace it with write_file."
        )

    async def _str_replace(self, args: _Editor) -> str:
        old = "" if isinstance(args.old_str, UnsetType) else args.old_str
        if not old:
            raise _ModelError("`str_replace` needs a non-empty `old_str`")
        new = "" if isinstance(args.new_str, UnsetType) else args.new_str
        text = await self._read_text(args.path, strict=True)
        found = _occurrences(text, old)
        if not found:
            raise _ModelError(
                f"`old_str` was not found in {args.path}; nothing was replaced. It must match "
                "the file exactly, whitespace and indentation included (view the file)."
            )
        if len(found) > 1:
            lines = ", ".join(str(text.count("\n", 0, i) + 1) for i in found)
            raise _ModelError(
                f"`old_str` occurs {len(found)} times in {args.path} (starting on lines "
                f"{lines}); nothing was replaced. Include more surrounding lines to make it "
                "unique."
            )
        at = found[0]
        updated = text[:at] + new + text[at + len(old) :]
        await self._write(args.path, updated)
        first = text.count("\n", 0, at) + 1
        return _edited(args.path, updated, first, first + new.count("\n"))

    async def _insert(self, args: _Editor) -> str:
        if isinstance(args.insert_line, UnsetType) or isinstance(args.new_str, UnsetType):
            raise _ModelError("`insert` needs `insert_line` and `new_str`")
        text = await self._read_text(args.path, strict=True)
        lines = _lines(text)
        after = args.insert_line
        if after > len(lines):
            raise _ModelError(
                f"insert_line {after} is past the end of {args.path}, which has {len(lines)} "
                f"lines (use 0 to {len(lines)})"
            )
        added = _lines(args.new_str) or [""]
        updated_lines = lines[:after] + added + lines[after:]
        keep_final_newline = text.endswith("\n") or not text
        updated = "\n".join(updated_lines) + ("\n" if keep_final_newline else "")
        await self._write(args.path, updated)
        return _edited(args.path, updated, after + 1, after + len(added))

    async def _submit(self, args: _Submit) -> ToolResult:
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

    # -- helpers that touch the sandbox ---------------------------------------------------

    async def _read_text(self, path: str, *, strict: bool) -> str:
        data = await self.sandbox.read_file(path, max_bytes=self._max_file_bytes)
        if not strict:
            return _decode(data)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            # Editing a decoded-with-replacement copy would corrupt the file.
            raise _ModelError(f"{path} is not UTF-8 text; edit it with bash instead") from None

    async def _write(self, path: str, text: str) -> int:
        """Write ``text``, keeping the permission bits of a file that exists."""
        data = text.encode()
        mode = await self._mode(path)
        await self.sandbox.write_file(path, data, mode=0o644 if mode is None else mode)
        return len(data)

    async def _mode(self, path: str) -> int | None:
        # The file API sets the mode it is given; without this, editing a script would
        # silently make it non-executable. Any failure here means: a new file.
        try:
            result = await self.sandbox.exec(["stat", "-L", "-c", "%a", "--", path], timeout=30)
            return int(result.stdout_text.strip(), 8) if result.returncode == 0 else None
        except (ValueError, InvalidArgument, ExecTimeout):
            return None


# -- pure helpers ---------------------------------------------------------------------------

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


def _parse(name: str, arguments: object, kind: type[_Args]) -> _Args:
    raw: object
    if arguments is None:
        raw = {}
    elif isinstance(arguments, str | bytes | bytearray):
        if not arguments.strip():
            raw = {}  # some models send "" for a tool without arguments
        else:
            try:
                raw = msgspec.json.decode(arguments)
            except msgspec.DecodeError as exc:
                raise _ModelError(f"the arguments of {name} are not valid JSON ({exc})") from None
    elif isinstance(arguments, Mapping):
        raw = dict(arguments)
    else:
        raise _ModelError(f"the arguments of {name} must be a JSON object")
    if not isinstance(raw, dict):
        raise _ModelError(
            f"the arguments of {name} must be a JSON object, not {type(raw).__name__}"
        )
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise _ModelError(f"invalid arguments for {name}: {exc}") from None


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _execution_text(execution: Execution) -> tuple[str, tuple[ToolImage, ...]]:
    """What a ``python`` call shows the model (see the module docstring), and its images."""
    parts: list[str] = []
    out, err = "".join(execution.logs.stdout), "".join(execution.logs.stderr)
    if out:
        parts.append(out if out.endswith("\n") else out + "\n")
    if err:
        parts.append("[stderr]\n" + (err if err.endswith("\n") else err + "\n"))
    images: list[ToolImage] = []
    for result in execution.results:
        image = next(
            (
                ToolImage(mime_type=mime, data=data)
                for field, mime in _IMAGE_TYPES
                if (data := getattr(result, field)) is not None
            ),
            None,
        )
        if image is not None:
            images.append(image)
            shown = f"[image {len(images)}: {image.mime_type}, shown as an image]"
        else:
            shown = result.text if result.text is not None else f"[{', '.join(result.formats())}]"
        parts.append(f"Out: {shown}\n")
    if execution.error is not None:
        error = execution.error
        parts.append(error.traceback or f"{error.name}: {error.value}\n")
    if execution.restarted:
        parts.append(
            "[note: the interpreter was restarted: variables and imports of earlier calls "
            "are gone]\n"
        )
    return "".join(parts) or "(no output)", tuple(images)


def _output(result: ExecResult) -> str:
    out, err = result.stdout_text, result.stderr_text
    if err:
        if out and not out.endswith("\n"):
            out += "\n"
        out += "[stderr]\n" + err
    return out or "(no output)"


def _clip(text: str, limit: int, dropped: int = 0) -> str:
    """At most ``limit`` characters: the head and the tail of ``text`` around a marker.

    ``dropped`` counts what the sandbox already cut from the middle of an output (it keeps
    ``4 * limit`` bytes of each stream, half head and half tail: at least ``limit / 2``
    characters on each side). That seam thus lies inside the part cut here, and the text is
    always longer than ``limit`` when something was dropped.
    """
    if len(text) <= limit:
        return text
    budget = limit - _MARKER_ROOM
    head, tail = budget // 2, budget - budget // 2
    removed = len(text) - head - tail + dropped
    return text[:head] + _MARKER.format(removed) + text[len(text) - tail :]


def _lines(text: str) -> list[str]:
    """Lines as ``sed`` and ``cat -n`` count them (split on ``\\n`` only)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _check_range(path: str, lines: list[str], first: int, last: int) -> None:
    if not 1 <= first <= len(lines):
        raise _ModelError(f"line {first} is out of range: {path} has {len(lines)} lines")
    if last < first:
        raise _ModelError(f"the last line ({last}) is before the first ({first})")


def _numbered(lines: list[str], first: int, last: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines[first - 1 : last], first))


def _edited(path: str, text: str, first: int, last: int, context: int = 4) -> str:
    lines = _lines(text)
    shown = _numbered(lines, max(1, first - context), min(len(lines), last + context))
    return f"Edited {path}. The changed lines, with context:\n{shown}"


def _occurrences(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at != -1:
        found.append(at)
        at = text.find(part, at + len(part))
    return found
