"""smolagents' ``CodeAgent`` with our executor (``asyncsandbox_smolagents.SandboxExecutor``),
run as smolagents runs it: ``agent.run`` with a model (scripted here: no API key) whose
answers are code steps; the agent parses each, hands it to the executor, and shows the
model the logs, the output or the error; ``final_answer`` ends the run with its value."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import PIL.Image
import pytest
from asyncsandbox_smolagents import SandboxExecutor
from smolagents import (
    ActionStep,
    AgentError,
    AgentExecutionError,
    AgentLogger,
    ChatMessage,
    CodeAgent,
    LogLevel,
    MessageRole,
    Model,
    TokenUsage,
    Tool,
    tool,
)

from asyncsandbox import InvalidArgument, SandboxDefaults
from asyncsandbox.sync import SyncSession

# smolagents sends its tools as one block of code that imports numpy and PIL at the top
# (its patched final_answer uses them when they are there), installing them with pip
# first if missing: every remote executor's sandbox needs them. The test root filesystem
# has them (Debian's python3-numpy, python3-pil); the host's python3 may not.
ROOTFS = os.environ.get("ASYNCSANDBOX_TEST_ROOTFS")
pytestmark = pytest.mark.skipif(
    not ROOTFS, reason="set ASYNCSANDBOX_TEST_ROOTFS to a root filesystem (CI does)"
)


class ScriptedModel(Model):  # type: ignore[misc]  # smolagents is untyped
    """A model answering with the given steps, one per call (each a ``<code>`` block, as
    ``CodeAgent``'s prompt asks). It records the messages it was sent."""

    def __init__(self, *steps: str) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.inputs: list[str] = []

    def generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatMessage:
        self.inputs.append("\n".join(_text(m.content) for m in messages))
        code = self.steps.pop(0)
        content = f"Thought: step {len(self.inputs)}.\n<code>\n{code}\n</code>"
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=content, token_usage=TokenUsage(0, 0)
        )


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if part.get("type") == "text")
    return content or ""


@tool  # type: ignore[untyped-decorator]  # smolagents is untyped
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


QUIET = AgentLogger(LogLevel.OFF)


@pytest.fixture
def session(process_root: Path) -> Iterator[SyncSession]:
    assert ROOTFS is not None
    with SyncSession(
        "process",
        backend_options={"root": str(process_root)},
        defaults=SandboxDefaults(image=ROOTFS),
    ) as session:
        yield session


def agent(session: SyncSession, *steps: str, **options: Any) -> CodeAgent:
    executor = SandboxExecutor(session.sandbox(), logger=QUIET, **options)
    return CodeAgent(
        tools=[multiply],
        model=ScriptedModel(*steps),
        executor=executor,
        max_steps=len(steps),
        verbosity_level=LogLevel.OFF,
    )


def errors(coder: CodeAgent) -> list[str]:
    steps = [s for s in coder.memory.steps if isinstance(s, ActionStep)]
    return [f"{type(s.error).__name__}: {s.error}" for s in steps if s.error is not None]


def test_steps_keep_variables_call_tools_and_end_with_the_final_answer(
    session: SyncSession,
) -> None:
    coder = agent(
        session,
        "total = 6\nprint('total is', total)",
        "total = multiply(total, 7)\nopen('answer.txt', 'w').write(str(total))",
        "final_answer({'total': total, 'where': open('answer.txt').read()})",
    )
    with coder:
        answer = coder.run("What is six times seven?")
        executor = coder.python_executor
        assert isinstance(executor, SandboxExecutor)
        # The file was written in the sandbox, not here.
        assert executor.sandbox.read_file("answer.txt").result() == b"42"
        assert not Path("answer.txt").exists()
    assert answer == {"total": 42, "where": "42"}
    assert errors(coder) == []
    model = coder.model
    assert isinstance(model, ScriptedModel)
    assert model.steps == []
    # The model saw the first step's stdout as its logs.
    assert "Execution logs:\ntotal is 6\n" in model.inputs[1]


def test_an_exception_is_reported_to_the_model_and_the_agent_goes_on(
    session: SyncSession,
) -> None:
    coder = agent(
        session,
        "x = 20\nprint('before')\n1 / 0",
        "final_answer(x + 1)",
    )
    with coder:
        answer = coder.run("Divide.")
    assert answer == 21  # the state survived the error
    [error] = errors(coder)
    assert error.startswith(AgentExecutionError.__name__)
    assert "ZeroDivisionError" in error
    model = coder.model
    assert isinstance(model, ScriptedModel)
    assert "ZeroDivisionError" in model.inputs[1]
    assert "before" in model.inputs[1]  # the logs printed before the error came along


