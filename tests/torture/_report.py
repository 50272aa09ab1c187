"""The torture report: what was tried, against which backend, and what was lost.

Tests record into the one :data:`REPORT`; ``conftest.pytest_sessionfinish`` writes it as
JSON to ``tests/torture/last-report.json`` (or ``$ASYNCSANDBOX_TORTURE_REPORT``). The
goal is ``lost == 0``; tests of known bugs (strict xfail) are listed under ``known_bugs``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_ENV = "ASYNCSANDBOX_TORTURE_REPORT"
FULL_ENV = "ASYNCSANDBOX_TORTURE_FULL"
SEED_ENV = "ASYNCSANDBOX_TORTURE_SEED"
DEFAULT_PATH = Path(__file__).resolve().parent / "last-report.json"


def full_run() -> bool:
    """Whether the full-size load cases run (``ASYNCSANDBOX_TORTURE_FULL=1``)."""
    return os.environ.get(FULL_ENV) == "1"


def report_path() -> Path:
    return Path(os.environ.get(REPORT_ENV) or DEFAULT_PATH)


@dataclass
class Report:
    started: float = field(default_factory=time.time)
    programs: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    inputs: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    faults: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    cancellations: list[dict[str, Any]] = field(default_factory=list)
    loads: list[dict[str, Any]] = field(default_factory=list)
    losses: list[dict[str, str]] = field(default_factory=list)
    tests: dict[str, dict[str, str]] = field(default_factory=dict)
    seeds: set[int] = field(default_factory=set)

    @property
    def empty(self) -> bool:
        return not self.tests

    # -- what tests record ---------------------------------------------------------------

    def program(self, name: str, target: str, outcome: str) -> None:
        """A hostile program was run on ``target`` and ended with ``outcome``."""
        self.programs[(name, target, outcome)] += 1

    def input(self, name: str, target: str, outcome: str) -> None:
        """A hostile input was given to the API on ``target``; ``outcome`` is what it got."""
        self.inputs[(name, target, outcome)] += 1

    def fault(self, name: str, target: str, outcome: str) -> None:
        """A fault was injected on ``target``; ``outcome`` is how the runtime reported it."""
        self.faults[(name, target, outcome)] += 1

    def cancellation(self, target: str, **summary: Any) -> None:
        self.cancellations.append({"target": target, **summary})

    def load(self, target: str, **summary: Any) -> None:
        self.loads.append({"target": target, **summary})

    def lost(self, test: str, kind: str, detail: str) -> None:
        """Something was lost or left behind (an operation, a process, a sandbox, a file)."""
        self.losses.append({"test": test, "kind": kind, "detail": detail})

    def outcome(self, nodeid: str, outcome: str, reason: str = "") -> None:
        self.tests[nodeid] = {"outcome": outcome, **({"reason": reason} if reason else {})}

    # -- output ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        cancelled = sum(int(c.get("cancelled", 0)) for c in self.cancellations)
        cancelled += sum(int(load.get("cancelled", 0)) for load in self.loads)
        faults = sum(self.faults.values()) + sum(
            int(load.get("faults_injected", 0)) for load in self.loads
        )
        programs = sum(self.programs.values()) + sum(
            int(load.get("hostile", 0)) for load in self.loads
        )
        lost_ops = sum(int(load.get("lost", 0)) for load in self.loads) + sum(
            int(c.get("lost", 0)) for c in self.cancellations
        )
        outcomes = Counter(t["outcome"] for t in self.tests.values())
        return {
            "programs_tried": programs,
            "inputs_tried": sum(self.inputs.values()),
            "faults_injected": faults,
            "operations_cancelled": cancelled,
            "lost": len(self.losses) + lost_ops,
            "tests": dict(sorted(outcomes.items())),
        }

    def to_json(self) -> dict[str, Any]:
        def table(counter: Counter[tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = defaultdict(dict)
            for (name, target, outcome), count in sorted(counter.items()):
                out[name].setdefault(target, {})[outcome] = count
            return dict(out)

        backends = sorted(
            {t for _, t, _ in self.programs}
            | {t for _, t, _ in self.inputs}
            | {t for _, t, _ in self.faults}
            | {str(c["target"]) for c in self.cancellations}
            | {str(load["target"]) for load in self.loads}
        )
        return {
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "duration_seconds": round(time.time() - self.started, 1),
            "full": full_run(),
            "seeds": sorted(self.seeds),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "backends": backends,
            "totals": self.summary(),
            "programs": table(self.programs),
            "inputs": table(self.inputs),
            "faults": table(self.faults),
            "cancellation_storms": self.cancellations,
            "load_with_chaos": self.loads,
            "lost": self.losses,
            "known_bugs": sorted(
                {t["reason"] for t in self.tests.values() if t["outcome"] == "xfailed"}
            ),
            "tests": dict(sorted(self.tests.items())),
        }

    def write(self, path: Path | None = None) -> Path:
        target = path or report_path()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n")
        tmp.replace(target)
        return target


REPORT = Report()
