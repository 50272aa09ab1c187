"""Session metrics, with the names RL dashboards already chart, and their reporters."""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ._errors import InvalidArgument
from ._log import get_logger

__all__ = ("MetricsReporter", "resolve_reporters")

LATENCY_SAMPLES = 50_000
COMMAND_NOT_FOUND = frozenset({126, 127})
"""Exit statuses a shell gives a program it cannot run: 126 (not executable), 127 (not found)."""


@runtime_checkable
class MetricsReporter(Protocol):
    """Anything that receives metrics: ``reporter(metrics, step)``."""

    def __call__(self, metrics: Mapping[str, float], step: int | None) -> None: ...


def wandb_run() -> Any:
    """The active W&B run, if any. A run exists only if the program imported wandb, so
    this never imports it (which would also fail during interpreter shutdown)."""
    module = sys.modules.get("wandb")
    return None if module is None else getattr(module, "run", None)


def wandb_reporter(metrics: Mapping[str, float], step: int | None) -> None:
    """Log to the active W&B run (``wandb.run.log``); never creates a run."""
    run = wandb_run()
    if run is None:
        raise LookupError("no active wandb run (call wandb.init() first)")
    run.log(dict(metrics), step=step)


def log_reporter(metrics: Mapping[str, float], step: int | None) -> None:
    """Emit a ``session.metrics`` structlog event (JSON lines, with a JSON renderer)."""
    get_logger().info(
        "session.metrics", step=step, **{k.replace("/", "."): v for k, v in metrics.items()}
    )


_NAMED: dict[str, Callable[[Mapping[str, float], int | None], None]] = {
    "wandb": wandb_reporter,
    "log": log_reporter,
}


class _Auto:
    """``report_to=None``: W&B when a run is active at logging time, else nothing."""

    def __call__(self, metrics: Mapping[str, float], step: int | None) -> None:
        if wandb_run() is not None:
            wandb_reporter(metrics, step)
        else:
            raise LookupError("no active wandb run")


def resolve_reporters(
    report_to: Sequence[str | MetricsReporter] | None,
) -> list[Callable[[Mapping[str, float], int | None], None]]:
    if report_to is None:
        return [_Auto()]
    if isinstance(report_to, str):
        raise InvalidArgument("report_to must be a list (e.g. ['wandb']), not a single string")
    reporters: list[Callable[[Mapping[str, float], int | None], None]] = []
    for item in report_to:
        if isinstance(item, str):
            if item not in _NAMED:
                raise InvalidArgument(
                    f"unknown reporter {item!r}; known: {', '.join(_NAMED)}, or a callable"
                )
            reporters.append(_NAMED[item])
        elif callable(item):
            reporters.append(item)
        else:
            raise InvalidArgument(f"a reporter is a name or a callable, got {item!r}")
    return reporters


class Metrics:
    """Counters of one Session, for the window since the last reset."""

    def __init__(self, prefix: str) -> None:
        if not isinstance(prefix, str):
            raise InvalidArgument(f"metrics_prefix must be a str, got {prefix!r}")
        self.prefix = prefix
        self.reset()

    def reset(self) -> None:
        self.sandboxes_created = 0
        self.executions = 0
        self.ok = 0
        self.nonzero = 0
        self.failures = 0
        self.timeouts = 0
        self.infrastructure_errors = 0
        self.not_found = 0
        self.startups: list[float] = []
        # Commands per sandbox in this window, live sandboxes included (keyed by sandbox id):
        # a window reports the sandboxes that ran something in it, whether or not they
        # were removed since.
        self.execs_per_sandbox: dict[str, int] = {}
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.capacity_wait = 0.0
        self.capacity_wait_max = 0.0
        # Seconds of each snapshot, fork and reset in this window.
        self.timings: dict[str, list[float]] = {"snapshot": [], "fork": [], "reset": []}
        self.reset_failures = 0

    def started(self, seconds: float) -> None:
        self.sandboxes_created += 1
        self.startups.append(seconds)

    def exec_finished(
        self,
        *,
        sandbox: str | None,
        returncode: int | None,
        duration: float | None,
        timed_out: bool,
        infrastructure: bool,
    ) -> None:
        self.executions += 1
        if sandbox is not None:
            self.execs_per_sandbox[sandbox] = self.execs_per_sandbox.get(sandbox, 0) + 1
        if returncode is not None and not timed_out:
            if returncode == 0:
                self.ok += 1
            else:
                self.nonzero += 1
                self.not_found += returncode in COMMAND_NOT_FOUND
        else:
            self.failures += 1
            self.timeouts += timed_out
            self.infrastructure_errors += infrastructure
        if duration is not None:
            self.latencies.append(duration)

    def timed(self, operation: str, seconds: float) -> None:
        self.timings[operation].append(seconds)

    def waited(self, seconds: float) -> None:
        self.capacity_wait += seconds
        self.capacity_wait_max = max(self.capacity_wait_max, seconds)

    @property
    def empty(self) -> bool:
        return not (self.executions or self.sandboxes_created)

    def snapshot(self, *, live: int) -> dict[str, float]:
        p = self.prefix
        out: dict[str, float] = {
            f"{p}sandboxes_created": self.sandboxes_created,
            f"{p}sandboxes_live": live,
            f"{p}executions": self.executions,
            f"{p}exec_completed_ok": self.ok,
            f"{p}exec_completed_nonzero": self.nonzero,
            f"{p}exec_failures": self.failures,
            f"{p}exec_timeouts": self.timeouts,
            f"{p}exec_infrastructure_errors": self.infrastructure_errors,
            f"{p}exec_command_not_found": self.not_found,
            f"{p}capacity_wait_seconds": round(self.capacity_wait, 6),
            f"{p}capacity_wait_max_seconds": round(self.capacity_wait_max, 6),
        }
        if self.executions:
            out[f"{p}exec_completion_rate"] = self.ok / self.executions
            out[f"{p}exec_failure_rate"] = self.failures / self.executions
        if self.startups:
            out[f"{p}startup_count"] = len(self.startups)
            out[f"{p}avg_startup_seconds"] = sum(self.startups) / len(self.startups)
            out[f"{p}min_startup_seconds"] = min(self.startups)
            out[f"{p}max_startup_seconds"] = max(self.startups)
        if self.execs_per_sandbox:
            counts = list(self.execs_per_sandbox.values())
            out[f"{p}avg_execs_per_sandbox"] = sum(counts) / len(counts)
            out[f"{p}min_execs_per_sandbox"] = min(counts)
            out[f"{p}max_execs_per_sandbox"] = max(counts)
        for operation, seconds in self.timings.items():
            if seconds:
                out[f"{p}{operation}_count"] = len(seconds)
                out[f"{p}avg_{operation}_seconds"] = sum(seconds) / len(seconds)
                out[f"{p}max_{operation}_seconds"] = max(seconds)
        if self.timings["reset"] or self.reset_failures:
            out[f"{p}reset_failures"] = self.reset_failures
        if self.latencies:
            ordered = sorted(self.latencies)
            for q in (50, 90, 99):
                out[f"{p}exec_latency_p{q}_seconds"] = _percentile(ordered, q)
        return out


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