def test_a_step_past_its_timeout_is_an_error_and_the_state_stays(session: SyncSession) -> None:
    coder = agent(session, "y = 5", "while True:\n    pass", "final_answer(y * 2)", timeout=3)
    with coder:
        answer = coder.run("Loop.")
    assert answer == 10
    [error] = errors(coder)
    assert "ran past its timeout of 3 s" in error


def test_a_killed_interpreter_is_an_error_and_the_tools_are_defined_again(
    session: SyncSession,
) -> None:
    coder = agent(
        session,
        "x = 1",
        "import os\nos._exit(3)",
        "print('x' in globals())\nfinal_answer(multiply(6, 7))",
    )
    with coder:
        answer = coder.run("Die, then go on.")
    assert answer == 42  # multiply and final_answer were defined again
    [error] = errors(coder)
    assert "InterpreterDied" in error
    assert "the tools are defined again" in error
    model = coder.model
    assert isinstance(model, ScriptedModel)
    assert "The interpreter was restarted" in model.inputs[2]
    last = [s for s in coder.memory.steps if isinstance(s, ActionStep)][-1]
    assert "False" in (last.observations or "")  # the variables are gone: said, not hidden


# A 2x3 red PNG, made with the standard library only.
PNG_STEP = """
import struct, zlib

class Picture:
    def _repr_png_(self):
        def chunk(kind, data):
            body = kind + data
            return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body))
        header = struct.pack('>IIBBBBB', 2, 3, 8, 2, 0, 0, 0)
        rows = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 2 for _ in range(3))
        return (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', header)
                + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))

Picture()
"""


def test_an_image_result_comes_back_as_a_pil_image(session: SyncSession) -> None:
    coder = agent(session, PNG_STEP, "final_answer('drawn')")
    with coder:
        assert coder.run("Draw.") == "drawn"
    [first] = [s for s in coder.memory.steps if isinstance(s, ActionStep)][:1]
    image = first.action_output
    assert isinstance(image, PIL.Image.Image)
    assert image.size == (2, 3)
    assert image.convert("RGB").getpixel((1, 2)) == (255, 0, 0)


def test_cleanup_removes_the_sandbox(session: SyncSession) -> None:
    coder = agent(session, "final_answer(1)")
    executor = coder.python_executor
    assert isinstance(executor, SandboxExecutor)
    sandbox_id = executor.sandbox.id
    assert sandbox_id in [info.id for info in session.list(this_session=True)]
    with coder:
        assert coder.run("One.") == 1
    assert executor.sandbox.state == "closed"
    assert sandbox_id not in [info.id for info in session.list(this_session=True)]
    coder.cleanup()  # idempotent


def test_bad_timeout_is_refused(session: SyncSession) -> None:
    sandbox = session.sandbox()
    with pytest.raises(InvalidArgument, match="timeout"):
        SandboxExecutor(sandbox, timeout=0)
    assert sandbox.state == "new"  # refused before anything started


def test_a_failed_install_is_an_error_and_removes_the_sandbox(session: SyncSession) -> None:
    sandbox = session.sandbox()
    with pytest.raises(AgentError, match="asyncsandbox-no-such-package"):
        SandboxExecutor(sandbox, logger=QUIET, additional_imports=["asyncsandbox-no-such-package"])
    assert sandbox.state == "closed"
    assert sandbox.id not in [info.id for info in session.list(this_session=True)]


class Patient(Tool):  # type: ignore[misc]  # smolagents is untyped
    """A tool that takes its time to be defined (its instance is made in the sandbox's
    interpreter, with the tools' definitions)."""

    name = "patient"
    description = "Answers 42, once it has been made."
    inputs: dict[str, dict[str, str]] = {}  # noqa: RUF012 - smolagents reads it off the class
    output_type = "integer"

    def __init__(self) -> None:
        super().__init__()
        import time

        time.sleep(2)  # the behaviour under test: setup that outlasts a step's timeout

    def forward(self) -> int:
        return 42


def test_the_executors_setup_is_not_bound_by_a_steps_timeout(session: SyncSession) -> None:
    """Defining the tools (and starting the interpreter, finding packages, setting the
    variables) runs under ``setup_timeout``, not the steps' ``timeout``."""
    executor = SandboxExecutor(session.sandbox(), logger=QUIET, timeout=1)
    coder = CodeAgent(
        tools=[Patient()],
        model=ScriptedModel("final_answer(patient())"),
        executor=executor,
        max_steps=1,
        verbosity_level=LogLevel.OFF,
    )
    with coder:
        assert coder.run("Ask the patient tool.") == 42
    assert errors(coder) == []
