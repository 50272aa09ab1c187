"""Every example in examples/ runs with its documented command, as a user runs it: a real
process on the embedded process backend (and on Docker under the ``docker`` marker), with
assertions on what it prints and writes."""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Self

import pytest

from ._support import docker_test_image

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_SCRIPTS = (
    "reward_function.py",
    "trl_grpo.py",
    "agent_rollouts.py",
    "swe_task_env.py",
    "mcp_client.py",
    "pydantic_ai_agent.py",
    "langchain_deep_agent.py",
    "openai_agents_shell.py",
    "smolagents_agent.py",
)
REWARD_CALL = re.compile(
    r"Reward call (\d+): (\d+) sandboxes, (\d+)/(\d+) passed(?:, (\d+) skipped \(no code\))?$"
)


def run_example(
    script: str,
    *args: str,
    root: Path,
    cwd: Path | None = None,
    timeout: float = 120,
    status: int = 0,
) -> tuple[str, str]:
    """``uv run examples/<script> <args>``, with this interpreter: (stdout, stderr). The
    example must exit with ``status``."""
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == status, f"{script} exited {done.returncode}\n{out}\n{err}"
    return out, err


def progress_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if re.match(r"\s+\[\d+/\d+\]", line)]


@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS)
def test_every_example_documents_how_to_run_it(script: str) -> None:
    docstring = ast.get_docstring(ast.parse((EXAMPLES / script).read_text())) or ""
    assert f"uv run examples/{script}" in docstring
    listed = (EXAMPLES.parent / "docs" / "examples.md").read_text()  # the README links it
    assert f"`uv run examples/{script}" in listed


# -- reward_function.py ---------------------------------------------------------------------


def check_reward_function(out: str, *, in_completion_order: bool = True) -> None:
    progress = progress_lines(out)
    assert len(progress) == 5
    if in_completion_order:
        # Printed as they complete: the instant ones before the ones that sleep (0.5 s at
        # least; each sandbox starts in tens of milliseconds on the process backend).
        assert "string-ops" in progress[0] or "syntax-error" in progress[0]
        assert "slow-" in progress[-1]
    assert "SyntaxError" in next(line for line in progress if "syntax-error" in line)
    assert "RuntimeError: model bug" in out
    summary = [
        "Problem 0 (slow-sum): reward=1.0 [PASS] OK",
        "Problem 1 (string-ops): reward=1.0 [PASS] OK",
        "Problem 2 (delayed-error): reward=0.0 [FAIL] OK",
        "Problem 3 (syntax-error): reward=0.0 [FAIL] OK",
        "Problem 4 (slow-list): reward=1.0 [PASS] OK",
    ]
    lines = [line.strip() for line in out.splitlines()]
    start = lines.index(summary[0])
    assert lines[start : start + 5] == summary  # the original order
    assert "Total reward: 3.0/5" in out
    assert "Pass rate: 3/5 (60%)" in out
    assert "Sandboxes: 5 started, 5 removed" in out


def test_reward_function(process_root: Path) -> None:
    out, _ = run_example("reward_function.py", root=process_root)
    check_reward_function(out)


@pytest.mark.docker
def test_reward_function_on_docker(docker_engine: None, process_root: Path) -> None:
    args = ("--backend", "docker", "--image", docker_test_image())
    out, _ = run_example("reward_function.py", *args, root=process_root)
    # A container takes a second or more to start under CI's load, more than the sleeps
    # that order the lines: the order is the process backend's test's to show.
    check_reward_function(out, in_completion_order=False)


# -- trl_grpo.py ----------------------------------------------------------------------------

