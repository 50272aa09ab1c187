"""SWE-style task environment: per-task sandboxes, seed repositories, submit-graded tests.

A port of open-instruct's SWE-RL sandbox environment (``SWERLSandboxEnv``). Every task is a
directory (the task data, :data:`TASKS`), in this project's layout::

    swe_tasks/<name>/
        instruction.md          what the agent is asked to do (its first user message)
        seeds/                  the repository: copied into the workspace at reset
        setup.sh                optional: runs once in the workspace after the seeds
        image                   optional: the task's Docker image, one line
        tests/test.sh           the hidden tests, with whatever else they need
        scripted_solution.json  only for --policy scripted (never shown to the agent)

or, as is, in open-instruct's (``environment/seeds/``, ``image.txt``; ``tests/test.sh`` reads
its files from ``/tests`` and writes the reward to ``/logs/verifier/reward.txt``). Such a task
gets open-instruct's tools, ``execute_bash`` (bash whose directory and variables persist),
``str_replace_editor`` and ``submit``. Process sandboxes can write only to their workspace,
home and ``/tmp``, and Docker sandboxes run commands as an unprivileged user: neither can
create ``/tests`` or ``/logs``. So on every backend alike, those two directories live under
``/tmp/asyncsandbox-task/`` and the task's scripts (``tests/``, ``setup.sh``) are uploaded
with their absolute ``/tests`` and ``/logs`` paths pointing there (:func:`map_task_paths`):
the same scripts, graded the same way on every backend, without privileges.

:class:`TaskEnvironment` resets a fresh sandbox from a task: it starts it on the task's
image (Docker backend; ``--image`` is the fallback for tasks that name none, and the
process backend, which runs on the host system or a root filesystem given as ``--image``,
ignores task images), uploads ``seeds/`` into the workspace (``/workspace``) and runs
``setup.sh`` there. The agent then works through the tools of :mod:`asyncsandbox.tools`
(``bash``, ``read_file``, ``write_file``, ``str_replace_editor``), rooted at the workspace,
until it calls ``submit``: only then are ``tests/`` uploaded (to ``/tmp/asyncsandbox-task``,
out of the workspace) and ``test.sh`` run in the workspace with ``$TESTS_DIR``,
``$REWARD_FILE`` and ``$WORKSPACE`` set. The reward is the number ``test.sh`` wrote to
``$REWARD_FILE`` (open-instruct's tasks: ``/logs/verifier/reward.txt``), clamped to [0, 1]
for partial credit, else its exit status (0: 1.0, other: 0.0); a timeout scores 0.0. The
``submit`` observation is open-instruct's: the tests' exit code, stdout, stderr and the
reward. A failing ``setup.sh`` or ``tests/`` that cannot be uploaded are the task's fault,
not the agent's: the episode is masked (``infrastructure_error``).

The policy is any OpenAI-compatible endpoint (``--policy openai --base-url URL --model
NAME``, as in ``agent_rollouts.py``), or, offline, ``--policy scripted``: NOT a model, a
script replaying each task's ``scripted_solution.json``. Its even-numbered attempts replay
the solution (reward 1.0); its odd-numbered ones look at the workspace and submit it
unchanged, as a baseline (reward 0.0, or the partial credit the broken code earns).

Run it::

    uv run examples/swe_task_env.py --policy scripted
    uv run examples/swe_task_env.py --policy scripted --backend docker
    uv run examples/swe_task_env.py --policy openai --base-url http://localhost:8000/v1 \\
        --model Qwen/Qwen3-8B --output trajectories.jsonl

With ``--backend docker`` each task runs on its own image (``python:3.12-slim``,
``python:3.11-slim`` or the backend's default, pulled when missing).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import _support
import anyio
from agent_rollouts import (
    Message,
    Policy,
    PolicyError,
    add_policy_arguments,
    agent_loop,
    check_policy_arguments,
    endpoint_policy,
)

import asyncsandbox
from asyncsandbox import (
    ExecResult,
    ExecTimeout,
    InfrastructureError,
    Limits,
    Sandbox,
    SandboxDefaults,
)
from asyncsandbox.tools import Grade, Toolbox

TASKS = Path(__file__).resolve().parent / "swe_tasks"
WORKSPACE = "/workspace"
GRADING_DIR = "/tmp/asyncsandbox-task"
"""Where ``tests/`` go at submission: outside the workspace, emptied before each upload."""
SETUP_TIMEOUT_SECONDS = 300.0
OPEN_INSTRUCT_TOOLS = ("execute_bash", "str_replace_editor", "submit")
OPEN_INSTRUCT_REWARD_FILE = "/logs/verifier/reward.txt"
# An absolute /tests or /logs path: not a part of a longer path, a name or a URL.
_TASK_PATH = re.compile(r"(?<![\w.~$/:-])/(tests|logs)(?![\w.-])")


def map_task_paths(text: str) -> str:
    """``text`` (a script of an open-instruct task) with its absolute ``/tests`` and
    ``/logs`` paths moved under :data:`GRADING_DIR` (see the module docstring)."""
    return _TASK_PATH.sub(lambda m: f"{GRADING_DIR}/{m.group(1)}", text)


SYSTEM_PROMPT = f"""You are a software engineering agent working in a Linux sandbox.
The repository is in {WORKSPACE}, the working directory of your tools. Investigate the
problem, change the code to fix it, check your change, and call submit when you are done:
submit runs the hidden tests and ends the episode."""


@dataclass(frozen=True)
class Task:
    """One task directory (see the module docstring)."""

    name: str
    path: Path
    instruction: str
    image: str | None
    has_setup: bool
    layout: Literal["asyncsandbox", "open-instruct"] = "asyncsandbox"

    @classmethod
    def load(cls, path: Path) -> Task:
        if not (path / "tests" / "test.sh").is_file():
            raise SystemExit(f"task {path}: tests/test.sh is missing")
        open_instruct = (path / "environment").is_dir() or (path / "image.txt").is_file()
        image_file = path / ("image.txt" if open_instruct else "image")
        image = image_file.read_text().strip() if image_file.is_file() else None
        return cls(
            name=path.name,
            path=path,
            instruction=(path / "instruction.md").read_text(encoding="utf-8").strip(),
            image=image or None,
            has_setup=(path / "setup.sh").is_file(),
            layout="open-instruct" if open_instruct else "asyncsandbox",
        )

    @property
    def seeds(self) -> Path:
        if self.layout == "open-instruct":
            return self.path / "environment" / "seeds"
        return self.path / "seeds"

    @property
    def tools(self) -> tuple[str, ...] | None:
        """The tools offered (None: the Toolbox's default ones)."""
        return OPEN_INSTRUCT_TOOLS if self.layout == "open-instruct" else None

    @property
    def reward_file(self) -> str:
        """Where test.sh writes the reward, in the sandbox."""
        if self.layout == "open-instruct":
            return map_task_paths(OPEN_INSTRUCT_REWARD_FILE)
        return f"{GRADING_DIR}/reward.txt"

    def scripted_solution(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(content, tool, arguments)`` of each assistant turn of the scripted solution."""
        steps = json.loads((self.path / "scripted_solution.json").read_text(encoding="utf-8"))
        return [(str(content), str(tool), dict(arguments)) for content, tool, arguments in steps]


def load_tasks(directory: Path, names: Sequence[str] = ()) -> list[Task]:
    """The tasks in ``directory`` (its subdirectories with ``tests/test.sh``), by name."""
    tasks = [
        Task.load(path)
        for path in sorted(directory.iterdir())
        if path.is_dir() and (path / "tests").is_dir()
    ]
    if names:
        known = {task.name: task for task in tasks}
        missing = [name for name in names if name not in known]
        if missing:
            raise SystemExit(f"unknown tasks {missing}; known: {', '.join(known)}")
        tasks = [known[name] for name in names]
    if not tasks:
        raise SystemExit(f"no tasks in {directory}")
    return tasks


class TaskSetupError(Exception):
    """The task could not be set up or graded (its setup.sh failed, its tests could not be
    uploaded): not the agent's doing, the episode is masked."""


@dataclass
class Grading:
    """What the last ``submit`` ran."""

    reward: float
    how: str
    """Where the reward came from: the reward file, the exit status, or a timeout."""
    summary: str
    """The last line the tests printed."""


class TaskEnvironment:
    """One episode of one task in its own sandbox::

        async with TaskEnvironment(session, task) as env:  # reset: seeds, setup.sh
            messages = env.initial_messages()
            ...  # the agent calls env.toolbox.call(name, arguments) until env.toolbox.done
            reward = env.toolbox.reward

    The sandbox is removed on exit, whatever happened.
    """

    def __init__(
        self,
        session: asyncsandbox.Session,
        task: Task,
        *,
        image: str | None = None,
        test_timeout: float = 120.0,
        tags: Sequence[str] = (),
    ) -> None:
        self.task = task
        self.image = image
        self.test_timeout = test_timeout
        self.sandbox: Sandbox = session.sandbox(
            image=image, workdir=WORKSPACE, tags=[f"task:{task.name}", *tags]
        )
        self.toolbox = Toolbox(self.sandbox, tools=task.tools, tests=self._grade, test_timeout=None)
        self.grading: Grading | None = None

    async def __aenter__(self) -> Self:
        try:
            await self.reset()
        except BaseException:
            await self.sandbox.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.sandbox.stop()

    async def reset(self) -> None:
        """Start the sandbox, upload the seed files into the workspace, run ``setup.sh``."""
        await self.sandbox.start()
        seeds = self.task.seeds
        if seeds.is_dir():
            await self.sandbox.upload(seeds, WORKSPACE)
        if self.task.has_setup:
            with self._scripts(self.task.path / "setup.sh") as setup:
                await self.sandbox.upload(setup, f"{GRADING_DIR}/setup.sh")
            try:
                result = await self.sandbox.exec(
                    ["bash", f"{GRADING_DIR}/setup.sh"], timeout=SETUP_TIMEOUT_SECONDS
                )
            except ExecTimeout as exc:
                raise TaskSetupError(
                    f"setup.sh timed out after {SETUP_TIMEOUT_SECONDS:g}s"
                ) from exc
            if result.returncode != 0:
                raise TaskSetupError(
                    f"setup.sh failed (exit={result.returncode}): {result.stderr_text.strip()}"
                )
            await self.sandbox.exec(["rm", "-rf", GRADING_DIR], timeout=30, check=True)

    def initial_messages(self) -> list[Message]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.task.instruction},
        ]

    @contextmanager
    def _scripts(self, source: Path) -> Iterator[Path]:
        """``source`` (a file or directory of the task) as it is uploaded: as is, or with
        open-instruct's ``/tests`` and ``/logs`` paths mapped (see the module docstring)."""
        if self.task.layout != "open-instruct":
            yield source
            return
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch, source.name)
            if source.is_dir():
                shutil.copytree(source, copy, symlinks=True)
            else:
                shutil.copy2(source, copy)
            for path in [copy] if copy.is_file() else list(copy.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    try:
                        text = path.read_text(encoding="utf-8")
                    except UnicodeDecodeError:
                        continue  # data, not a script
                    path.write_text(map_task_paths(text), encoding="utf-8")
            yield copy

    async def _grade(self, sandbox: Sandbox) -> Grade:
        """``submit``: upload the hidden tests, run ``test.sh``, parse the reward."""
        tests_dir, reward_file = f"{GRADING_DIR}/tests", self.task.reward_file
        # A fresh grading directory: nothing the agent left there (a reward file...) counts.
        await sandbox.exec(["rm", "-rf", GRADING_DIR], timeout=30, check=True)
        try:
            with self._scripts(self.task.path / "tests") as tests:
                await sandbox.upload(tests, tests_dir)
        except asyncsandbox.SandboxFileError as exc:
            raise TaskSetupError(f"the tests could not be uploaded: {exc}") from exc
        reward_dir = reward_file.rpartition("/")[0]
        await sandbox.exec(["mkdir", "-p", reward_dir], timeout=30, check=True)
        env = {"TESTS_DIR": tests_dir, "REWARD_FILE": reward_file, "WORKSPACE": WORKSPACE}
        try:
            result = await sandbox.exec(
                ["bash", f"{tests_dir}/test.sh"], env=env, timeout=self.test_timeout
            )
        except ExecTimeout as exc:
            self.grading = Grading(0.0, "timeout", _last_line(exc.result))
            status = f"timed out after {self.test_timeout:g}s"
            return Grade(reward=0.0, observation=_submit_observation(status, exc.result, 0.0))
        summary = _last_line(result)
        reward, how = (1.0 if result.returncode == 0 else 0.0), f"exit={result.returncode}"
        try:
            written = (await sandbox.read_file(reward_file, max_bytes=100)).decode().strip()
        except asyncsandbox.SandboxFileError:
            pass  # no reward file: the exit status decides
        else:
            try:
                value = float(written)
            except ValueError:
                value = math.nan
            if math.isnan(value):
                reward, how = 0.0, f"unreadable reward file {written!r}"
            else:
                reward, how = min(1.0, max(0.0, value)), "reward file"
        self.grading = Grading(reward, how, summary)
        observation = _submit_observation(str(result.returncode), result, reward)
        return Grade(reward=reward, observation=observation)


def _submit_observation(status: str, result: ExecResult, reward: float) -> str:
    """What ``submit`` shows, as open-instruct's environment does: the tests' exit code,
    the end of their output, the reward."""
    return (
        f"Test execution complete.\nExit code: {status}\n"
        f"[STDOUT]\n{result.stdout_text[-2000:]}\n[STDERR]\n{result.stderr_text[-1000:]}\n"
        f"Reward: {reward}"
    )


def _last_line(result: ExecResult) -> str:
    """The last line of stdout, else of stderr (where unittest reports)."""
    for text in (result.stdout_text, result.stderr_text):
        lines = text.strip().splitlines()
        if lines:
            return lines[-1]
    return ""


# -- policies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptedTaskPolicy:
    """NOT a model: replays ``task``'s ``scripted_solution.json`` (``solve``), or looks at the
    workspace and submits it unchanged (the baseline). The next call follows from the
    number of assistant turns so far."""

    task: Task
    solve: bool = True

    def script(self) -> list[tuple[str, str, dict[str, Any]]]:
        if self.solve:
            return self.task.scripted_solution()
        return [
            ("Let me look around.", "str_replace_editor", {"command": "view", "path": "."}),
            ("Submitting as is.", "submit", {}),
        ]

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        turn = sum(m["role"] == "assistant" for m in messages)
        script = self.script()
        if turn >= len(script):
            return {"role": "assistant", "content": "Done."}
        content, name, arguments = script[turn]
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return {"role": "assistant", "content": content, "tool_calls": [call]}


# -- episodes ---------------------------------------------------------------------------------


@dataclass
class Episode:
    task: Task
    attempt: int
    image: str | None
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    submitted: bool = False
    graded_by: str | None = None
    test_summary: str = ""
    tool_calls: int = 0
    tool_errors: int = 0
    infrastructure_error: bool = False
    error: str | None = None
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        """A JSON line for a trainer (the format of ``agent_rollouts.py``)."""
        return {
            "task_id": self.task.name,
            "trajectory": self.attempt,
            "messages": self.messages,
            "tools": self.tools,
            "reward": self.reward,
            "infrastructure_error": self.infrastructure_error,
            "metadata": {
                "task_id": self.task.name,
                "image": self.image,
                "submitted": self.submitted,
                "graded_by": self.graded_by,
                "tool_calls": self.tool_calls,
                "tool_errors": self.tool_errors,
                "seconds": round(self.seconds, 3),
                "error": self.error,
            },
        }


async def run_episode(
    session: asyncsandbox.Session,
    episode: Episode,
    policy: Policy,
    *,
    max_turns: int,
    test_timeout: float,
) -> Episode:
    started = time.monotonic()
    try:
        async with TaskEnvironment(
            session, episode.task, image=episode.image, test_timeout=test_timeout
        ) as env:
            episode.messages = env.initial_messages()
            episode.tools = env.toolbox.schemas()
            stats = await agent_loop(
                policy, episode.messages, episode.tools, env.toolbox.call, max_turns=max_turns
            )
            episode.tool_calls, episode.tool_errors = stats.tool_calls, stats.tool_errors
            episode.submitted = env.toolbox.done
            episode.reward = env.toolbox.reward or 0.0
            if env.grading is not None:
                episode.graded_by = env.grading.how
                episode.test_summary = env.grading.summary
            if stats.infrastructure_error is not None:
                episode.infrastructure_error = True
                episode.error = stats.infrastructure_error
    except (InfrastructureError, PolicyError, TaskSetupError) as exc:
        # The sandbox, the model endpoint or the task itself failed: not the agent's doing.
        episode.infrastructure_error = True
        episode.error = f"{type(exc).__name__}: {exc}"
    episode.seconds = time.monotonic() - started
    return episode


def task_image(args: argparse.Namespace, task: Task) -> str | None:
    """The task's own image on Docker (``--image`` for tasks that name none); on the process
    backend ``--image`` (a root filesystem directory, or None: the host system)."""
    if args.backend == "docker" and task.image:
        return task.image
    return str(args.image) if args.image else None


async def run(
    args: argparse.Namespace, tasks: list[Task], make_policy: Callable[[Task, int], Policy]
) -> list[Episode]:
    job = uuid.uuid4().hex[:8]
    episodes = [
        Episode(task, attempt, task_image(args, task))
        for task in tasks
        for attempt in range(args.attempts)
    ]
    async with asyncsandbox.Session(
        args.backend,
        backend_options=_support.backend_options(args),
        defaults=SandboxDefaults(tags=("swe-task-env", f"job:{job}")),
        limits=Limits(max_live=args.concurrency),
    ) as session:
        ops = [
            session.submit(
                run_episode(
                    session,
                    e,
                    make_policy(e.task, e.attempt),
                    max_turns=args.max_turns,
                    test_timeout=args.test_timeout,
                ),
                name=f"{e.task.name} #{e.attempt}",
            )
            for e in episodes
        ]
        with _support.Progress(len(ops), "episodes") as bar:
            async for op in asyncsandbox.as_completed(ops):
                e: Episode = op.result()
                bar.update()
                if e.infrastructure_error:
                    status = f"MASKED ({e.error})"
                else:
                    status = f"reward={e.reward:.2f}"
                    if e.graded_by:
                        status += f" ({e.graded_by})"
                bar.write(
                    f"  [{bar.count}/{len(ops)}] {e.task.name} #{e.attempt}: {status}, "
                    f"{e.tool_calls} tool calls ({e.tool_errors} failed)"
                    f"{'' if e.submitted else ', not submitted'}"
                    + (f" | {e.test_summary}" if e.test_summary else "")
                )
        stats = session.statistics()
    print(f"Sandboxes: {stats.sandboxes_started} started, {stats.sandboxes_removed} removed")
    return episodes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    _support.add_backend_arguments(parser)
    add_policy_arguments(parser)
    parser.add_argument("--tasks", type=Path, default=TASKS, help="directory of task directories")
    parser.add_argument("--task", action="append", default=[], help="run only this task")
    parser.add_argument("--attempts", type=int, default=2, help="episodes per task (default 2)")
    parser.add_argument("--max-turns", type=int, default=30, help="model turns per episode")
    parser.add_argument("--test-timeout", type=float, default=120.0, help="seconds for test.sh")
    parser.add_argument("--concurrency", type=int, default=16, help="sandboxes alive at once")
    parser.add_argument("--output", type=Path, default=None, help="write trajectories here")
    args = parser.parse_args(argv)
    check_policy_arguments(parser, args)
    _support.configure_logging(args.verbose)

    tasks = load_tasks(args.tasks, args.task)
    print("SWE task environment with asyncsandbox")
    print("=" * 60)
    policy = "scripted (replays scripted_solution.json; not a model)"
    print(f"Policy: {policy if args.policy == 'scripted' else f'{args.model} at {args.base_url}'}")
    print(f"Backend: {args.backend}")
    print(f"Tasks: {len(tasks)} ({args.tasks}), {args.attempts} attempts each")
    for task in tasks:
        image = task_image(args, task)
        where = f"image {image}" if image else "the backend's default image"
        if args.backend == "process" and not image:
            where = "the host system"
        if task.image and image != task.image:
            where += f" (its image {task.image} applies on docker)"
        setup = ", setup.sh" if task.has_setup else ""
        layout = ", open-instruct layout" if task.layout == "open-instruct" else ""
        print(f"  {task.name}: {where}{setup}{layout}")
    print()

    make_policy: Callable[[Task, int], Policy]
    if args.policy == "openai":
        endpoint = endpoint_policy(args)

        def make_policy(task: Task, attempt: int) -> Policy:
            return endpoint

    else:

        def make_policy(task: Task, attempt: int) -> Policy:
            return ScriptedTaskPolicy(task, solve=attempt % 2 == 0)

    episodes = anyio.run(run, args, tasks, make_policy)

    print("\nSummary (attempts in order):")
    print("-" * 60)
    scored = [e for e in episodes if not e.infrastructure_error]
    for task in tasks:
        mine = [e for e in episodes if e.task is task]
        rewards = ", ".join("masked" if e.infrastructure_error else f"{e.reward:.2f}" for e in mine)
        print(f"  {task.name}: rewards [{rewards}]")
    print("-" * 60)
    average = sum(e.reward for e in scored) / len(scored) if scored else 0.0
    solved = {e.task.name for e in scored if e.reward == 1.0}
    print(
        f"Average reward: {average:.2f} ({len(episodes)} episodes, {len(episodes) - len(scored)} masked)"
    )
    print(f"Solved: {len(solved)}/{len(tasks)} tasks")
    if args.output:
        with args.output.open("w", encoding="utf-8") as f:
            for e in episodes:
                f.write(json.dumps(e.record()) + "\n")
        print(f"Wrote {len(episodes)} trajectories to {args.output}")
    return 0 if len(scored) == len(episodes) else 1


if __name__ == "__main__":
    sys.exit(main())
