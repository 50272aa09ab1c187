"""The main job, as users run it today (``asyncsandbox demo``): score model-written
programs in parallel sandboxes (the reward-function scenario of the RL guides), printing
results as they complete.

Public so that examples and tutorials reuse the programs, the scoring rule and the report
lines: ``examples/reward_function.py`` runs the guide's five programs through the blocking
facade (:mod:`asyncsandbox.sync`) the way a TRL reward function would."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any, TextIO

import asyncsandbox

from ._config import SandboxDefaults
from ._errors import ExecTimeout, InfrastructureError
from ._models import ExecResult
from ._runtime import unenforced_limits
from ._session import Session
from .abc import Backend

__all__ = (
    "Program",
    "PROGRAMS",
    "SEED_PROGRAMS",
    "Outcome",
    "outcome_of",
    "score",
    "progress_line",
    "summary_lines",
    "run_demo",
)


@dataclass(frozen=True)
class Program:
    """A model-written program and what it should do."""

    name: str
    code: str
    expected: str  # "pass", "fail" or "timeout"


PROGRAMS = (
    Program("slow-sum", "import time\ntime.sleep(1.0)\nprint(sum(range(101)))\n", "pass"),
    Program("string-ops", "s = 'sandbox'\nprint(s.upper(), s[::-1], len(s))\n", "pass"),
    Program(
        "delayed-error", "import time\ntime.sleep(0.5)\nraise RuntimeError('model bug')\n", "fail"
    ),
    Program("syntax-error", "def broken(:\n    return 1\n", "fail"),
    Program(
        "slow-list", "import time\ntime.sleep(1.5)\nprint([i * i for i in range(8)])\n", "pass"
    ),
    Program("infinite-loop", "while True:\n    pass\n", "timeout"),
)
"""The demo's six programs: the RL guide's five and a runaway that only its timeout ends."""
SEED_PROGRAMS = PROGRAMS[:5]
"""The RL guide's five toy completions (the demo adds a runaway program)."""


@dataclass
class Outcome:
    """What happened to one program, and so its reward."""

    index: int
    program: Program
    status: str  # "pass", "fail", "timeout" or "error"
    detail: str
    seconds: float

    @property
    def reward(self) -> float:
        """1.0 for a pass, else 0.0."""
        return 1.0 if self.status == "pass" else 0.0

    @property
    def as_expected(self) -> bool:
        """Whether the program ended as the demo expects it to."""
        return self.status == self.program.expected


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:70] if lines else ""


def outcome_of(
    index: int, program: Program, timeout: float, result: ExecResult | BaseException
) -> Outcome:
    """What happened to a program's command (its result, or the error it raised), as an
    outcome and so a reward. Errors other than a timeout or an infrastructure failure are
    raised again."""
    if isinstance(result, ExecTimeout):
        return Outcome(
            index, program, "timeout", f"killed after {timeout:g}s", result.result.duration
        )
    if isinstance(result, InfrastructureError):  # not the program's fault: trainers mask these
        return Outcome(index, program, "error", f"{type(result).__name__}: {result}", 0.0)
    if isinstance(result, BaseException):
        raise result
    if result.returncode == 0:
        return Outcome(index, program, "pass", _last_line(result.stdout_text), result.duration)
    return Outcome(index, program, "fail", _last_line(result.stderr_text), result.duration)


async def score(
    session: Session, index: int, program: Program, timeout: float, **overrides: Any
) -> Outcome:
    """Run one program in a fresh sandbox (``overrides``: of the session's defaults, as
    :meth:`Session.run` takes them) and turn what happened into a reward."""
    try:
        result: ExecResult = await session.run(
            ["python3", "-c", program.code], timeout=timeout, **overrides
        )
    except (ExecTimeout, InfrastructureError) as exc:
        return outcome_of(index, program, timeout, exc)
    return outcome_of(index, program, timeout, result)


def _enforceable(session: Session, out: TextIO) -> dict[str, Any]:
    """The demo's sandboxes ask only for the limits the backend enforces here (as an
    unprivileged user, the process backend has no cgroups: no memory or process limits),
    saying so, rather than being refused them: the overrides of the session's defaults."""
    caps = session.backend.capabilities
    resources = session.defaults.resources
    unenforced = sorted(unenforced_limits(resources, caps))
    if not unenforced or caps.best_effort_limits:
        return {}
    print(
        f"Note: the {session.backend.name} backend cannot enforce {', '.join(unenforced)} "
        f"here ({caps.limits_note or 'it does not have them'}): the demo asks for no such "
        "limit.\n",
        file=out,
    )
    return {"resources": resources.replace(**dict.fromkeys(unenforced))}


def progress_line(outcome: Outcome, done: int, total: int) -> str:
    """The line printed when a program finishes (``done`` of ``total`` so far)."""
    return (
        f"  [{done}/{total}] Problem {outcome.index} ({outcome.program.name}): "
        f"{outcome.status.upper():<7} {outcome.seconds:5.2f}s  {outcome.detail}"
    )


def summary_lines(outcomes: list[Outcome], rule: str) -> list[str]:
    """The summary: every program in original order, then total reward and pass rate."""
    lines = []
    for outcome in sorted(outcomes, key=lambda o: o.index):
        check = "OK" if outcome.as_expected else f"UNEXPECTED (wanted {outcome.program.expected})"
        lines.append(
            f"  Problem {outcome.index} ({outcome.program.name}): reward={outcome.reward:.1f} "
            f"[{outcome.status.upper()}] {check}"
        )
    total = sum(o.reward for o in outcomes)
    passed = sum(o.status == "pass" for o in outcomes)
    count = len(outcomes)
    lines += [
        rule,
        f"Total reward: {total:.1f}/{count}",
        f"Pass rate: {passed}/{count} ({passed / max(count, 1):.0%})",
    ]
    return lines


async def run_demo(
    backend: str | Backend = "process",
    *,
    timeout: float = 3.0,
    backend_options: dict[str, object] | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run the demo; return 0 when every program ended as expected."""
    job = uuid.uuid4().hex[:8]
    defaults = SandboxDefaults(tags=("demo", f"job:{job}"))
    rule = "-" * 64
    name = backend if isinstance(backend, str) else backend.name
    print(f"asyncsandbox demo: reward function (backend: {name}, job: {job})", file=out)
    print("=" * 64, file=out)
    print(
        f"Scoring {len(PROGRAMS)} programs in parallel sandboxes (timeout {timeout:g}s each)\n",
        file=out,
    )
    outcomes: list[Outcome] = []
    async with Session(backend, backend_options=backend_options, defaults=defaults) as session:
        overrides = _enforceable(session, out)
        print("Results as they complete:", file=out)
        print(rule, file=out)
        ops = [
            session.submit(score(session, i, p, timeout, **overrides), name=p.name)
            for i, p in enumerate(PROGRAMS)
        ]
        async for op in asyncsandbox.as_completed(ops):
            outcomes.append(op.result())
            print(progress_line(outcomes[-1], len(outcomes), len(PROGRAMS)), file=out)
        stats = session.statistics()
    print(rule, file=out)
    print("\nSummary (original order):", file=out)
    print(rule, file=out)
    for line in summary_lines(outcomes, rule):
        print(line, file=out)
    print(
        f"Sandboxes: {stats.sandboxes_started} started, {stats.sandboxes_removed} removed, "
        f"peak {stats.live.peak_active} live",
        file=out,
    )
    unexpected = [o for o in outcomes if not o.as_expected]
    if unexpected:
        print(f"\n{len(unexpected)} program(s) did not behave as expected.", file=out)
        return 1
    return 0
