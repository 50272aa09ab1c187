"""Multi-step agent rollouts: trajectory groups for GRPO-style training (ART, verifiers).

Each trajectory is one episode in one persistent sandbox: the agent writes code, runs it,
reads the error, fixes it and submits, through the agent tools of :mod:`asyncsandbox.tools`
(``bash``, ``read_file``, ``write_file``, ``str_replace_editor``, ``submit``). Several
trajectories per problem form a group; ``submit`` runs the problem's tests (hidden until
then) for a binary reward. Trajectories are written as JSON lines a trainer can consume:
OpenAI-format messages with tool calls, the tool schemas, the reward, metadata (``task_id``,
...) and ``infrastructure_error``, set when a sandbox failed under the agent (not the
agent's fault: mask the trajectory instead of scoring it).

Problems are MBPP-format JSON lines (``task_id``, ``text``, ``code``, ``test_list``); the
default file, ``data/mbpp_problems.jsonl``, was written for this example.

The policy is any OpenAI-compatible chat endpoint (``--policy openai --base-url URL --model
NAME``, the key from ``$OPENAI_API_KEY``; the ``openai`` package is used if installed, else
plain HTTP), or, offline, ``--policy scripted``: NOT a model, a script replaying fixed tool
calls. Its even-numbered trajectories write a first draft with a typo, run it, read the
SyntaxError, fix it, run it again and submit (reward 1.0); its odd-numbered ones submit the
draft untested (reward 0.0), so every group holds both rewards.

Run it::

    uv run examples/agent_rollouts.py --policy scripted --output rollouts.jsonl
    uv run examples/agent_rollouts.py --policy openai --base-url http://localhost:8000/v1 \\
        --model Qwen/Qwen3-8B --trajectories-per-problem 4 --steps 3
    uv run examples/agent_rollouts.py --backend docker --image python:3.12-slim

Sandbox metrics go to stderr as JSON lines (``report_to=["log"]``) after each step, and to
W&B when a run is active (``--wandb-project NAME`` starts one).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import _support
import anyio

import asyncsandbox
from asyncsandbox import ExecTimeout, InfrastructureError, Limits, Sandbox, SandboxDefaults
from asyncsandbox.tools import Toolbox, ToolResult

PROBLEMS = Path(__file__).resolve().parent / "data" / "mbpp_problems.jsonl"
SOLUTION = "solution.py"
TEST_TIMEOUT_SECONDS = 30.0

SYSTEM_PROMPT = f"""You are a coding agent working in a Linux sandbox with Python 3.
Solve the task by writing a Python module named {SOLUTION} in the working directory. Use the
tools: write the file, run it with bash to check it against the examples, fix what fails,
and call submit when you are confident: submit runs the hidden tests and ends the episode."""

Message = dict[str, Any]


@dataclass(frozen=True)
class Problem:
    """One MBPP-format problem."""

    task_id: int | str
    text: str
    code: str
    test_list: tuple[str, ...]
    test_setup_code: str = ""

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Problem:
        return cls(
            task_id=record["task_id"],
            text=record["text"],
            code=record["code"],
            test_list=tuple(record["test_list"]),
            test_setup_code=record.get("test_setup_code", ""),
        )

    def prompt(self) -> str:
        """MBPP's prompt: the task and the tests the code should pass."""
        tests = "\n".join(self.test_list)
        return f"{self.text}\nYour code should pass these tests:\n\n{tests}"

    def test_script(self) -> str:
        return "\n".join(["from solution import *", self.test_setup_code, *self.test_list, ""])


def load_problems(path: Path, limit: int | None = None) -> list[Problem]:
    with path.open(encoding="utf-8") as f:
        problems = [Problem.from_json(json.loads(line)) for line in f if line.strip()]
    return problems[:limit] if limit else problems


def hidden_tests(problem: Problem) -> Callable[[Sandbox], Awaitable[float]]:
    """What ``submit`` runs: the problem's tests against ``solution.py``; 1.0 if all pass.
    They reach the sandbox only at submission (the agent never sees the test file)."""

    async def run(sandbox: Sandbox) -> float:
        try:
            result = await sandbox.exec(
                ["python3", "-c", problem.test_script()], timeout=TEST_TIMEOUT_SECONDS
            )
        except ExecTimeout:
            return 0.0
        return 1.0 if result.returncode == 0 else 0.0

    return run


# -- policies: who picks the next tool call ---------------------------------------------------


class Policy(Protocol):
    """Produces the next assistant message (OpenAI format, with ``tool_calls``) for a
    conversation; a message without tool calls ends the episode."""

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message: ...


