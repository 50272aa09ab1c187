"""What a tool call returns (:class:`ToolResult`, its images), what ``submit`` may be given
and return, and how an observation is made (bounded, never an exception)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from .._interpreter._models import Execution
from .._models import ExecResult
from .._sandbox import Sandbox

__all__ = (
    "MARKER_ROOM",
    "Grade",
    "ModelError",
    "Tests",
    "ToolImage",
    "ToolResult",
    "clip",
    "decode",
    "execution_text",
    "output",
)

IMAGE_TYPES = (("png", "image/png"), ("jpeg", "image/jpeg"))


class ModelError(Exception):
    """A failure caused by the call itself; its message is the observation."""


class Grade(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``tests`` callable may return instead of a number: the reward, and the
    observation ``submit`` shows the model (e.g. the tests' exit code and output)."""

    reward: float
    observation: str


Tests = str | Sequence[str] | Callable[[Sandbox], Awaitable[float | Grade]]
"""What ``submit`` runs: a shell command (``str``), an argv, or ``async (sandbox) -> float``
(or a :class:`Grade`)."""

MARKER = "\n[... {} characters truncated ...]\n"
MARKER_ROOM = 64  # more than the marker ever takes


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


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def execution_text(execution: Execution) -> tuple[str, tuple[ToolImage, ...]]:
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
                for field, mime in IMAGE_TYPES
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


def output(result: ExecResult) -> str:
    out, err = result.stdout_text, result.stderr_text
    if err:
        if out and not out.endswith("\n"):
            out += "\n"
        out += "[stderr]\n" + err
    return out or "(no output)"


def clip(text: str, limit: int, dropped: int = 0) -> str:
    """At most ``limit`` characters: the head and the tail of ``text`` around a marker.

    ``dropped`` counts what the sandbox already cut from the middle of an output (it keeps
    ``4 * limit`` bytes of each stream, half head and half tail: at least ``limit / 2``
    characters on each side). That seam thus lies inside the part cut here, and the text is
    always longer than ``limit`` when something was dropped.
    """
    if len(text) <= limit:
        return text
    budget = limit - MARKER_ROOM
    head, tail = budget // 2, budget - budget // 2
    removed = len(text) - head - tail + dropped
    return text[:head] + MARKER.format(removed) + text[len(text) - tail :]
