"""Runs one Python block of the RL guides (tests/seed_blocks/), as a user would, and checks
the outcome the guide describes. Used by tests/test_seeds.py, one process per block::

    python -m tests.seed_runner cwsandbox_000 04_reward_function_excerpt

The block runs verbatim (only its imports were mapped to asyncsandbox.compat), with the
names the guide leaves undefined supplied here: a scripted model and ``parse_tool_calls``
(not a model: fixed tool calls), tasks, a session where the guide assumes one, the toy
completions. Every check failing raises; the last line printed is ``OK <block>``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import gc
import importlib
import io
import json
import logging
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from ._support import eventually, sandbox_dirs

BLOCKS = Path(__file__).resolve().parent / "seed_blocks"
Namespace = dict[str, Any]

# The guide's five toy completions (the reward_function example; asyncsandbox's demo uses
# the same programs): what each should score.
COMPLETIONS = [
    ("slow-sum", "import time\ntime.sleep(1.0)\nprint(sum(range(101)))\n", 1.0),
    ("string-ops", "s = 'sandbox'\nprint(s.upper(), s[::-1], len(s))\n", 1.0),
    ("delayed-error", "import time\ntime.sleep(0.5)\nraise RuntimeError('model bug')\n", 0.0),
    ("syntax-error", "def broken(:\n    return 1\n", 0.0),
    ("slow-list", "import time\ntime.sleep(1.5)\nprint([i * i for i in range(8)])\n", 1.0),
]
# Model outputs for the TRL reward functions, and the rewards the guide's rule gives them.
ANSWERS = [
    ("Sure. <answer>print(6*7)</answer>", 1.0),
    ("<answer>print(6*7</answer>", 0.0),  # a syntax error
    ("The answer is 42.", 0.0),  # no code: skipped
    ("<answer>import sys; sys.exit(3)</answer>", 0.0),
    ("<answer>print('hello')</answer>", 1.0),
]


def block_path(seed: str, name: str) -> Path:
    return BLOCKS / seed / f"{name}.py"


def compile_block(seed: str, name: str) -> types.CodeType:
    path = block_path(seed, name)
    code: types.CodeType = compile(
        path.read_text(), str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    return code


def run_block(seed: str, name: str, namespace: Namespace, local: Any = None) -> Namespace:
    """Execute a block in ``namespace`` (the module globals the guide's file would have)."""
    code = compile_block(seed, name)
    exec(code, namespace, namespace if local is None else local)  # noqa: S102 - the guide's code
    return namespace


def find(seed: str, stem: str) -> str:
    [path] = sorted((BLOCKS / seed).glob(f"[0-9][0-9]_{stem}.py"))
    return path.stem


def collected(condition: Callable[[], bool]) -> Callable[[], bool]:
    """``condition``, checked after a garbage collection (dropped sandboxes are stopped
    when collected)."""

    def check() -> bool:
        gc.collect()
        return condition()

    return check


def left() -> list[str]:
    """The sandboxes left under the process root the test gave us."""
    return sandbox_dirs(Path(os.environ["ASYNCSANDBOX_PROCESS_ROOT"]))


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class Context:
    """One block's run: its spelling's compat module and the scaffolding."""

    def __init__(self, seed: str, name: str) -> None:
        self.seed, self.name = seed, name
        self.spelling = seed.split("_")[0]  # "cwsandbox" or "aviato"
        import importlib

        self.sdk: Any = importlib.import_module(f"asyncsandbox.compat.{self.spelling}")

    def namespace(self, **names: Any) -> Namespace:
        return {"__name__": f"seed_{self.seed}_{self.name}", self.spelling: self.sdk, **names}

    def session(self, *args: Any, **kwargs: Any) -> Any:
        return self.sdk.Session(*args, **kwargs)


# -- scaffolding: a scripted model and its tool calls ---------------------------------------


class ScriptedModel:
    """NOT a model: replays a fixed script of tool calls per task (chosen by the task's
    prompt), one per ``generate`` call; then answers with text and no tool call."""

    SCRIPTS: ClassVar[dict[str, list[list[dict[str, str]]]]] = {
        "greet": [
            [{"name": "write_file", "path": "greet.sh", "content": "echo hello\n"}],
            [{"name": "bash", "command": "sh greet.sh"}],
            [{"name": "read_file", "path": "greet.sh"}],
        ],
        "greet-wrong": [
            [{"name": "write_file", "path": "greet.sh", "content": "echo bye\n"}],
            [{"name": "bash", "command": "sh greet.sh; ls missing-dir"}],
        ],
    }

    def generate(self, messages: list[dict[str, str]]) -> str:
        script = self.SCRIPTS[messages[0]["content"].split(":")[0]]
        turn = sum(m["role"] == "assistant" for m in messages)
        return json.dumps(script[turn]) if turn < len(script) else "Done."


def parse_tool_calls(response: str) -> list[types.SimpleNamespace]:
    """The tool calls in a response of :class:`ScriptedModel` (none in plain text)."""
    try:
        calls = json.loads(response)
    except ValueError:
        return []
    return [types.SimpleNamespace(**call) for call in calls]


TEST_COMMAND = ["sh", "-c", 'test "$(sh greet.sh)" = hello']
TASKS = [
    {"prompt": "greet: make greet.sh print hello", "test_command": TEST_COMMAND},
    {"prompt": "greet-wrong: make greet.sh print hello", "test_command": TEST_COMMAND},
]


def check_episode(messages: list[dict[str, str]], reward: float, solved: bool) -> None:
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    check(tools[0] == "File written successfully", f"write_file: {tools[0]!r}")
    if solved:
        check(reward == 1.0, f"reward {reward}")
        check(tools[1] == "exit=0\nhello\n", f"bash observation: {tools[1]!r}")
        check(tools[2] == "echo hello\n", f"read_file observation: {tools[2]!r}")
    else:
        check(reward == 0.0, f"reward {reward}")
        check(tools[1].startswith("exit=2\nbye\nls: "), f"bash observation: {tools[1]!r}")
        check("No such file or directory" in tools[1], tools[1])
    check(messages[-1] == {"role": "assistant", "content": "Done."}, "the episode ended")


# -- scenarios, one per block kind ------------------------------------------------------------


def core_pattern(ctx: Context) -> None:
    ns = run_block(ctx.seed, ctx.name, ctx.namespace(parse_tool_calls=parse_tool_calls))
    with ctx.session() as session:
        for task, solved in zip(TASKS, (True, False), strict=True):
            sandbox = session.sandbox()
            messages, reward = ns["run_agent_episode"](ScriptedModel(), task, sandbox)
            check_episode(messages, reward, solved)
            print(f"{task['prompt']}: reward={reward}, {len(messages)} messages")
            sandbox.stop().result()


def training_step(ctx: Context) -> None:
    ns = ctx.namespace(parse_tool_calls=parse_tool_calls)
    run_block(ctx.seed, find(ctx.seed, "core_pattern"), ns)
    run_block(ctx.seed, ctx.name, ns)
    with ctx.session() as session:
        rewards = ns["training_step"](ScriptedModel(), TASKS, session)
        check(rewards == [1.0, 0.0], f"rewards {rewards}")
        eventually(
            collected(lambda: session.sandbox_count == 0), within=20, what="every sandbox stopped"
        )
    check(left() == [], "sandboxes left")
    print(f"rewards: {rewards}")


def make_defaults(ctx: Context) -> None:
    for variable in ("WANDB_RUN_ID", "SLURM_JOB_ID"):
        os.environ.pop(variable, None)
    ns = run_block(ctx.seed, ctx.name, ctx.namespace())
    defaults = ns["make_defaults"]("qwen-0.5b")
    expected = ("wandb-run:local", "slurm-job:interactive", "model:qwen-0.5b", "rl-training")
    check(defaults.tags == expected, f"tags {defaults.tags}")
    with ctx.session(defaults) as session:
        sandbox = session.sandbox()
        sandbox.start().result()
        found = ctx.sdk.Sandbox.list(tags=["rl-training", "model:qwen-0.5b"]).result()
        check([s.sandbox_id for s in found] == [sandbox.sandbox_id], f"listed {found}")
        check(found[0].tags == expected, f"listed tags {found[0].tags}")
    print(f"tags: {expected}")


class RecordingLocals(dict[str, Any]):
    """The module namespace of the reward-function excerpt: it records each completion's
    reward as the guide's loop computes it, and supplies ``pending`` (which the excerpt
    uses without showing its assignment: the list of processes still running)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[Any, float]] = []

    def __missing__(self, key: str) -> Any:
        if key == "pending":
            self["pending"] = list(self["processes"])
            return self["pending"]
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key == "reward":
            self.arrivals.append((self["process"], value))


def reward_function_excerpt(ctx: Context) -> None:
    job = os.urandom(4).hex()
    session = ctx.session(ctx.sdk.SandboxDefaults(container_image="python:3.11"))
    scaffold = ctx.namespace(
        session=session,
        completions=[code for _, code, _ in COMPLETIONS],
        EXECUTION_TIMEOUT_SECONDS=10.0,
    )
    local = RecordingLocals()
    rule = "-" * 60
    print(f"RL Training Reward Function Example (job: {job})")
    print("=" * 60)
    print(f"\nEvaluating {len(COMPLETIONS)} completions...\n")
    print("Progress (results arrive as executions complete):")
    print(rule)
    started = time.monotonic()
    run_block(ctx.seed, ctx.name, scaffold, local)
    rewards: dict[int, float] = {}
    processes = local["processes"]
    for n, (process, reward) in enumerate(local.arrivals, 1):
        index = next(i for i, p in enumerate(processes) if p is process)
        rewards[index] = reward
        verdict = "PASS" if reward == 1.0 else "FAIL"
        print(f"  [{n}/{len(COMPLETIONS)}] Problem {index} ({COMPLETIONS[index][0]}): {verdict}")
    print(rule)
    print("\nFinal summary (original order):")
    print(rule)
    for index, (problem, _, expected) in enumerate(COMPLETIONS):
        reward = rewards[index]
        verdict = "PASS" if reward == 1.0 else "FAIL"
        ok = "OK" if reward == expected else "UNEXPECTED"
        print(f"  Problem {index} ({problem}): reward={reward} [{verdict}] {ok}")
    print(rule)
    total = sum(rewards.values())
    passed = sum(1 for r in rewards.values() if r == 1.0)
    print(f"Total reward: {total}/{len(COMPLETIONS)}")
    print(f"Pass rate: {passed}/{len(COMPLETIONS)} ({100 * passed // len(COMPLETIONS)}%)")
    outcomes = {i: rewards[i] for i in range(len(COMPLETIONS))}
    wanted = {i: expected for i, (_, _, expected) in enumerate(COMPLETIONS)}
    check(outcomes == wanted, f"rewards {outcomes}, the guide's {wanted}")
    # In parallel: the slowest completion sleeps 1.5 s, all five together take little more.
    check(time.monotonic() - started < 30, "the completions did not run in parallel")
    check(len(local.arrivals) == len(COMPLETIONS), "a result was lost")
    session.close().result()


def trl_call(reward_fn: Callable[..., list[float]], completions: list[Any]) -> list[float]:
    """Call a reward function the way TRL's GRPOTrainer does."""
    return reward_fn(
        prompts=["Print 6*7."] * len(completions),
        completions=completions,
        completion_ids=[[1, 2, 3]] * len(completions),
        trainer_state=object(),
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
    )


def check_reward_fn(ctx: Context, reward_fn: Callable[..., list[float]], session: Any) -> None:
    texts = [text for text, _ in ANSWERS]
    expected = [reward for _, reward in ANSWERS]
    conversational = "isinstance(c, list)" in block_path(ctx.seed, ctx.name).read_text()
    for call in range(1, 4):  # a reward function is called at every training step
        if conversational and call == 2:
            completions: list[Any] = [[{"role": "assistant", "content": t}] for t in texts]
        else:
            completions = texts
        rewards = trl_call(reward_fn, completions)
        check(rewards == expected, f"call {call}: rewards {rewards}, expected {expected}")
        with_code = [t for t in texts if "<answer>" in t]
        passed = sum(1 for r in rewards if r == 1.0)
        print(
            f"  [{'CWSandbox' if ctx.spelling == 'cwsandbox' else 'Aviato'}] Reward call {call}: "
            f"{len(with_code)} sandboxes, {passed}/{len(with_code)} passed, "
            f"{len(texts) - len(with_code)} skipped (no code)"
        )
        # The guide's pattern never stops these sandboxes: they go once collected.
        eventually(
            collected(lambda: session.sandbox_count == 0),
            within=20,
            what="the reward's sandboxes stopped",
        )
        eventually(
            collected(lambda: left() == []),
            within=20,
            what="the reward's sandboxes removed",
        )


def trl_reward_fn(ctx: Context) -> None:
    ns = run_block(ctx.seed, ctx.name, ctx.namespace())
    session = ns["session"]  # created at module level by the block, never closed
    check(session.defaults.tags == ("trl-grpo",), "the block's defaults")
    check(ns["extract_xml_answer"]("x <answer> print(1) </answer> y") == "print(1)", "extract")
    check_reward_fn(ctx, ns["reward_fn"], session)


def trl_grpo_integration_reward(ctx: Context) -> None:
    defaults = ctx.sdk.SandboxDefaults(container_image="python:3.11", tags=("trl-grpo",))
    session = ctx.session(defaults)
    ns = run_block(
        ctx.seed, ctx.name, ctx.namespace(session=session, EXECUTION_TIMEOUT_SECONDS=10.0)
    )
    check_reward_fn(ctx, ns["code_execution_reward"], session)
    session.close().result()


def trl_system_prompt(ctx: Context) -> None:
    ns = run_block(ctx.seed, ctx.name, ctx.namespace())
    prompt = ns["SYSTEM_PROMPT"]
    check("<answer>" in prompt, "the prompt asks for <answer> tags")
    # The example answer of the prompt scores 1.0 through the guide's reward function.
    session = ctx.session()
    reward_ns = ctx.namespace(session=session, EXECUTION_TIMEOUT_SECONDS=10.0)
    run_block(ctx.seed, find(ctx.seed, "trl_grpo_integration_reward"), reward_ns)
    example = prompt.split("like this: ")[1].splitlines()[0]
    check(reward_ns["extract_xml_answer"](example) == 'print("hello")', example)
    rewards = trl_call(reward_ns["code_execution_reward"], [example])
    check(rewards == [1.0], f"the prompt's example scored {rewards}")
    session.close().result()
    print(f"example answer {example!r}: reward {rewards[0]}")


def error_handling(ctx: Context) -> None:
    ns = run_block(ctx.seed, ctx.name, ctx.namespace())
    execute_tool = ns["execute_tool"]

    def tool(name: str, **args: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(name=name, **args)

    with ctx.session() as session:
        sandbox = session.sandbox()
        # The guide's bash limit is 30 s: run the timeout beside the other calls.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(execute_tool, sandbox, tool("bash", command="sleep 120"))
            cases = [
                (tool("bash", command="echo hi; echo err >&2"), "exit=0\nhi\nerr\n"),
                (
                    tool("write_file", path="notes.txt", content="first line\n"),
                    "File written successfully",
                ),
                (tool("read_file", path="notes.txt"), "first line\n"),
                (tool("read_file", path="missing.txt"), "Error: not found: /workspace/missing.txt"),
                (tool("read_file", path="/workspace"), "Error: is a directory: /workspace"),
                (tool("bash", command="exit 4"), "exit=4\n"),
            ]
            for call, expected in cases:
                observation = execute_tool(sandbox, call)
                check(observation == expected, f"{call}: {observation!r} != {expected!r}")
                print(f"{call.name}: {observation!r}")
            timed_out = slow.result(timeout=120)
        check(timed_out == "Error: command timed out after 30 seconds", repr(timed_out))
        print(f"bash sleep 120: {timed_out!r}")


@contextlib.contextmanager
def offline_wandb(ctx: Context) -> Iterator[Any]:
    """An offline W&B run (nothing leaves the machine); yields the wandb module. Checks,
    once the run is closed, that it received the spelling's metric names."""
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    os.environ.setdefault("WANDB_DIR", os.environ["SEED_RUNNER_TMP"])
    import wandb

    yield wandb
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()


def wandb_records(expected: list[str]) -> None:
    [log] = list(Path(os.environ["WANDB_DIR"]).rglob("*.wandb"))
    data = log.read_bytes()
    for name in expected:
        check(name.encode() in data, f"{name} was not logged to W&B")
    print(f"logged to W&B: {', '.join(expected)}")


def metric_names(ctx: Context) -> list[str]:
    p = ctx.spelling
    ok = "exec_completed_ok" if p == "cwsandbox" else "exec_successes"
    return [
        f"{p}/executions",
        f"{p}/{ok}",
        f"{p}/avg_execs_per_sandbox",
        f"{p}/max_execs_per_sandbox",
    ]


def wandb_auto_detection(ctx: Context) -> None:
    with offline_wandb(ctx):
        ns = ctx.namespace(
            defaults=ctx.sdk.SandboxDefaults(container_image="python:3.11"),
            num_steps=3,
            code="print('step')",
        )
        run_block(ctx.seed, ctx.name, ns)
        check(ns["session"].sandbox_count == 0, "the session closed")
    wandb_records(metric_names(ctx))
    check(left() == [], "sandboxes left")


class Assignments(dict[str, Any]):
    """A namespace that keeps every value assigned to ``session``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sessions: list[Any] = []

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key == "session":
            self.sessions.append(value)


def wandb_explicit_control(ctx: Context) -> None:
    defaults = ctx.sdk.SandboxDefaults(container_image="python:3.11")
    with offline_wandb(ctx):
        import wandb

        wandb.init(project="seed-explicit-control")
        local = Assignments()
        # Session comes from the import of the section's previous block (auto-detection).
        ns = ctx.namespace(defaults=defaults, Session=ctx.sdk.Session)
        run_block(ctx.seed, ctx.name, ns, local)
        explicit, disabled, auto = local.sessions
        for session, logs in ((explicit, True), (disabled, False), (auto, True)):
            session.sandbox().exec(["true"]).result()
            check(session.log_metrics(step=1) is logs, f"{session}: logged != {logs}")
            session.close().result()
        check(disabled.get_metrics() == {}, "report_to=[] reports nothing")
        print("report_to=['wandb']: logged; report_to=[]: not logged; report_to=None: logged")
    wandb_records([f"{ctx.spelling}/executions"])


def wandb_training_step(ctx: Context) -> None:
    ns = run_block(ctx.seed, ctx.name, ctx.namespace())
    batch = [{"code": "print('ok')"}, {"code": "raise SystemExit(2)"}, {"code": "print(1 +)"}]
    with offline_wandb(ctx) as wandb:
        wandb.init(project="seed-training-step")
        with ctx.session() as session:
            for step in range(2):
                rewards = ns["training_step"](session, None, batch, step)
                check(rewards == [1.0, 0.0, 0.0], f"step {step}: rewards {rewards}")
                metrics = session.get_metrics()
                check(metrics[f"{ctx.spelling}/executions"] == 0, "logged, then reset")
                print(f"step {step}: rewards {rewards}")
    wandb_records(metric_names(ctx))


def wandb_exec_stats(ctx: Context) -> None:
    with ctx.session() as session:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            run_block(ctx.seed, ctx.name, ctx.namespace(session=session))
        printed = out.getvalue().strip()
        print(printed)
        expected = {
            "cwsandbox": {
                "exec_count": 1,
                "completed_ok": 1,
                "completed_nonzero": 0,
                "failures": 0,
            },
            "aviato": {"total": 1, "successes": 1, "failures": 0, "errors": 0},
        }[ctx.spelling]
        check(printed == str(expected), f"printed {printed}, the guide shows {expected}")


def wandb_log_metrics_no_reset(ctx: Context) -> None:
    with offline_wandb(ctx) as wandb:
        wandb.init(project="seed-no-reset")
        with ctx.session() as session:
            sandbox = session.sandbox()
            for _ in range(3):
                sandbox.exec(["true"]).result()
            run_block(ctx.seed, ctx.name, ctx.namespace(session=session, step=7))
            metrics = session.get_metrics()
            check(metrics[f"{ctx.spelling}/executions"] == 3, "reset=False keeps accumulating")
            check(metrics[f"{ctx.spelling}/max_execs_per_sandbox"] == 3, "per-sandbox counts")
            print(
                f"after log_metrics(step=7, reset=False): {metrics[f'{ctx.spelling}/executions']} executions"
            )
    wandb_records(metric_names(ctx))


def count_active_sandboxes(ctx: Context) -> None:
    ns = run_block(ctx.seed, ctx.name, ctx.namespace())
    with ctx.session(ctx.sdk.SandboxDefaults(tags=("wandb-run:abc123",))) as session:
        ours = [session.sandbox() for _ in range(2)]
        for sandbox in ours:
            sandbox.start().result()
        other = session.sandbox(tags=["extra"])
        other.start().result()
        stopped = session.sandbox()
        stopped.start().result()
        stopped.stop().result()
        elsewhere = ctx.sdk.Sandbox.run(tags=["wandb-run:other"])
        counts = ns["count_active_sandboxes"]("abc123")
        check(counts == {"running": 3, "pending": 0, "total": 3}, f"counts {counts}")
        check(
            ns["count_active_sandboxes"]("nobody") == {"running": 0, "pending": 0, "total": 0},
            "none",
        )
        elsewhere.stop().result()
        print(f"count_active_sandboxes('abc123') = {counts}")


def logged_reward(ctx: Context) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger()
    root.addHandler(Keep())
    root.setLevel(logging.DEBUG)
    ns = ctx.namespace()
    if ctx.spelling == "cwsandbox":
        # The guide assumes the module-level session and extract_xml_answer of its TRL block.
        run_block(ctx.seed, find(ctx.seed, "trl_reward_fn"), ns)
    else:
        ns["session"] = ctx.session()

        def extract_code(completion: str) -> str:
            return completion.split("<answer>")[-1].split("</answer>")[0].strip()

        ns["extract_code"] = extract_code
    run_block(ctx.seed, ctx.name, ns)
    rewards = [ns["logged_reward"](text, step) for step, (text, _) in enumerate(ANSWERS[:2])]
    check(rewards == [1.0, 0.0], f"rewards {rewards}")
    logged = [r for r in records if r.getMessage() == "Reward computation"]
    check(len(logged) == 2, f"{len(logged)} debug records")
    first = logged[0].__dict__
    check(isinstance(first["sandbox_id"], str) and first["sandbox_id"].startswith("p-"), "id")
    check((first["step"], first["returncode"], first["stdout_len"]) == (0, 0, 3), str(first))
    check(logged[1].__dict__["stderr_len"] > 0, "the syntax error's stderr")
    eventually(
        collected(lambda: ns["session"].sandbox_count == 0),
        within=20,
        what="logged_reward stops its sandboxes",
    )
    print(f"rewards {rewards}; debug records with sandbox_id {first['sandbox_id']}")


def art_rollout_tags(ctx: Context) -> None:
    problem = types.SimpleNamespace(task_id=11)
    ns = run_block(ctx.seed, ctx.name, ctx.namespace(job_id="a1b2c3d4", problem=problem))
    check(ns["tags"] == ("art-rollout", "job-a1b2c3d4", "problem-11"), str(ns["tags"]))
    sandbox = ctx.sdk.Sandbox.run(tags=ns["tags"])  # as the guide's rollout does
    try:
        found = ctx.sdk.Sandbox.list(tags=["job-a1b2c3d4", "problem-11"]).result()
        check([s.sandbox_id for s in found] == [sandbox.sandbox_id], "listed by its tags")
    finally:
        sandbox.stop().result()
    print(f"tags {ns['tags']}: sandbox {sandbox.sandbox_id} found by them")


def art_sandbox_defaults(ctx: Context) -> None:
    args = argparse.Namespace(project=f"{ctx.spelling}-mbpp", run_name="train-001")
    ns = run_block(
        ctx.seed, ctx.name, ctx.namespace(SandboxDefaults=ctx.sdk.SandboxDefaults, args=args)
    )
    with ctx.session(ns["sandbox_defaults"]) as session:
        sandbox = session.sandbox()
        result = sandbox.exec(["echo", "rollout"]).result()
        check(result.stdout == "rollout\n", repr(result.stdout))
        check(sandbox.tags == ("art-training", args.project, args.run_name), str(sandbox.tags))
    print(f"sandbox tagged {sandbox.tags}")


def art_rollout_tools(ctx: Context) -> None:
    # openai's type when it is installed (the agent integrations bring it), else a dict.
    tool_param: object
    try:
        tool_param = importlib.import_module("openai.types.chat").ChatCompletionToolParam
    except ImportError:
        tool_param = dict
    ns = run_block(ctx.seed, ctx.name, ctx.namespace(ChatCompletionToolParam=tool_param))
    [tool] = ns["ROLLOUT_TOOLS"]
    check(tool["function"]["name"] == "execute_code", str(tool))
    check(tool["function"]["parameters"]["required"] == ["code"], str(tool))
    print(f"ROLLOUT_TOOLS: {[t['function']['name'] for t in ns['ROLLOUT_TOOLS']]}")


def compile_only(ctx: Context) -> None:
    """Blocks that cannot run here: compiled (as the body of an async function where they
    ``return``), with the names they use listed."""
    path = block_path(ctx.seed, ctx.name)
    source = path.read_text()
    try:
        code = compile_block(ctx.seed, ctx.name)
    except SyntaxError:  # `return` at the top level: an excerpt of a function body
        code = compile("async def excerpt():\n" + indented(source), str(path), "exec")
    tree = ast.parse("async def _():\n" + indented(source), str(path))
    names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)})
    check(code.co_filename == str(path), "compiled")
    try:
        import art  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        print(
            f"compiled; not run: needs openpipe-art (not installed), a GPU or the Tinker API; names used: {', '.join(names)}"
        )
    else:  # pragma: no cover - openpipe-art is not a dependency of this repository
        print("compiled; openpipe-art is installed, but training needs a GPU or the Tinker API")


def indented(source: str) -> str:
    return "".join(f"    {line}\n" for line in source.splitlines())


SCENARIOS: dict[str, Callable[[Context], None]] = {
    "core_pattern": core_pattern,
    "training_step": training_step,
    "make_defaults": make_defaults,
    "reward_function_excerpt": reward_function_excerpt,
    "trl_reward_fn": trl_reward_fn,
    "trl_grpo_integration_reward": trl_grpo_integration_reward,
    "trl_system_prompt": trl_system_prompt,
    "error_handling": error_handling,
    "wandb_auto_detection": wandb_auto_detection,
    "wandb_explicit_control": wandb_explicit_control,
    "wandb_training_step": wandb_training_step,
    "wandb_exec_stats": wandb_exec_stats,
    "wandb_execution_stats": wandb_exec_stats,
    "wandb_log_metrics_no_reset": wandb_log_metrics_no_reset,
    "count_active_sandboxes": count_active_sandboxes,
    "logged_reward": logged_reward,
    "art_rollout_tags": art_rollout_tags,
    "art_key_imports": compile_only,
    "art_rollout_trajectory": compile_only,
    "art_rollout_tools": art_rollout_tools,
    "art_sandbox_defaults": art_sandbox_defaults,
}


def scenario_of(name: str) -> Callable[[Context], None]:
    return SCENARIOS[name.split("_", 1)[1]]


def main() -> int:
    seed, name = sys.argv[1], sys.argv[2]
    scenario_of(name)(Context(seed, name))
    gc.collect()
    print(f"OK {seed}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