# TRL's GRPOTrainer calls a reward function as
#   reward_func(prompts=..., completions=..., completion_ids=..., **reward_kwargs)
# where reward_kwargs holds the dataset's other columns, trainer_state, log_extra and
# log_metric; completions are strings (standard format) or lists of messages
# (conversational format). This script does exactly that, with torch, TRL and friends made
# unimportable: the reward function must not need them.
TRL_CONVENTION = r"""
import json, sys
for name in ("torch", "trl", "transformers", "datasets", "tokenizers", "accelerate"):
    sys.modules[name] = None  # import fails: as if not installed
sys.path.insert(0, sys.argv[1])
import trl_grpo
from asyncsandbox import SandboxDefaults
from asyncsandbox.sync import SyncSession

backend, image = sys.argv[2], sys.argv[3] or None
answers = [
    "Sure. <answer>print(6*7)</answer>",
    "<answer>print(6*7</answer>",
    "The answer is 42.",
    "<answer>import time; time.sleep(30)</answer>",
]
metrics = {}
with SyncSession(backend, defaults=SandboxDefaults(image=image)) as session:
    reward = trl_grpo.CodeExecutionReward(session, timeout=5)
    results = []
    standard = reward(
        prompts=["Print 6*7."] * 4,
        completions=answers,
        completion_ids=[[1, 2, 3]] * 4,
        problem_id=[0, 0, 0, 0],
        trainer_state=object(),
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: metrics.setdefault(name, value),
    )
    prompt = [{"role": "system", "content": "..."}, {"role": "user", "content": "Print 6*7."}]
    conversational = reward(
        prompts=[prompt] * 4,
        completions=[
            [{"role": "assistant", "content": answers[0]}],
            [{"role": "assistant", "content": [{"type": "text", "text": answers[1]}]}],
            [{"role": "assistant", "content": answers[2]}],
            [{"role": "assistant", "content": "<answer>print('hello')</answer>"}],
        ],
        completion_ids=[[1, 2, 3]] * 4,
        trainer_state=object(),
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
    )
print(json.dumps({
    "standard": standard,
    "conversational": conversational,
    "metrics": metrics,
    "loaded": [m for m in ("torch", "trl") if sys.modules.get(m) is not None],
    "__name__": reward.__name__,
}))
"""


def check_trl_reward_function(root: Path, backend: str, image: str) -> None:
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", TRL_CONVENTION, str(EXAMPLES), backend, image],
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, out + err
    lines = out.splitlines()
    result = json.loads(lines[-1])
    # 1.0: exits 0; 0.0: a syntax error, no code at all, a timeout.
    assert result["standard"] == [1.0, 0.0, 0.0, 0.0]
    assert result["conversational"] == [1.0, 0.0, 0.0, 1.0]
    assert result["metrics"] == {
        "sandbox/pass_rate": pytest.approx(1 / 3),
        "sandbox/with_code": 0.75,
    }
    assert result["loaded"] == []
    assert result["__name__"] == "sandbox_execution"
    calls = [REWARD_CALL.search(line) for line in lines]
    assert [m.group(0) for m in calls if m] == [
        "Reward call 1: 3 sandboxes, 1/3 passed, 1 skipped (no code)",
        "Reward call 2: 3 sandboxes, 2/3 passed, 1 skipped (no code)",
    ]


def test_trl_reward_function_with_trls_calling_convention(process_root: Path) -> None:
    check_trl_reward_function(process_root, "process", "")


@pytest.mark.docker
def test_trl_reward_function_on_docker(docker_engine: None, process_root: Path) -> None:
    check_trl_reward_function(process_root, "docker", docker_test_image())


