"""``python -m bench interpreter``: the code interpreter (``Sandbox.run_code``) against a
``python3 -c`` command per step, on the process backend and on Docker, in one run.

* ``round trip``: in one started sandbox, a warm ``run_code("1 + 1")`` (the runner and its
  default context started) against ``exec(["python3", "-c", "print(1 + 1)"])`` (the
  backend's fast path warm), the two alternating, ``--samples`` each.
* ``episode``: a 20-step agent episode whose steps build on each other (imports, a
  dataset, statistics of it, a model fitted to it, a report), as ``run_code`` steps (the
  state stays in the interpreter's variables) against re-running the script so far as one
  ``exec`` per step (``python3 -c`` of steps 1..i: what an agent without an interpreter
  does, the state rebuilt every step). ``--episodes`` each, alternating, each in a fresh
  sandbox whose start is not counted (the interpreter's start is: its first step pays it).
  Both variants must print the same final report.

Reported per backend: p50 and p99 of each, and the ratio of the command's p50 to the
interpreter's. Before measuring, the run waits (bounded) for other processes to leave the
CPUs, and it records the share of the machine they used meanwhile (``bench/_cpu.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from asyncsandbox import Sandbox, Session

from . import _cpu, _machine
from ._stats import summary

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE = "asyncsandbox-test:bookworm-2"
BACKENDS = ("process", "docker")

STEPS = (
    "import json, math, statistics, random",
    "random.seed(7)",
    "rows = [{'id': i, 'x': random.uniform(0, 100)} for i in range(20000)]",
    "for r in rows:\n    r['y'] = 3.0 * r['x'] + 5.0 + random.gauss(0, 2)",
    "xs = [r['x'] for r in rows]; ys = [r['y'] for r in rows]",
    "mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)",
    "print(f'mean x {mean_x:.3f}, mean y {mean_y:.3f}')",
    "var_x = sum((x - mean_x) ** 2 for x in xs)",
    "cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))",
    "slope = cov / var_x; intercept = mean_y - slope * mean_x",
    "print(f'fit: y = {slope:.3f} x + {intercept:.3f}')",
    "residuals = [y - (slope * x + intercept) for x, y in zip(xs, ys)]",
    "rmse = math.sqrt(statistics.fmean(r * r for r in residuals))",
    "outliers = [r['id'] for r, e in zip(rows, residuals) if abs(e) > 3 * rmse]",
    "buckets = {}\nfor x in xs:\n    buckets[int(x // 10)] = buckets.get(int(x // 10), 0) + 1",
    "top = sorted(buckets.items(), key=lambda kv: -kv[1])[:3]",
    "summary = {'slope': round(slope, 2), 'rmse': round(rmse, 2), 'outliers': len(outliers)}",
    "summary['top_buckets'] = [k for k, _ in top]",
    "report = json.dumps(summary, sort_keys=True)",
    "print(report)",
)
"""The episode: 20 steps, each using what the steps before it made."""


@asynccontextmanager
async def session(backend: str, image: str, root: Path) -> AsyncIterator[Session]:
    if backend == "docker":
        from asyncsandbox_docker import DockerBackend

        async with Session(DockerBackend(default_image=image), sweep=False) as s:
            yield s
    else:
        async with Session("process", backend_options={"root": root}, sweep=False) as s:
            yield s


async def round_trips(sandbox: Sandbox, samples: int, warmup: int) -> dict[str, Any]:
    code: list[float] = []
    command: list[float] = []
    argv = ["python3", "-c", "print(1 + 1)"]
    for i in range(warmup + samples):
        started = time.perf_counter()
        execution = await sandbox.run_code("1 + 1")
        middle = time.perf_counter()
        result = await sandbox.exec(argv)
        ended = time.perf_counter()
        if execution.text != "2" or execution.error is not None:
            raise RuntimeError(f"run_code answered {execution!r}")
        if result.returncode != 0 or result.stdout != b"2\n":
            raise RuntimeError(f"exec answered {result!r}")
        if i >= warmup:
            code.append(middle - started)
            command.append(ended - middle)
    return {"run_code": summary(code), "exec": summary(command)}


async def stateful_episode(sandbox: Sandbox) -> tuple[float, list[float], str]:
    steps: list[float] = []
    last = ""
    for step in STEPS:
        started = time.perf_counter()
        execution = await sandbox.run_code(step, timeout=120)
        steps.append(time.perf_counter() - started)
        if execution.error is not None:
            raise RuntimeError(f"step {step!r}: {execution.error}")
        last = "".join(execution.logs.stdout) or last
    return sum(steps), steps, last.strip().splitlines()[-1]


async def rerun_episode(sandbox: Sandbox) -> tuple[float, list[float], str]:
    steps: list[float] = []
    last = ""
    for i in range(len(STEPS)):
        script = "\n".join(STEPS[: i + 1])
        started = time.perf_counter()
        result = await sandbox.exec(["python3", "-c", script], timeout=120)
        steps.append(time.perf_counter() - started)
        if result.returncode != 0:
            raise RuntimeError(f"steps 1..{i + 1}: {result.stderr_text[-500:]}")
        last = result.stdout_text or last
    return sum(steps), steps, last.strip().splitlines()[-1]


async def measure(backend: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    async with session(backend, args.image, root) as s:
        async with s.sandbox() as sandbox:
            await sandbox.exec(["true"])
            trips = await round_trips(sandbox, args.samples, args.warmup)
        totals: dict[str, list[float]] = {"run_code": [], "rerun": []}
        steps: dict[str, list[float]] = {"run_code": [], "rerun": []}
        reports: set[str] = set()
        for _ in range(args.episodes):
            for variant, episode in (("run_code", stateful_episode), ("rerun", rerun_episode)):
                async with s.sandbox() as sandbox:
                    await sandbox.exec(["true"])  # started, its command path warm
                    total, per_step, report = await episode(sandbox)
                totals[variant].append(total)
                steps[variant] += per_step
                reports.add(report)
        if len(reports) != 1:
            raise RuntimeError(f"the variants disagree: {sorted(reports)}")
    return {
        "round_trip": trips,
        "episode": {variant: summary(values) for variant, values in totals.items()},
        "episode_step": {variant: summary(values) for variant, values in steps.items()},
        "report": reports.pop(),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "command": "uv run python -m bench interpreter " + " ".join(args.argv),
        "machine": _machine.machine(),
        "parameters": {
            "samples": args.samples,
            "warmup": args.warmup,
            "episodes": args.episodes,
            "steps": len(STEPS),
            "image": args.image,
        },
        "backends": {},
    }
    busy = await anyio.to_thread.run_sync(lambda: _cpu.wait_quiet(limit=args.quiet_wait))
    result["machine_busy_before"] = busy
    for backend in args.backends:
        root = Path("/var/lib/asyncsandbox") / f"bench-interpreter-{uuid.uuid4().hex[:6]}"
        before = _cpu.snapshot(os.getsid(0))
        try:
            measured = await measure(backend, args, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        measured["cpu_shares"] = _cpu.shares(before, _cpu.snapshot(os.getsid(0)))
        result["backends"][backend] = measured
        print(f"{backend}: {json.dumps(_figures(measured))}")
    return result


def _figures(measured: dict[str, Any]) -> dict[str, Any]:
    trip, episode = measured["round_trip"], measured["episode"]
    return {
        "run_code p50 ms": round(1000 * trip["run_code"]["p50"], 2),
        "exec p50 ms": round(1000 * trip["exec"]["p50"], 2),
        "round trip ratio": round(trip["exec"]["p50"] / trip["run_code"]["p50"], 1),
        "episode ratio": round(episode["rerun"]["p50"] / episode["run_code"]["p50"], 1),
    }


def _ms(stats: dict[str, Any]) -> str:
    return f"{1000 * stats['p50']:.1f} / {1000 * stats['p99']:.1f}"


def render(result: dict[str, Any]) -> str:
    p = result["parameters"]
    lines = [
        "# bench interpreter",
        "",
        f"`{result['command']}` on {_machine.short(result['machine'])}.",
        "",
        (
            f"Round trip: {p['samples']} samples each (after {p['warmup']} warm-up rounds), "
            'a warm `run_code("1 + 1")` and `exec(["python3", "-c", "print(1 + 1)"])` '
            f"alternating in one sandbox. Episode: {p['episodes']} episodes of {p['steps']} "
            "steps each way, alternating, a fresh sandbox each (its start not counted; the "
            "interpreter's start is, in its first step): `run_code` per step (state in the "
            "interpreter) against one `exec` of the script so far per step (state rebuilt). "
            "Ratios: the command's p50 over the interpreter's. The last column is the share "
            "of the machine's CPU used by processes outside the measuring process's session "
            "during the backend's measurements: other users of the machine, and the "
            "sandboxes' own processes (the runner, the `python3 -c` commands)."
        ),
        "",
        (
            "| backend | run_code p50 / p99 ms | exec p50 / p99 ms | round trip ratio | "
            "episode run_code p50 / p99 ms | episode re-run p50 / p99 ms | episode ratio | "
            "others' CPU share |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, m in result["backends"].items():
        trip, episode = m["round_trip"], m["episode"]
        lines.append(
            f"| {backend} | {_ms(trip['run_code'])} | {_ms(trip['exec'])} | "
            f"{trip['exec']['p50'] / trip['run_code']['p50']:.1f}x | "
            f"{_ms(episode['run_code'])} | {_ms(episode['rerun'])} | "
            f"{episode['rerun']['p50'] / episode['run_code']['p50']:.1f}x | "
            f"{m['cpu_shares'].get('other', 0):.2f} |"
        )
    lines += [
        "",
        "Per step of the episodes (p50 / p99 ms): "
        + "; ".join(
            f"{b}: run_code {_ms(m['episode_step']['run_code'])}, "
            f"re-run {_ms(m['episode_step']['rerun'])}"
            for b, m in result["backends"].items()
        )
        + ".",
        "",
        f"Both variants printed the same final report: `{next(iter(result['backends'].values()))['report']}`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench interpreter", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="process and/or docker")
    parser.add_argument("--samples", type=int, default=300, help="round trips of each kind")
    parser.add_argument("--warmup", type=int, default=20, help="round trips not counted")
    parser.add_argument("--episodes", type=int, default=10, help="episodes of each kind")
    parser.add_argument("--image", default=IMAGE, help="Docker image")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="wait up to this many seconds for other processes to leave the CPUs first",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args(argv)
    args.argv = argv
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends: {', '.join(sorted(unknown))}")
    result = anyio.run(run, args)
    out = args.out / f"interpreter-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    markdown = render(result)
    (out / "results.md").write_text(markdown)
    print(markdown)
    print(out)
    return 0
