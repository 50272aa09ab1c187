"""The main job, as users run it today: score model-written programs in parallel sandboxes
(the reward-function scenario of the RL guides), printing results as they complete."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import TextIO

import asyncsandbox

from ._config import SandboxDefaults
from ._errors import ExecTimeout, InfrastructureError
from ._models import ExecResult
from ._session import Session


@dataclass(frozen=True)
class Program:
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


@dataclass
class Outcome:
    index: int
    program: Program
    status: str  # "pass", "fail", "timeout" or "error"
    detail: str
    seconds: float

    @property
    def reward(self) -> float:
        return 1.0 if self.status == "pass" else 0.0

    @property
    def as_expected(self) -> bool:
        return self.status == self.program.expected


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:70] if lines else ""


async def score(session: Session, index: int, program: Program, timeout: float) -> Outcome:
    """Run one program in a fresh sandbox and turn what happened into a reward."""
    try:
        result: ExecResult = await session.run(["python3", "-c", program.code], timeout=timeout)
    except ExecTimeout as exc:
        return Outcome(index, program, "timeout", f"killed after {timeout:g}s", exc.result.duration)
    except InfrastructureError as exc:  # not the program's fault: an RL trainer masks these
        return Outcome(index, program, "error", f"{type(exc).__name__}: {exc}", 0.0)
    if result.returncode == 0:
        return Outcome(index, program, "pass", _last_line(result.stdout_text), result.duration)
    return Outcome(index, program, "fail", _last_line(result.stderr_text), result.duration)


async def run_demo(
    backend: str = "process",
    *,
    timeout: float = 3.0,
    backend_options: dict[str, object] | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run the demo; return 0 when every program ended as expected."""
    job = uuid.uuid4().hex[:8]
    defaults = SandboxDefaults(tags=("demo", f"job:{job}"))
    rule = "-" * 64
    print(f"asyncsandbox demo: reward function (backend: {backend}, job: {job})", file=out)
    print("=" * 64, file=out)
    print(
        f"Scoring {len(PROGRAMS)} programs in parallel sandboxes (timeout {timeout:g}s each)\n",
        file=out,
    )
    print("Results as they complete:", file=out)
    print(rule, file=out)
    outcomes: list[Outcome] = []
    async with Session(backend, backend_options=backend_options, defaults=defaults) as session:
        ops = [
            session.submit(score(session, i, p, timeout), name=p.name)
            for i, p in enumerate(PROGRAMS)
        ]
        async for op in asyncsandbox.as_completed(ops):
            outcome: Outcome = op.result()
            outcomes.append(outcome)
            label = outcome.status.upper()
            print(
                f"  [{len(outcomes)}/{len(PROGRAMS)}] Problem {outcome.index} ({outcome.program.name}): "
                f"{label:<7} {outcome.seconds:5.2f}s  {outcome.detail}",
                file=out,
            )
        stats = session.statistics()
    print(rule, file=out)
    print("\nSummary (original order):", file=out)
    print(rule, file=out)
    for outcome in sorted(outcomes, key=lambda o: o.index):
        check = "OK" if outcome.as_expected else f"UNEXPECTED (wanted {outcome.program.expected})"
        print(
            f"  Problem {outcome.index} ({outcome.program.name}): reward={outcome.reward:.1f} "
            f"[{outcome.status.upper()}] {check}",
            file=out,
        )
    print(rule, file=out)
    total = sum(o.reward for o in outcomes)
    passed = sum(o.status == "pass" for o in outcomes)
    print(f"Total reward: {total:.1f}/{len(PROGRAMS)}", file=out)
    print(f"Pass rate: {passed}/{len(PROGRAMS)} ({passed / len(PROGRAMS):.0%})", file=out)
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