class PolicyError(Exception):
    """The policy could not answer (the endpoint failed): the trajectory is masked."""


def _tool_call(step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{step}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


@dataclass(frozen=True)
class ScriptedPolicy:
    """NOT a model: replays fixed tool calls for ``problem`` (see the module docstring).

    ``careful``: write a draft with a typo, run it on the first example (a SyntaxError),
    fix the typo, run it again, submit. Otherwise: write the draft and submit it untested.
    The next call follows from the number of assistant turns so far.
    """

    problem: Problem
    careful: bool = True

    def draft(self) -> str:
        """The reference solution with a typo: the mistake the careful script fixes."""
        if "return" not in self.problem.code:
            raise ValueError(f"task {self.problem.task_id}: the scripted typo needs a `return`")
        return self.problem.code.replace("return", "retrun", 1)

    def script(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(content, tool, arguments)`` of each assistant turn."""
        write = ("I'll write a first version.", "write_file", {"path": SOLUTION, "content": ""})
        write[2]["content"] = self.draft()
        if not self.careful:
            return [write, ("Done, submitting.", "submit", {})]
        example = ["from solution import *", *self.problem.test_list[:1], "print('example ok')"]
        check = {"command": "python3 - <<'EOF'\n" + "\n".join(example) + "\nEOF"}
        fix = {"command": "str_replace", "path": SOLUTION, "old_str": "retrun", "new_str": "return"}
        return [
            write,
            ("Let me run it on the first example.", "bash", check),
            ("SyntaxError: `retrun` is a typo for `return`. Fixing it.", "str_replace_editor", fix),
            ("Running the example again.", "bash", check),
            ("The example passes now. Submitting.", "submit", {}),
        ]

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        turn = sum(m["role"] == "assistant" for m in messages)
        script = self.script()
        if turn >= len(script):
            return {"role": "assistant", "content": "Done."}
        content, name, arguments = script[turn]
        return {
            "role": "assistant",
            "content": content,
            "tool_calls": [_tool_call(turn, name, arguments)],
        }


class OpenAIPolicy:
    """Any OpenAI-compatible chat completions endpoint (vLLM, SGLang, OpenAI...), with tool
    calling. Uses the ``openai`` package when installed, else plain HTTP (stdlib)."""

    def __init__(
        self, *, base_url: str, model: str, api_key: str | None, temperature: float = 1.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self._client: Any = None
        try:
            openai = importlib.import_module("openai")
        except ImportError:
            pass
        else:
            self._client = openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key or "none")

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        request = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "temperature": self.temperature,
        }
        try:
            if self._client is not None:
                reply = await self._client.chat.completions.create(**request)
                message = reply.choices[0].message.model_dump(exclude_none=True)
            else:
                reply = await anyio.to_thread.run_sync(self._post, request)
                message = reply["choices"][0]["message"]
        except Exception as exc:  # any endpoint failure: the trajectory is masked
            raise PolicyError(f"{type(exc).__name__}: {exc}") from exc
        out: Message = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            out["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": call["function"].get("arguments") or "{}",
                    },
                }
                for call in message["tool_calls"]
            ]
        return out

    def _post(self, request: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        http = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(request).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(http, timeout=300) as response:
                reply: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise PolicyError(f"HTTP {exc.code} from {self.base_url}: {detail}") from None
        return reply


# -- episodes ---------------------------------------------------------------------------------


@dataclass
class Trajectory:
    """One episode, as written to the JSONL file (:meth:`record`)."""

    problem: Problem
    step: int
    index: int
    policy: str
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    submitted: bool = False
    infrastructure_error: bool = False
    error: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    seconds: float = 0.0
    sandbox_id: str | None = None

    def record(self) -> dict[str, Any]:
        """The JSON line: what ART's ``Trajectory(messages_and_choices=messages, tools=tools,
        reward=reward, metadata=metadata)`` and verifiers' rollouts are made of."""
        return {
            "task_id": self.problem.task_id,
            "step": self.step,
            "trajectory": self.index,
            "messages": self.messages,
            "tools": self.tools,
            "reward": self.reward,
            "infrastructure_error": self.infrastructure_error,
            "metadata": {
                "task_id": self.problem.task_id,
                "policy": self.policy,
                "submitted": self.submitted,
                "tool_calls": self.tool_calls,
                "tool_errors": self.tool_errors,
                "seconds": round(self.seconds, 3),
                "sandbox_id": self.sandbox_id,
                "error": self.error,
            },
        }


@dataclass
class LoopStats:
    """What one run of :func:`agent_loop` did."""

    tool_calls: int = 0
    tool_errors: int = 0
    infrastructure_error: str | None = None
    """The observation of the first tool call that failed for infrastructure reasons."""


async def agent_loop(
    policy: Policy,
    messages: list[Message],
    tools: list[dict[str, Any]],
    call_tool: Callable[[str, str], Awaitable[ToolResult]],
    *,
    max_turns: int,
) -> LoopStats:
    """The agent loop: ask the policy for the next message, run its tool calls, append
    the observations to ``messages``; until a call ends the episode (``submit``), the policy
    stops calling tools, or ``max_turns`` messages were asked for."""
    stats = LoopStats()
    for _ in range(max_turns):
        message = await policy(messages, tools)
        messages.append(message)
        calls = message.get("tool_calls") or []
        done = False
        for call in calls:
            result = await call_tool(call["function"]["name"], call["function"]["arguments"])
            messages.append(result.message(call["id"]))
            stats.tool_calls += 1
            stats.tool_errors += result.is_error
            if result.infrastructure_error and stats.infrastructure_error is None:
                stats.infrastructure_error = result.observation
            done = done or result.done
        if done or not calls:
            break
    return stats


async def run_episode(
    session: asyncsandbox.Session, trajectory: Trajectory, policy: Policy, *, max_turns: int
) -> Trajectory:
    """Play one episode in a fresh sandbox, removed at the end whatever happens."""
    problem = trajectory.problem
    started = time.monotonic()
    trajectory.messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": problem.prompt()},
    ]
    try:
        async with session.sandbox(tags=[f"task:{problem.task_id}"]) as sandbox:
            trajectory.sandbox_id = sandbox.id
            toolbox = Toolbox(sandbox, tests=hidden_tests(problem), test_timeout=None)
            trajectory.tools = toolbox.schemas()
            stats = await agent_loop(
                policy, trajectory.messages, trajectory.tools, toolbox.call, max_turns=max_turns
            )
            trajectory.tool_calls, trajectory.tool_errors = stats.tool_calls, stats.tool_errors
            trajectory.submitted = toolbox.done
            trajectory.reward = toolbox.reward or 0.0
            if stats.infrastructure_error is not None:
                trajectory.infrastructure_error = True
                trajectory.error = stats.infrastructure_error
    except (InfrastructureError, PolicyError) as exc:
        # The sandbox or the model endpoint failed: not the agent's doing. Keep the
        # trajectory, flagged, so that the trainer masks it.
        trajectory.infrastructure_error = True
        trajectory.error = f"{type(exc).__name__}: {exc}"
    trajectory.seconds = time.monotonic() - started
    return trajectory