@pytest.mark.slow  # a training run (when the examples-trl group is installed)
@pytest.mark.timeout(900)
def test_trl_grpo_training(process_root: Path) -> None:
    """The full training run: needs the examples-trl dependency group."""
    for module in ("torch", "trl", "transformers", "datasets", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{module} is not installed (uv sync --group examples-trl --find-links "
                "/opt/wheels --upgrade-package torch)"
            )
    out, err = run_example("trl_grpo.py", "--steps", "5", root=process_root, timeout=840)
    calls = [m for m in map(REWARD_CALL.search, out.splitlines()) if m]
    assert [int(m.group(1)) for m in calls] == [1, 2, 3, 4, 5], out
    for m in calls:
        sandboxes, passed, of = int(m.group(2)), int(m.group(3)), int(m.group(4))
        skipped = int(m.group(5) or 0)
        assert of == sandboxes
        assert 0 <= passed <= sandboxes
        assert sandboxes + skipped == 4  # one reward per generation: 4 per step
    total = sum(int(m.group(2)) for m in calls)
    passed_total = sum(int(m.group(3)) for m in calls)
    assert "'rewards/sandbox_execution/mean'" in out  # TRL logged our reward
    assert "Training completed successfully!" in out
    assert f"5 reward calls, {total} sandboxes, {passed_total} passed" in out
    assert f"{total} started, {total} removed" in out
    assert "Traceback" not in err


# -- agent_rollouts.py ----------------------------------------------------------------------


def check_agent_rollouts(out: str, err: str, jsonl: Path) -> None:
    assert "Policy: scripted (replays fixed tool calls; not a model)" in out
    assert len(progress_lines(out)) == 10
    assert "Collected 10 trajectories, avg reward: 0.50 (0 masked)" in out
    for task in ("9001", "9002", "9003", "9004", "9005"):
        assert f"{task}: [1.0, 0.0]" in out
    assert "Sandboxes: 10 created" in out
    # The step's metrics, as JSON lines on stderr (report_to=["log"]).
    metrics = [json.loads(line) for line in err.splitlines() if '"session.metrics"' in line]
    assert len(metrics) == 1
    assert metrics[0]["step"] == 1
    assert metrics[0]["asyncsandbox.sandboxes_created"] == 10
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 10
    for record in records:
        assert record["reward"] == (1.0 if record["trajectory"] % 2 == 0 else 0.0)
        assert not record["infrastructure_error"]
        assert record["metadata"]["submitted"]
        assert {t["function"]["name"] for t in record["tools"]} >= {"bash", "submit"}
        messages = record["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        # Every tool call is answered by a tool message with its id.
        asked = [c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]]
        answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert asked == answered
        observations = [m["content"] for m in messages if m["role"] == "tool"]
        if record["trajectory"] % 2 == 0:  # ran the draft, read the error, fixed it
            assert "SyntaxError" in observations[1]
            assert observations[3].startswith("exit=0\n")
            assert "example ok" in observations[3]
        assert observations[-1].startswith("Submitted: reward=")


def test_agent_rollouts(process_root: Path, tmp_path: Path) -> None:
    out, err = run_example(
        "agent_rollouts.py",
        "--policy",
        "scripted",
        "--output",
        "rollouts.jsonl",
        root=process_root,
        cwd=tmp_path,
    )
    check_agent_rollouts(out, err, tmp_path / "rollouts.jsonl")


@pytest.mark.docker
def test_agent_rollouts_on_docker(docker_engine: None, process_root: Path, tmp_path: Path) -> None:
    out, err = run_example(
        "agent_rollouts.py",
        "--policy",
        "scripted",
        "--output",
        "rollouts.jsonl",
        "--backend",
        "docker",
        "--image",
        docker_test_image(),
        root=process_root,
        cwd=tmp_path,
    )
    check_agent_rollouts(out, err, tmp_path / "rollouts.jsonl")


# -- swe_task_env.py ------------------------------------------------------------------------


def check_swe_task_env(out: str, jsonl: Path) -> None:
    assert "Policy: scripted (replays scripted_solution.json; not a model)" in out
    progress = progress_lines(out)
    assert len(progress) == 8
    by_episode = {line.split(":")[0].split("] ")[1]: line for line in progress}
    # The scripted solutions pass the hidden tests; the baselines fail them (the inventory
    # task gives partial credit through its reward file).
    assert "reward=1.00 (exit=0)" in by_episode["pagination-off-by-one #0"]
    assert "reward=0.00 (exit=1)" in by_episode["pagination-off-by-one #1"]
    assert "reward=1.00 (exit=0)" in by_episode["wordfreq-normalize #0"]
    assert "reward=1.00 (reward file)" in by_episode["inventory-two-bugs #0"]
    assert "reward=0.50 (reward file)" in by_episode["inventory-two-bugs #1"]
    assert "2/4 tests passed: reward 0.50" in by_episode["inventory-two-bugs #1"]
    # open-instruct's layout: the reward from /logs/verifier/reward.txt, partial credit.
    assert "reward=1.00 (reward file)" in by_episode["csv-column-total #0"]
    assert "reward=0.50 (reward file)" in by_episode["csv-column-total #1"]
    assert "csv-column-total: rewards [1.00, 0.50]" in out
    assert "inventory-two-bugs: rewards [1.00, 0.50]" in out
    assert "pagination-off-by-one: rewards [1.00, 0.00]" in out
    assert "wordfreq-normalize: rewards [1.00, 0.00]" in out
    assert "Average reward: 0.62 (8 episodes, 0 masked)" in out
    assert "Solved: 4/4 tasks" in out
    assert "Sandboxes: 8 started, 8 removed" in out
    records = {
        (r["task_id"], r["trajectory"]): r for r in map(json.loads, jsonl.read_text().splitlines())
    }
    assert len(records) == 8
    for (task, _), record in records.items():
        assert not record["infrastructure_error"]
        assert record["metadata"]["submitted"]
        tools = {t["function"]["name"] for t in record["tools"]}
        if task == "csv-column-total":  # open-instruct's tools
            assert tools == {"execute_bash", "str_replace_editor", "submit"}
        else:
            assert tools == {"bash", "read_file", "write_file", "str_replace_editor", "submit"}

    def observations(task: str, attempt: int) -> list[str]:
        messages = records[task, attempt]["messages"]
        return [m["content"] for m in messages if m["role"] == "tool"]

    # setup.sh ran in the workspace before the agent started: the sample data is there.
    assert "   4 the\n   3 The" in observations("wordfreq-normalize", 0)[0]
    assert "   7 the\n   3 mat" in observations("wordfreq-normalize", 0)[4]
    # The seed files are in the workspace, the hidden tests are not (until submit).
    listing = observations("pagination-off-by-one", 1)[0].splitlines()[1:]
    assert listing == [".", "./pagination.py", "./test_pagination.py"]
    listing = observations("wordfreq-normalize", 1)[0].splitlines()[1:]
    assert listing == [".", "./data", "./data/sample.txt", "./wordfreq.py"]
    # open-instruct's layout: environment/seeds/ and setup.sh's output, no tests.
    listing = observations("csv-column-total", 1)[0].splitlines()[1:]
    assert listing == [".", "./data", "./data/sales.csv", "./data/units.csv", "./report.py"]
    solved = observations("csv-column-total", 0)
    assert solved[0].startswith("Exit code: 1\nExecution output of [execute_bash]:\n[STDOUT]\n")
    assert "ValueError: invalid literal for int()" in solved[0]
    assert solved[1].startswith("Exit code: 0\n")
    assert "[STDOUT]\n/workspace/data\n" in solved[1]  # the shell stayed where it went
    assert solved[-1] == (
        "Test execution complete.\nExit code: 0\n[STDOUT]\n"
        "PASS column_total('data/units.csv', 'units') = 12.0 (expected 12)\n"
        "PASS column_total('data/sales.csv', 'amount') = 60.5 (expected 60.5)\n"
        "2/2 checks passed\n\n[STDERR]\n\nReward: 1.0"
    )
    # Every submission shows open-instruct's observation: exit code, output, reward.
    for record in records.values():
        assert observations(record["task_id"], record["trajectory"])[-1].startswith(
            "Test execution complete.\nExit code: "
        )


def test_swe_task_env(process_root: Path, tmp_path: Path) -> None:
    out, _ = run_example(
        "swe_task_env.py",
        "--policy",
        "scripted",
        "--output",
        "trajectories.jsonl",
        root=process_root,
        cwd=tmp_path,
    )
    assert (
        "wordfreq-normalize: the host system (its image python:3.12-slim applies on docker)" in out
    )
    check_swe_task_env(out, tmp_path / "trajectories.jsonl")


def copy_tasks(destination: Path, image: str) -> Path:
    """The example tasks, each naming ``image`` as its own."""
    tasks = destination / "swe_tasks"
    shutil.copytree(EXAMPLES / "swe_tasks", tasks)
    for task in tasks.iterdir():
        if task.is_dir():
            name = "image.txt" if (task / "image.txt").exists() else "image"
            (task / name).write_text(image + "\n")
    return tasks


def test_open_instruct_paths_are_mapped_and_only_those() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        swe_task_env: Any = importlib.import_module("swe_task_env")
    finally:
        sys.path.remove(str(EXAMPLES))
    mapped = swe_task_env.map_task_paths(
        'cd /tests && python3 /tests/t.py "/tests" >/logs/verifier/reward.txt\n'
        "open('/logs/verifier/reward.txt'); ls /tests; cd /tests\n"
        "/workspace/tests ../tests ~/tests $X/tests /testsuite /tests-old /logs.txt "
        "https://example.com/tests /usr/share/logs\n"
    )
    assert mapped == (
        "cd /tmp/asyncsandbox-task/tests && python3 /tmp/asyncsandbox-task/tests/t.py "
        '"/tmp/asyncsandbox-task/tests" >/tmp/asyncsandbox-task/logs/verifier/reward.txt\n'
        "open('/tmp/asyncsandbox-task/logs/verifier/reward.txt'); ls /tmp/asyncsandbox-task/tests; "
        "cd /tmp/asyncsandbox-task/tests\n"
        "/workspace/tests ../tests ~/tests $X/tests /testsuite /tests-old /logs.txt "
        "https://example.com/tests /usr/share/logs\n"
    )


@pytest.mark.parametrize(
    ("test_sh", "outcome"),
    [
        ("echo 1.7 > /logs/verifier/reward.txt; exit 1", "reward=1.00 (reward file)"),
        ("echo -2 > /logs/verifier/reward.txt", "reward=0.00 (reward file)"),
        ("test -d /tests && test -f /tests/test_outputs.py", "reward=1.00 (exit=0)"),
        ("exit 3", "reward=0.00 (exit=3)"),
    ],
    ids=["clamped-high", "clamped-low", "exit-0", "exit-3"],
)
def test_open_instruct_task_rewards(
    process_root: Path, tmp_path: Path, test_sh: str, outcome: str
) -> None:
    """The reward file, clamped to [0, 1], else the exit status, as open-instruct reads it;
    the agent's own reward file does not count."""
    tasks = shutil.copytree(EXAMPLES / "swe_tasks", tmp_path / "swe_tasks")
    task = tasks / "csv-column-total"
    (task / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test_sh}\n")
    solution = json.loads((task / "scripted_solution.json").read_text())
    cheat = [
        "I give myself full marks.",
        "execute_bash",
        {
            "command": "mkdir -p /tmp/asyncsandbox-task/logs/verifier && echo 1 > /tmp/asyncsandbox-task/logs/verifier/reward.txt"
        },
    ]
    (task / "scripted_solution.json").write_text(json.dumps([cheat, *solution]))
    args = ["--policy", "scripted", "--tasks", str(tasks), "--task", "csv-column-total"]
    out, _ = run_example("swe_task_env.py", *args, "--attempts", "1", root=process_root)
    assert f"csv-column-total #0: {outcome}" in out


def test_swe_task_env_masks_a_task_whose_setup_fails(process_root: Path, tmp_path: Path) -> None:
    tasks = shutil.copytree(EXAMPLES / "swe_tasks", tmp_path / "swe_tasks")
    (tasks / "wordfreq-normalize" / "setup.sh").write_text("echo broken >&2; exit 3\n")
    args = ["--policy", "scripted", "--tasks", str(tasks), "--task", "wordfreq-normalize"]
    out, _ = run_example("swe_task_env.py", *args, root=process_root, status=1)
    assert "MASKED (TaskSetupError: setup.sh failed (exit=3): broken)" in out
    assert "wordfreq-normalize: rewards [masked, masked]" in out
    assert "Average reward: 0.00 (2 episodes, 2 masked)" in out
    assert "Sandboxes: 2 started, 2 removed" in out


@pytest.mark.docker
def test_swe_task_env_on_docker_with_per_task_images(
    docker_engine: None, process_root: Path, tmp_path: Path
) -> None:
    # Every task names the test image as its own, while the fallback image does not exist
    # and nothing may be pulled: the run passes only if each sandbox uses its task's image.
    image = docker_test_image()
    tasks = copy_tasks(tmp_path, image)
    args: list[Any] = ["--policy", "scripted", "--output", "trajectories.jsonl"]
    args += ["--backend", "docker", "--tasks", str(tasks)]
    args += ["--image", "asyncsandbox-missing:none", "--backend-option", "pull=never"]
    out, _ = run_example("swe_task_env.py", *args, root=process_root, cwd=tmp_path)
    assert f"wordfreq-normalize: image {image}, setup.sh" in out
    check_swe_task_env(out, tmp_path / "trajectories.jsonl")


# -- --policy openai, against a fake OpenAI-compatible endpoint -----------------------------


class FakeChatCompletions:
    """A local ``/v1/chat/completions`` that answers like a model with tool calls: it
    lists the workspace, then submits. It records the requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def reply(self, request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(m["role"] == "assistant" for m in request["messages"])
        name, arguments = [("bash", {"command": "ls"}), ("submit", {})][min(turn, 1)]
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"id": "x", "object": "chat.completion", "choices": [{"message": message}]}

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                assert self.path == "/v1/chat/completions"
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(request)
                body = json.dumps(fake.reply(request)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_agent_rollouts_with_an_openai_endpoint(process_root: Path, tmp_path: Path) -> None:
    with FakeChatCompletions() as endpoint:
        out, _ = run_example(
            "agent_rollouts.py",
            "--policy",
            "openai",
            "--base-url",
            endpoint.base_url,
            "--model",
            "fake-model",
            "--num-problems",
            "1",
            "--output",
            "rollouts.jsonl",
            root=process_root,
            cwd=tmp_path,
        )
    assert "Collected 2 trajectories, avg reward: 0.00 (0 masked)" in out
    assert len(endpoint.requests) == 4  # 2 trajectories, 2 turns each
    first = next(r for r in endpoint.requests if len(r["messages"]) > 2)
    assert first["model"] == "fake-model"
    assert {t["function"]["name"] for t in first["tools"]} >= {"bash", "submit"}
    assert first["messages"][-1]["role"] == "tool"
    assert first["messages"][-1]["content"].startswith("exit=0\n")
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [r["metadata"]["submitted"] for r in records] == [True, True]


def test_swe_task_env_with_an_openai_endpoint(process_root: Path, tmp_path: Path) -> None:
    with FakeChatCompletions() as endpoint:
        out, _ = run_example(
            "swe_task_env.py",
            "--policy",
            "openai",
            "--base-url",
            endpoint.base_url,
            "--model",
            "fake-model",
            "--task",
            "pagination-off-by-one",
            "--attempts",
            "1",
            root=process_root,
            cwd=tmp_path,
        )
    assert "pagination-off-by-one: rewards [0.00]" in out  # it submitted the bug unchanged
    assert len(endpoint.requests) == 2
    observation = endpoint.requests[1]["messages"][-1]
    assert observation["role"] == "tool"
    assert observation["content"] == "exit=0\npagination.py\ntest_pagination.py\n"
    assert "10 items and 3 items per page" in endpoint.requests[0]["messages"][1]["content"]


# -- agent frameworks: one loop each, with a scripted model ----------------------------------
# Slow: each example imports its framework in a fresh interpreter (17-36 s each here under
# load); the adapters' own tests (tests/test_mcp.py, test_pydantic_ai.py, test_langchain.py,
# test_openai_agents.py) stay in the default run.


@pytest.mark.slow
def test_mcp_client(process_root: Path) -> None:
    out, _ = run_example("mcp_client.py", root=process_root)
    assert out.splitlines() == [
        "Tools: bash, read_file, write_file, str_replace_editor, run_code",
        "> write_file: Wrote 67 bytes to primes.py.",
        "> bash (error): exit=1 ... SyntaxError: '(' was never closed",
        (
            "> str_replace_editor: Edited primes.py. The changed lines, with context: ...      1\t"
            "print([n for n in range(2, 30) if all(n % d for d in range(2, n))])"
        ),
        "> bash: exit=0 ... [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]",
    ]
    assert_no_sandboxes(process_root)


@pytest.mark.slow
def test_pydantic_ai_agent(process_root: Path) -> None:
    out, _ = run_example("pydantic_ai_agent.py", root=process_root)
    lines = out.splitlines()
    assert [line.split(" ")[1] for line in lines if line.startswith("> ")] == [
        "write_file",
        "shell",
        "write_file",
        "shell",
    ]
    returns = [line for line in lines if line.startswith("< ")]
    assert returns[1] == "< exit=1 ... SyntaxError: '(' was never closed"
    assert returns[3] == "< exit=0 ... FizzBuzz"
    assert "Answer: Done. The last lines:" in out
    assert re.search(r"Workspace: WorkspaceRef\(provider='asyncsandbox', id='[^']+'\)", out)
    assert "Attached by ref: fizzbuzz.py has 119 bytes" in out
    assert_no_sandboxes(process_root)


@pytest.mark.slow
def test_langchain_deep_agent(process_root: Path) -> None:
    out, _ = run_example("langchain_deep_agent.py", root=process_root)
    assert "< AssertionError: -1 | [Command failed with exit code 1]" in out
    assert "< Successfully replaced 1 instance(s) of the string in '/workspace/calc.py'" in out
    assert "< ok | [Command succeeded with exit code 0]" in out
    assert "test_calc.py in the sandbox afterwards: exit=0 ok" in out
    assert_no_sandboxes(process_root)


@pytest.mark.slow
def test_openai_agents_shell(process_root: Path) -> None:
    out, _ = run_example("openai_agents_shell.py", root=process_root)
    assert out.splitlines() == [
        "$ ls *.py -> 0: c.py",
        "$ python3 a.py -> 0: 45",
        "$ python3 b.py -> 1: KeyError: 'missing'",
        "$ python3 c.py -> timeout: ",
        "Answer: b.py crashes (KeyError); c.py never ends; a.py prints 45.",
    ]
    assert_no_sandboxes(process_root)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("ASYNCSANDBOX_TEST_ROOTFS"),
    reason="set ASYNCSANDBOX_TEST_ROOTFS to a root filesystem (CI does): smolagents' tool "
    "code imports numpy and Pillow, which that Debian root filesystem has",
)
def test_smolagents_agent(process_root: Path) -> None:
    image = os.environ["ASYNCSANDBOX_TEST_ROOTFS"]
    out, _ = run_example("smolagents_agent.py", "--image", image, root=process_root)
    assert out.splitlines() == [
        "Step 1: printed '15 primes below 50'",
        "Step 2: error ZeroDivisionError: division by zero",
        "Step 3: final answer 328",
        "Answer: 328",
    ]
    assert_no_sandboxes(process_root)


def assert_no_sandboxes(root: Path) -> None:
    """Nothing the example made is left under its sandbox root."""
    import anyio

    from asyncsandbox import SandboxInfo, Session

    async def listed() -> list[SandboxInfo]:
        async with Session("process", backend_options={"root": str(root)}, sweep=False) as s:
            return await s.list()

    assert anyio.run(listed) == []
