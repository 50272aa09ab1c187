"""What the code interpreter returns: the result types of :meth:`Sandbox.run_code` (named
and shaped after E2B's code interpreter, ``e2b_code_interpreter``, so that its users feel at
home) and the one request that carries a call from the public API down to where it runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

__all__ = (
    "CodeContext",
    "CodeEvent",
    "CodeEventCallback",
    "CodeRequest",
    "Execution",
    "ExecutionError",
    "Logs",
    "OutputMessage",
    "Result",
)

LANGUAGE = "python"
"""The one language contexts speak (``language=None`` means it too)."""
DEFAULT_CONTEXT = "default"
"""The id of the context ``run_code`` uses when given none (created on first use)."""

# MIME types of a display bundle and the Result fields that carry them; binary formats
# travel base64-encoded in a bundle (as in Jupyter's) and are bytes in a Result.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
BINARY_FIELDS = frozenset({"png", "jpeg", "pdf"})


class Result(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Something the code displayed: the value of its last expression (the *main result*,
    as a notebook shows it) or an object passed to ``display()`` (or a matplotlib figure).

    Each format the object offers is one field (``None`` when absent): ``text`` always
    for the main result (its ``repr``, or IPython's pretty text when IPython is there), the
    others from the object's ``_repr_html_``, ``_repr_png_``, ... methods (or IPython's
    formatters). Images are bytes.
    """

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: bytes | None = None
    jpeg: bytes | None = None
    pdf: bytes | None = None
    latex: str | None = None
    json: Any = None
    """A JSON value (``_repr_json_``)."""
    javascript: str | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Formats of other MIME types, by MIME type."""
    is_main_result: bool = False
    """The value of the code's last expression (not a ``display()`` call)."""

    def formats(self) -> list[str]:
        """The names of the formats present (``"text"``, ``"png"``, ..., then the MIME
        types of :attr:`extra`)."""
        present = [
            name for name in MIME_FIELDS.values() if getattr(self, name) not in (None, "", b"")
        ]
        return present + list(self.extra)


class Logs(msgspec.Struct, frozen=True, kw_only=True):
    """What the code printed, in the chunks it arrived in (decoded as UTF-8, never raising):
    ``print`` and ``sys.stdout``/``sys.stderr``, warnings, subprocesses writing to the
    inherited descriptors. Bounded as ``exec``'s output is: past the limit, each stream
    keeps its first and last chunks and says so."""

    stdout: list[str] = msgspec.field(default_factory=list)
    stderr: list[str] = msgspec.field(default_factory=list)
    stdout_truncated: bool = False
    """``stdout`` lost chunks from its middle (the code printed more than the limit)."""
    stderr_truncated: bool = False


class ExecutionError(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An exception the code raised (and did not catch), as data: its type's ``name``, its
    ``value`` (``str(exc)``) and the formatted ``traceback``. Also how a call ends when its
    interpreter died (``name`` ``"InterpreterDied"``) or had to be restarted
    (``"InterpreterRestarted"``)."""

    name: str
    value: str
    traceback: str = ""


class OutputMessage(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A chunk of output as it arrives (streaming: ``on_stdout``/``on_stderr``,
    :meth:`Sandbox.run_code_stream`)."""

    line: str
    """The text (any number of lines, or part of one)."""
    timestamp: int
    """When it arrived, in nanoseconds since the Unix epoch."""
    error: bool = False
    """It came from stderr."""

    def __str__(self) -> str:
        return self.line


CodeEvent = OutputMessage | Result | ExecutionError
"""What a running call yields as it goes (:meth:`Sandbox.run_code_stream`)."""

CodeEventCallback = Callable[[CodeEvent], Awaitable[None]]
"""Receives what a running ``run_code`` call yields as it comes (output chunks, results,
its error), in order, from one task at a time; it may apply backpressure."""


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """What one :meth:`Sandbox.run_code` call did. An exception in the code is data here
    (:attr:`error`), never raised: the context lives on with its state."""

    results: list[Result] = msgspec.field(default_factory=list)
    """What was displayed, in order: ``display()`` calls and shown figures as they came,
    then the main result (if any), then the figures left open at the end."""
    logs: Logs = msgspec.field(default_factory=Logs)
    error: ExecutionError | None = None
    """The exception the code raised (``None``: it ran to its end)."""
    execution_count: int | None = None
    """Calls run in this context so far, this one included (as a notebook numbers cells)."""
    context_id: str = DEFAULT_CONTEXT
    duration: float = 0.0
    """Seconds from the call's start to its end."""
    timed_out: bool = False
    """The call ran past its ``timeout`` and was interrupted (``run_code`` raises
    :class:`~asyncsandbox.ExecTimeout` carrying this execution)."""
    restarted: bool = False
    """The context's interpreter is not the one its previous call left: it died (this call's
    :attr:`error` says how, or it died between calls), or it ignored an interrupt and was
    killed. Its variables and imports are gone; its id and working directory remain."""
    truncated: bool = False
    """Output was cut: a stream's middle (see :class:`Logs`), or results past the limit."""

    @property
    def text(self) -> str | None:
        """The main result's text (``None`` when the last statement was no expression, its
        value was ``None``, or it ended with ``;``)."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None


class CodeContext(msgspec.Struct, frozen=True, kw_only=True):
    """An interpreter of its own in the sandbox: variables, imports and working directory
    persist from one call to the next within it, and never leak into another context. Make
    one with :meth:`Sandbox.create_code_context`; ``run_code`` without one uses the
    sandbox's default context (id ``"default"``)."""

    id: str
    language: str = LANGUAGE
    cwd: str = ""
    """The working directory it started in."""


class CodeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One ``run_code`` call, checked, as it travels to where the sandbox runs (the local
    interpreter, or a backend that runs code where its sandboxes are)."""

    code: str
    context: str = DEFAULT_CONTEXT
    """The context's id; :data:`DEFAULT_CONTEXT` is created on first use."""
    timeout: float | None = None
    """The call's own limit in seconds: past it, the code is interrupted as a notebook
    interrupts it (``KeyboardInterrupt``); ``None``: no limit."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Environment variables set (in ``os.environ``) for this call only."""
    max_output_bytes: int = 1024 * 1024
    """Per stream, and for the results together (see :class:`Logs`)."""