def scripted_policies(problem: Problem, index: int) -> Policy:
    """Even-numbered trajectories fix their mistake, odd-numbered ones do not."""
    return ScriptedPolicy(problem, careful=index % 2 == 0)


async def collect(
    args: argparse.Namespace,
    problems: list[Problem],
    make_policy: Callable[[Problem, int], Policy],
) -> list[Trajectory]:
    """Every step: a group of trajectories per problem, all in parallel; then the session's
    sandbox metrics are logged for that step."""
    job = uuid.uuid4().hex[:8]
    defaults = SandboxDefaults(image=args.image, tags=("agent-rollouts", f"job:{job}"))
    everything: list[Trajectory] = []
    async with asyncsandbox.Session(
        args.backend,
        backend_options=_support.backend_options(args),
        defaults=defaults,
        limits=Limits(max_live=args.concurrency),
        # JSON lines on stderr, and the active W&B run if there is one.
        report_to=["log", "wandb"],
    ) as session:
        for step in range(1, args.steps + 1):
            print(f"\n=== Step {step} ===")
            batch = [
                Trajectory(problem, step, index, args.policy)
                for problem in problems
                for index in range(args.trajectories_per_problem)
            ]
            print(f"Collecting {len(batch)} trajectories for {len(problems)} problems...")
            ops = [
                session.submit(
                    run_episode(
                        session,
                        t,
                        make_policy(t.problem, t.index),
                        max_turns=args.max_turns,
                    ),
                    name=f"task {t.problem.task_id} #{t.index}",
                )
                for t in batch
            ]
            with _support.Progress(len(ops), f"step {step}") as bar:
                async for op in asyncsandbox.as_completed(ops):
                    t: Trajectory = op.result()
                    bar.update()
                    status = f"reward={t.reward:.1f}"
                    if t.infrastructure_error:
                        status = "MASKED (infrastructure error)"
                    bar.write(
                        f"  [{bar.count}/{len(ops)}] task {t.problem.task_id} #{t.index}: "
                        f"{status}, {t.tool_calls} tool calls ({t.tool_errors} failed)"
                        f"{'' if t.submitted else ', not submitted'}"
                    )
            scored = [t for t in batch if not t.infrastructure_error]
            average = sum(t.reward for t in scored) / len(scored) if scored else 0.0
            print(
                f"Collected {len(batch)} trajectories, avg reward: {average:.2f} "
                f"({len(batch) - len(scored)} masked)"
            )
            groups = "  ".join(
                f"{p.task_id}: {[t.reward for t in batch if t.problem is p]}" for p in problems
            )
            print(f"Groups: {groups}")
            # The step's sandbox metrics: to the reporters, then counting starts afresh.
            metrics = session.log_metrics(step=step)
            m = {k.removeprefix("asyncsandbox/"): v for k, v in metrics.items()}
            print(
                f"Sandboxes: {m['sandboxes_created']:.0f} created, "
                f"{m['executions']:.0f} commands, "
                f"{m.get('avg_execs_per_sandbox', 0.0):.1f} per sandbox, "
                f"p50 latency {m.get('exec_latency_p50_seconds', 0.0) * 1000:.0f} ms"
            )
            _log_wandb({"rollouts/avg_reward": average}, step)
            everything += batch
            if args.output:
                write_jsonl(args.output, batch, append=step > 1)
    return everything


