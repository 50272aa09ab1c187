"""A smolagents ``CodeAgent`` whose code runs in a sandbox (``asyncsandbox-smolagents``).

``CodeAgent(executor=SandboxExecutor(sandbox))``: each code step the model writes runs in
the sandbox's stateful interpreter (variables and tools persist from step to step); an
exception is shown to the model, which goes on; ``final_answer`` ends the run. The model
is scripted (NOT a model: a ``smolagents.Model`` replaying fixed code steps, so no API
key is needed). smolagents' tool code imports numpy and Pillow: the sandbox's Python needs
them (``--image``: a Docker image, or for the process backend a root filesystem, that has
them).

Run it::

    uv run examples/smolagents_agent.py --image /path/to/rootfs
    uv run examples/smolagents_agent.py --backend docker --image IMAGE
"""

from __future__ import annotations

import argparse
from typing import Any

import _support
from asyncsandbox_smolagents import SandboxExecutor
from smolagents import (
    ActionStep,
    AgentLogger,
    ChatMessage,
    CodeAgent,
    LogLevel,
    MessageRole,
    Model,
    TokenUsage,
    tool,
)

from asyncsandbox import SandboxDefaults
from asyncsandbox.sync import SyncSession

STEPS = [
    "primes = [n for n in range(2, 50) if is_prime(n)]\nprint(len(primes), 'primes below 50')",
    "print('share above 1000:', 1 / len([p for p in primes if p > 1000]))",
    "final_answer(sum(primes))",
]
TASK = "What is the sum of the primes below 50?"


class ScriptedModel(Model):  # type: ignore[misc]  # smolagents is untyped
    """NOT a model: the code steps above, one per call."""

    def __init__(self) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(STEPS)

    def generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatMessage:
        content = f"Thought: next step.\n<code>\n{self.steps.pop(0)}\n</code>"
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=content, token_usage=TokenUsage(0, 0)
        )


@tool  # type: ignore[untyped-decorator]  # smolagents is untyped
def is_prime(n: int) -> bool:
    """Whether n is a prime number.

    Args:
        n: the number to test.
    """
    if n < 2:
        return False
    # A loop, not all(...): smolagents' tool validator rejects a generator's own names.
    for divisor in range(2, int(n**0.5) + 1):  # noqa: SIM110
        if n % divisor == 0:
            return False
    return True


def main(args: argparse.Namespace) -> None:
    defaults = SandboxDefaults(image=args.image) if args.image else None
    backend_options = _support.backend_options(args)
    with SyncSession(args.backend, backend_options=backend_options, defaults=defaults) as session:
        executor = SandboxExecutor(session.sandbox(), logger=AgentLogger(LogLevel.OFF))
        agent = CodeAgent(
            tools=[is_prime],
            model=ScriptedModel(),
            executor=executor,
            max_steps=len(STEPS),
            verbosity_level=LogLevel.OFF,
        )
        with agent:  # leaving it removes the sandbox
            answer = agent.run(TASK)
        for step in agent.memory.steps:
            if not isinstance(step, ActionStep):
                continue
            if step.error is not None:
                # "<logs>\nExecuting code yielded an error:\n<name>\n<value>\n<traceback>"
                name, value = str(step.error).split("yielded an error:\n", 1)[1].split("\n")[:2]
                print(f"Step {step.step_number}: error {name}: {value}")
            elif step.is_final_answer:
                print(f"Step {step.step_number}: final answer {step.action_output!r}")
            else:
                # "Execution logs:\n<stdout>Last output from code snippet:\n<output>"
                logs = (step.observations or "").split("Execution logs:\n", 1)[-1]
                print(f"Step {step.step_number}: printed {logs.splitlines()[0]!r}")
        print(f"Answer: {answer}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _support.add_backend_arguments(parser)
    args = parser.parse_args()
    _support.configure_logging(args.verbose)
    main(args)
