"""An inspect_ai task whose samples run in asyncsandbox sandboxes (the ``asyncsandbox``
provider, from ``pip install "asyncsandbox[inspect]"``).

Each sample gets its own sandbox, with the sample's ``data.txt`` written into it; the agent
has a ``bash`` tool and must write the file's text in upper case to ``answer.txt``; the
scorer reads that file back from the sandbox. Run it with any model::

    uv run inspect eval examples/inspect_task.py --model openai/gpt-4o-mini

or, with no model at all, with the scripted model defined here (it makes the one tool
call the task needs, then answers)::

    uv run inspect eval examples/inspect_task.py -T scripted=true

``-T backend=docker -T image=...`` runs the samples on the Docker backend instead.
"""

from __future__ import annotations

from typing import Any

from asyncsandbox_inspect import AsyncSandboxConfig
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    get_model,
    modelapi,
)
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import ToolChoice, ToolInfo, bash
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

WORDS = ["hello sandbox", "asyncsandbox runs inspect", "forty two", "model-written code"]
COMMAND = "tr a-z A-Z < data.txt > answer.txt && echo done"


@task
def upper_case(backend: str = "process", image: str | None = None, scripted: bool = False) -> Task:
    defaults: dict[str, Any] = {} if image is None else {"image": image}
    return Task(
        dataset=[
            Sample(
                input="Write the text of data.txt in upper case to answer.txt.",
                target=words.upper(),
                files={"data.txt": words},
            )
            for words in WORDS
        ],
        solver=[use_tools(bash(timeout=30)), generate()],
        scorer=answer_file(),
        sandbox=SandboxEnvironmentSpec(
            "asyncsandbox", AsyncSandboxConfig(backend=backend, defaults=defaults)
        ),
        model=get_model("scripted/bash") if scripted else None,
    )


@scorer(metrics=[accuracy()])
def answer_file():  # type: ignore[no-untyped-def]  # inspect's decorators are untyped
    async def score(state: TaskState, target: Target) -> Score:
        try:
            answer = await sandbox().read_file("answer.txt")
        except FileNotFoundError:
            return Score(value=INCORRECT, explanation="no answer.txt")
        return Score(value=CORRECT if answer.strip() == target.text else INCORRECT, answer=answer)

    return score


@modelapi(name="scripted")
def scripted() -> type[ModelAPI]:
    return ScriptedModel


class ScriptedModel(ModelAPI):
    """A model that calls ``bash`` with the task's command, then answers with its output."""

    def __init__(self, model_name: str, **kwargs: Any) -> None:
        super().__init__(model_name, None, None, [], kwargs.get("config") or GenerateConfig())

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        if input and isinstance(input[-1], ChatMessageTool):
            return ModelOutput.from_content(model=self.model_name, content=input[-1].text)
        return ModelOutput.for_tool_call(
            model=self.model_name, tool_name="bash", tool_arguments={"command": COMMAND}
        )
