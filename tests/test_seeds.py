"""Every Python block of the RL guides in the seeds runs on asyncsandbox.compat, unchanged
but for its imports, and does what its guide says.

The blocks are in tests/seed_blocks/<spelling>_<seed>/, copied from the guides (seed 000 is a
web page that lost its indentation and blank lines: only the indentation was restored).
tests/seed_runner.py runs each in its own process (``python -m tests.seed_runner``) on the
real process backend, with the names the guide leaves undefined supplied (a scripted model,
tasks, a session), and checks the outcome; here we check it passed and left no sandbox
behind.

Blocks that run ``["python", ...]`` need a ``python`` program in process sandboxes: until
the process backend provides it (next to ``python3``), they fail with exit status 127,
rewards of 0.0, and the runtime's command-not-found warning.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .seed_runner import BLOCKS, SCENARIOS, compile_only, scenario_of

REPO = Path(__file__).resolve().parent.parent
SEEDS = Path(os.environ.get("ASYNCSANDBOX_SEEDS_DIR", "/work/shared/seeds"))
ALL_BLOCKS = sorted(f"{p.parent.name}/{p.stem}" for p in BLOCKS.glob("*/[0-9][0-9]_*.py"))
# The blocks that run `python` (not `python3`) in a sandbox.
NEEDS_PYTHON = {
    "reward_function_excerpt",
    "trl_reward_fn",
    "trl_grpo_integration_reward",
    "trl_system_prompt",
    "wandb_training_step",
    "logged_reward",
}
CANNOT_RUN = {
    "art_key_imports": "needs openpipe-art and a training backend (a GPU or the Tinker API)",
    "art_rollout_trajectory": "needs openpipe-art and openai, and is a function body excerpt",
}


def test_the_blocks_of_every_guide_are_here() -> None:
    counts = {d.name: len(list(d.glob("[0-9][0-9]_*.py"))) for d in BLOCKS.iterdir() if d.is_dir()}
    assert counts == {"cwsandbox_000": 19, "aviato_001": 11, "aviato_002": 19}
    for block in ALL_BLOCKS:
        scenario_of(block.split("/")[1])  # every block has its scenario
    assert {n for n, f in SCENARIOS.items() if f is compile_only} == set(CANNOT_RUN)


# The error-handling blocks wait out the guide's 30 s bash timeout, and copies of an earlier
# guide's block add nothing to a default run: slow (CI runs them once).
WAITS_OUT_A_TIMEOUT = {"error_handling"}


def _copies() -> set[str]:
    """Blocks whose file is byte for byte a block of an earlier guide (the aviato guides
    share several): the default run runs the first; the slow suite runs the copies."""
    first: dict[bytes, str] = {}
    copies = set()
    for block in ALL_BLOCKS:
        text = (BLOCKS / f"{block}.py").read_bytes()
        if text in first:
            copies.add(block)
        first.setdefault(text, block)
    return copies


COPIES = _copies()


def _block_param(block: str) -> Any:
    kind = block.split("/")[1].split("_", 1)[1]
    slow = kind in WAITS_OUT_A_TIMEOUT or block in COPIES
    return pytest.param(block, marks=pytest.mark.slow) if slow else block


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", [_block_param(b) for b in ALL_BLOCKS])
def test_seed_block(block: str, process_root: Path, tmp_path: Path) -> None:
    seed, name = block.split("/")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WANDB_", "SLURM_", "ASYNCSANDBOX_BACKEND"))
    }
    env.update(ASYNCSANDBOX_PROCESS_ROOT=str(process_root), SEED_RUNNER_TMP=str(tmp_path))
    # The runner is a module of the tests package (it shares tests/_support/).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "tests.seed_runner", seed, name],
        capture_output=True,
        timeout=280,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    kind = name.split("_", 1)[1]
    if done.returncode != 0 and kind in NEEDS_PYTHON and "python: not found" in out + err:
        pytest.fail(
            f"{block} runs `python`, which process sandboxes do not have here (exit 127; they "
            f"have python3): it passes once the process backend provides `python`\n{out}\n{err}"
        )
    assert done.returncode == 0, f"{block} failed\n{out}\n{err}"
    assert out.splitlines()[-1] == f"OK {block}"
    assert "Traceback" not in err
    if kind == "reward_function_excerpt":  # the guide's expected output
        assert "Total reward: 3.0/5" in out
        assert "Pass rate: 3/5 (60%)" in out
        assert len(re.findall(r"^  \[\d/5\] Problem \d \(", out, re.MULTILINE)) == 5
        assert out.count("] OK") == 5
    if kind in CANNOT_RUN:
        assert "compiled; not run" in out
    # Nothing left behind: sandboxes never stopped by the guide's code are gone at exit.
    leftovers = (
        [n for n in os.listdir(process_root) if not n.startswith(".")]
        if process_root.exists()
        else []
    )
    assert leftovers == []


def _fenced(text: str) -> list[str]:
    return [
        m.group(1) for m in re.finditer(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    ]


def _mapped(line: str, module: str) -> str:
    line = re.sub(
        rf"^(\s*)import {module}$", rf"\1import asyncsandbox.compat.{module} as {module}", line
    )
    return re.sub(
        rf"^(\s*)from {module} import ", rf"\1from asyncsandbox.compat.{module} import ", line
    )


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the seed guides are not at {SEEDS}")
def test_the_blocks_are_the_guides_own_code() -> None:
    """Byte for byte (after the import mapping) for the Markdown guides; line for line,
    whitespace aside, for seed 000, whose page lost indentation and blank lines."""
    for seed, module in (("001", "aviato"), ("002", "aviato")):
        [guide] = SEEDS.glob(f"{seed}_*.txt")
        expected = [
            "\n".join(_mapped(l, module) for l in b.splitlines()) + "\n"
            for b in _fenced(guide.read_text())
        ]
        ours = [
            p.read_text() for p in sorted((BLOCKS / f"{module}_{seed}").glob("[0-9][0-9]_*.py"))
        ]
        assert ours == expected, seed
    [guide] = SEEDS.glob("000_*.txt")
    page = [_mapped(line, "cwsandbox").strip() for line in guide.read_text().splitlines()]
    joined = "\n".join(page)
    for path in sorted((BLOCKS / "cwsandbox_000").glob("[0-9][0-9]_*.py")):
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        assert "\n".join(lines) in joined, path.name
