"""``python -m bench``: run workloads on systems, write results, tables and plots."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from . import _daemon, _machine, _report
from ._orchestrate import Job, Run
from ._ours import features
from ._system import Unavailable
from ._systems import DOCKER_SYSTEMS, SYSTEMS

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE = "asyncsandbox-test:bookworm-2"
WORKLOADS = ("exec", "lifecycle", "rollout", "scale", "overhead")

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # A smoke run: every workload on every system in a few minutes.
    "quick": {
        "exec": {"sandboxes": 4, "concurrency": [1, 8], "commands": ["python", "true"],
                 "duration": 2.0},
        "lifecycle": {"concurrency": [4, 16], "count": 16},
        "rollout": {"rollouts": [32], "concurrency": [8]},
        "scale": {"docker_sizes": [20, 50], "process_sizes": [100, 300], "concurrency": 16,
                  "exec_samples": 8},
        "overhead": {"concurrency": [1, 64], "duration": 2.0, "libraries": ["asyncio", "trio"]},
    },
    # The definitions. Long: the rollout grid alone is hours on 2 cores.
    "full": {
        "exec": {"sandboxes": 32, "concurrency": [1, 8, 32, 128], "commands": ["python", "true"],
                 "duration": 15.0},
        "lifecycle": {"concurrency": [4, 16, 64], "count": 128},
        "rollout": {"rollouts": [64, 256, 1024], "concurrency": [8, 32, 64, 128]},
        "scale": {"docker_sizes": [100, 300, 600, 1000], "process_sizes": [1000, 2500, 5000],
                  "concurrency": 16, "exec_samples": 32},
        "overhead": {"concurrency": [1, 64], "duration": 10.0, "libraries": ["asyncio", "trio"]},
    },
}  # fmt: skip

DEFAULT_SYSTEMS: dict[str, tuple[str, ...]] = {
    "exec": (
        "asyncsandbox-docker", "asyncsandbox-docker-api", "asyncsandbox-docker-fast",
        "raw-aiodocker", "docker-py", "docker-cli", "asyncsandbox-process",
        "asyncsandbox-process-bwrap", "asyncsandbox-process-native", "asyncsandbox-process-fast",
        "asyncsandbox-process-gvisor", "asyncsandbox-docker-runsc", "host-spawn", "bwrap-spawn",
    ),
    "lifecycle": (
        "asyncsandbox-docker", "asyncsandbox-docker-pool", "raw-aiodocker", "docker-py",
        "docker-cli", "asyncsandbox-process", "asyncsandbox-process-gvisor",
        "asyncsandbox-docker-runsc",
    ),
    "rollout": (
        "asyncsandbox-docker", "asyncsandbox-docker-api", "asyncsandbox-docker-fast",
        "asyncsandbox-docker-pool", "raw-aiodocker", "docker-py", "docker-cli",
        "asyncsandbox-process", "asyncsandbox-process-gvisor", "asyncsandbox-docker-runsc",
    ),
    "scale": ("asyncsandbox-docker", "asyncsandbox-process"),
    "overhead": ("asyncsandbox-fake",),
}  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure asyncsandbox and its peers side by side (see bench/README.md).",
    )
    p.add_argument(
        "workloads",
        nargs="+",
        metavar="WORKLOAD",
        help="exec, lifecycle, rollout, scale, overhead or all; or `report RUN_DIR...` to "
        "re-render runs (and latest.md), or `cleanup` to remove every bench container",
    )
    preset = p.add_mutually_exclusive_group()
    preset.add_argument("--quick", dest="preset", action="store_const", const="quick",
                        help="scaled-down parameters: a smoke run (the default)")  # fmt: skip
    preset.add_argument("--full", dest="preset", action="store_const", const="full",
                        help="the issue's full parameters (long)")  # fmt: skip
    p.set_defaults(preset="quick")
    p.add_argument("--systems", type=_names, help="comma-separated systems (default: per workload)")
    p.add_argument(
        "--concurrency", type=_ints, help="concurrency levels (exec, lifecycle, rollout, overhead)"
    )
    p.add_argument("--rollouts", type=_ints, help="rollout counts R (rollout)")
    p.add_argument("--sandboxes", type=int, help="live sandboxes (exec)")
    p.add_argument("--commands", type=_names, help="python and/or true (exec)")
    p.add_argument("--duration", type=float, help="seconds per point (exec, overhead)")
    p.add_argument("--count", type=int, help="sandboxes per point (lifecycle)")
    p.add_argument("--sizes", type=_ints, help="live sandbox counts on Docker systems (scale)")
    p.add_argument(
        "--process-sizes", type=_ints, help="live sandbox counts on the process backend (scale)"
    )
    p.add_argument("--scale-concurrency", type=int, help="creating workers (scale)")
    p.add_argument("--libraries", type=_names, help="asyncio and/or trio (overhead)")
    p.add_argument("--pool-size", type=int, default=16, help="warm pool size (pool variant)")
    p.add_argument(
        "--count-fill",
        action="store_true",
        help="warm pools: measure from the session's start, the pool's fill included (else "
        "each point waits for a full pool)",
    )
    p.add_argument(
        "--ray-address",
        help="a running Ray cluster for asyncsandbox-ray (default: it starts a local one: a "
        "head and two workers of one CPU each, for each job)",
    )
    p.add_argument("--image", default=IMAGE, help=f"Docker image (default {IMAGE})")
    p.add_argument("--op-deadline", type=float, default=60.0,
                   help="seconds any single operation may take (default 60)")  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=RESULTS, help="results folder (default bench/results)"
    )
    p.add_argument("--no-restart", action="store_true",
                   help="do not restart a wedged daemon (stop measuring Docker instead)")  # fmt: skip
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="before each job, wait up to this many seconds for other processes to leave "
        "the CPUs (default 120; 0: do not wait)",
    )
    p.add_argument("--no-latest", action="store_true", help="do not rewrite latest.md")
    return p


def _parameters(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    params = dict(PRESETS[args.preset][workload])
    overrides = {
        "concurrency": args.concurrency,
        "rollouts": args.rollouts,
        "sandboxes": args.sandboxes,
        "commands": args.commands,
        "duration": args.duration,
        "count": args.count,
        "docker_sizes": args.sizes,
        "process_sizes": args.process_sizes,
        "libraries": args.libraries,
    }
    if workload == "scale" and args.scale_concurrency:
        params["concurrency"] = args.scale_concurrency
    for key, value in overrides.items():
        if value is not None and key in params:
            params[key] = value
    return params


def _jobs(workload: str, system: str, params: dict[str, Any], base: dict[str, Any]) -> Job:
    deadline = base["op_deadline"]
    config = {**base}
    if workload == "exec":
        points = [
            {"command": cmd, "concurrency": c, "duration": params["duration"]}
            for cmd in params["commands"]
            for c in params["concurrency"]
        ]
        budgets = {
            "open": 120.0,
            "setup": 120.0 + params["sandboxes"] * 10.0,
            "teardown": 120.0 + params["sandboxes"] * 5.0,
            "point": params["duration"] + 2 * deadline + 60.0,
        }
        return Job(workload, system, {"sandboxes": params["sandboxes"]}, points, budgets, config)
    if workload == "lifecycle":
        points = [{"concurrency": c, "count": params["count"]} for c in params["concurrency"]]
        budgets = {"open": 300.0, "point": 120.0 + params["count"] * 3.0}
        return Job(workload, system, {}, points, budgets, config)
    if workload == "rollout":
        points = [
            {"rollouts": r, "concurrency": c}
            for r in params["rollouts"]
            for c in params["concurrency"]
        ]
        budgets = {"open": 300.0, "point": 180.0 + max(params["rollouts"]) * 3.0}
        return Job(workload, system, {}, points, budgets, config)
    if workload == "scale":
        kind = SYSTEMS[system].kind
        sizes = sorted(params["process_sizes"] if kind == "process" else params["docker_sizes"])
        config["unbounded_live"] = True
        points = [{"sandboxes": n} for n in sizes]
        per_sandbox = 0.5 if kind == "process" else 2.0
        budgets = {
            "open": 120.0,
            "point": 180.0 + max(sizes) * per_sandbox + params["exec_samples"] * 10.0,
            "teardown": 180.0 + max(sizes) * per_sandbox,
        }
        setup = {"concurrency": params["concurrency"], "exec_samples": params["exec_samples"]}
        return Job(workload, system, setup, points, budgets, config)
    points = [
        {"library": lib, "concurrency": c, "duration": params["duration"]}
        for lib in params["libraries"]
        for c in params["concurrency"]
    ]
    budgets = {"open": 60.0, "point": params["duration"] + 120.0}
    return Job(workload, system, {}, points, budgets, config)


def _available(system: str, found: set[str]) -> str | None:
    """Why ``system`` cannot run here (None: it can), checked before spawning a worker."""
    if system == "asyncsandbox-fake":
        return None
    if system not in SYSTEMS:
        return f"unknown system (known: {', '.join(SYSTEMS)})"
    info = SYSTEMS[system]
    if info.kind == "docker" and "docker" not in found and system.startswith("asyncsandbox"):
        return "asyncsandbox-docker is not installed"
    if info.kind == "ray" and importlib.util.find_spec("asyncsandbox_ray") is None:
        return "asyncsandbox-ray is not installed (uv sync)"
    if system == "asyncsandbox-docker-fast" and "fast_path_default" in found:
        return "identical to asyncsandbox-docker here (DockerBackend's fast_path defaults to True)"
    try:
        from ._ours import DOCKER_VARIANTS

        variant = DOCKER_VARIANTS.get(system)
        if variant is not None:
            missing = set(variant.requires) - found
            if missing:
                return (
                    f"not in this runtime yet: {', '.join(sorted(missing))} ({variant.description})"
                )
    except Unavailable as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace, argv: list[str]) -> int:
    workloads = list(WORKLOADS) if "all" in args.workloads else list(args.workloads)
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        print(f"unknown workload(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    out_dir = args.out / run_id
    raw_dir = args.out / "raw" / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    command_line = "uv run --group bench python -m bench " + shlex.join(argv)
    the_run = Run(run_id, out_dir, raw_dir, restart=not args.no_restart, quiet_wait=args.quiet_wait)
    the_run.say(f"run {run_id}: {command_line}")
    machine = _machine.machine()
    the_run.say(f"machine: {_machine.short(machine)}")
    found = features()
    base = {
        "run_id": run_id,
        "image": args.image,
        "op_deadline": args.op_deadline,
        "process_root": str(the_run.process_root()),
        "pool_size": args.pool_size,
        "count_fill": args.count_fill,
        "ray_address": args.ray_address,
    }
    parameters: dict[str, Any] = {"image": args.image, "op_deadline": args.op_deadline}
    docker_up = "error" not in machine["docker"]
    if not docker_up:
        the_run.say(f"no Docker daemon answers: Docker systems are skipped ({machine['docker']})")

    def save() -> None:
        results = {
            "run_id": run_id,
            "command": ["uv", "run", "--group", "bench", "python", "-m", "bench", *argv],
            "command_line": command_line,
            "preset": args.preset,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
            "seconds": time.time() - started,
            "machine": machine,
            "features": sorted(found),
            "parameters": parameters,
            "systems": {
                **{name: info.description for name, info in SYSTEMS.items()},
                "asyncsandbox-fake": "Session(asyncsandbox.testing.FakeBackend()): no engine",
            },
            "docker_systems": list(DOCKER_SYSTEMS),
            "measurements": the_run.measurements,
            "skipped": the_run.skipped,
            "wedges": dict(the_run.wedges),
            "restarts": the_run.restarts,
            "log": the_run.events,
        }
        (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    try:
        for workload in workloads:
            params = _parameters(args, workload)
            parameters[workload] = params
            systems = args.systems or list(DEFAULT_SYSTEMS[workload])
            for system in systems:
                if system != "asyncsandbox-fake" and workload == "overhead":
                    continue
                if system in SYSTEMS and workload not in SYSTEMS[system].workloads:
                    continue
                if workload != "overhead" and system == "asyncsandbox-fake":
                    continue
                reason = _available(system, found)
                if (
                    reason is None
                    and system in SYSTEMS
                    and SYSTEMS[system].kind == "docker"
                    and not docker_up
                ):
                    reason = "no Docker daemon answers"
                if reason is not None:
                    the_run.say(f"{workload} / {system}: skipped: {reason}")
                    the_run.skipped.append(
                        {"workload": workload, "system": system, "reason": reason}
                    )
                    continue
                job = _jobs(workload, system, params, base)
                if system in SYSTEMS and SYSTEMS[system].kind == "ray":
                    # Its own cluster starts first: three nodes, a minute or more when busy.
                    job.budgets["open"] = max(job.budgets.get("open", 0.0), 600.0)
                try:
                    the_run.execute(job)
                except Exception as exc:  # noqa: BLE001 - one broken measurement must not end the run
                    the_run.say(f"{workload} / {system}: harness error: {exc!r}")
                    the_run.skipped.append(
                        {
                            "workload": workload,
                            "system": system,
                            "reason": f"harness error: {exc!r}",
                        }
                    )
                save()
    except KeyboardInterrupt:
        the_run.say("interrupted: writing what was measured")
    finally:
        the_run.cleanup_process_root()
        if docker_up:
            left = the_run.cleanup_containers()
            if left:
                the_run.say(f"end of run: removed {left} containers of the run")
        the_run.say(f"wedges per system: {dict(the_run.wedges) or 'none'}")
        save()
        report = _report.write(out_dir)
        if not args.no_latest:
            _report.write_latest([out_dir], args.out / "latest.md")
        print(f"results: {out_dir / 'results.json'}\nreport:  {report}")
    return 0


def cleanup() -> int:
    """Remove every container any bench run left (by label) and the process roots."""
    removed = 0
    try:
        containers = _daemon.call(
            "GET",
            "/containers/json",
            params={"all": "1", "filters": {"label": [_daemon.RUN_LABEL]}},
        )
        tagged = _daemon.call(
            "GET",
            "/containers/json",
            params={"all": "1", "filters": {"label": ["asyncsandbox.owner"]}},
        )
        ids = [c["Id"] for c in containers] + [
            c["Id"]
            for c in tagged
            if any(k.startswith(f"asyncsandbox.tag.{_daemon.TAG_PREFIX}") for k in c["Labels"])
        ]
        failed = _daemon.remove_containers(ids)
        removed = len(ids) - len(failed)
        print(f"removed {removed} containers ({len(failed)} failed)")
    except (_daemon.DaemonTimeout, _daemon.DaemonError) as exc:
        print(f"Docker: {exc}")
    for root in Path("/var/lib/asyncsandbox").glob("bench-*"):
        shutil.rmtree(root, ignore_errors=True)
        print(f"removed {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        dirs = [Path(d) for d in argv[1:]]
        if not dirs:
            print("usage: python -m bench report RUN_DIR [RUN_DIR...]", file=sys.stderr)
            return 2
        for d in dirs:
            print(_report.write(d))
        _report.write_latest(dirs, RESULTS / "latest.md")
        print(RESULTS / "latest.md")
        return 0
    if argv and argv[0] == "cleanup":
        return cleanup()
    if argv and argv[0] == "judge":
        from . import _judge

        return _judge.main(argv[1:])
    if argv and argv[0] == "fork":
        from . import _fork

        return _fork.main(argv[1:])
    if argv and argv[0] == "interpreter":
        from . import _interpreter

        return _interpreter.main(argv[1:])
    args = parser().parse_args(argv)
    return run(args, argv)