def write_jsonl(path: Path, trajectories: Sequence[Trajectory], *, append: bool) -> None:
    ordered = sorted(trajectories, key=lambda t: (str(t.problem.task_id), t.index))
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for t in ordered:
            f.write(json.dumps(t.record()) + "\n")


def _log_wandb(values: dict[str, float], step: int) -> None:
    wandb = sys.modules.get("wandb")  # only if the program started a run
    run = getattr(wandb, "run", None)
    if run is not None:
        run.log(values, step=step)


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--policy`` and the options of an OpenAI-compatible endpoint (also swe_task_env.py's)."""
    parser.add_argument("--policy", choices=["scripted", "openai"], required=True)
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    parser.add_argument("--model", default=None, help="model name at --base-url")
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="environment variable with the API key"
    )
    parser.add_argument("--temperature", type=float, default=1.0)


def check_policy_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.policy == "openai" and not (args.base_url and args.model):
        parser.error("--policy openai needs --base-url (or $OPENAI_BASE_URL) and --model")


def endpoint_policy(args: argparse.Namespace) -> OpenAIPolicy:
    """The ``--policy openai`` endpoint the arguments name."""
    return OpenAIPolicy(
        base_url=args.base_url,
        model=args.model,
        api_key=os.environ.get(args.api_key_env),
        temperature=args.temperature,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    _support.add_backend_arguments(parser)
    add_policy_arguments(parser)
    parser.add_argument("--problems", type=Path, default=PROBLEMS, help="MBPP-format JSONL")
    parser.add_argument("--num-problems", type=int, default=None, help="default: all")
    parser.add_argument("--trajectories-per-problem", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1, help="collection rounds (default 1)")
    parser.add_argument("--max-turns", type=int, default=10, help="model turns per episode")
    parser.add_argument("--concurrency", type=int, default=64, help="sandboxes alive at once")
    parser.add_argument("--output", type=Path, default=None, help="write trajectories here")
    parser.add_argument("--wandb-project", default=None, help="start a W&B run in this project")
    args = parser.parse_args(argv)
    check_policy_arguments(parser, args)
    _support.configure_logging(args.verbose)

    problems = load_problems(args.problems, args.num_problems)
    print("Agent rollouts with asyncsandbox")
    print("=" * 40)
    policy = "scripted (replays fixed tool calls; not a model)"
    print(f"Policy: {policy if args.policy == 'scripted' else f'{args.model} at {args.base_url}'}")
    print(f"Backend: {args.backend}")
    print(f"Problems: {len(problems)} ({args.problems.name})")
    print(f"Trajectories per problem: {args.trajectories_per_problem}")
    print(f"Steps: {args.steps}")
    if args.wandb_project:
        import wandb

        wandb.init(project=args.wandb_project, config={k: str(v) for k, v in vars(args).items()})
    make_policy: Callable[[Problem, int], Policy] = scripted_policies
    if args.policy == "openai":
        endpoint = endpoint_policy(args)

        def make_policy(problem: Problem, index: int) -> Policy:
            return endpoint  # one endpoint serves every trajectory

    try:
        trajectories = anyio.run(collect, args, problems, make_policy)
    finally:
        if args.wandb_project:
            wandb.finish()
    if args.output:
        print(f"\nWrote {len(trajectories)} trajectories to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
