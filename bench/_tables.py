"""What every table of a bench report is made of: the run's measurements indexed by
workload, system and parameters, ratios between systems of one run, and cell formats."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Measurement = dict[str, Any]
CONTENDED = 0.10
"""Above this share of the CPUs used by other processes, a point is marked contended."""
WORKLOAD_ORDER = ("exec", "lifecycle", "rollout", "scale", "overhead")


def params_key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


class Index:
    def __init__(self, measurements: list[Measurement]) -> None:
        self.by_key: dict[tuple[str, str, tuple[tuple[str, Any], ...]], Measurement] = {}
        for m in measurements:
            self.by_key[(m["workload"], m["system"], params_key(m["params"]))] = m

    def get(self, workload: str, system: str, params: dict[str, Any]) -> Measurement | None:
        return self.by_key.get((workload, system, params_key(params)))

    def ratio(self, m: Measurement, reference: str, metric: str = "throughput") -> float | None:
        ref = self.get(m["workload"], reference, m["params"])
        value = metric_of(m, metric)
        base = metric_of(ref, metric) if ref is not None else None
        if value is None or base is None or base == 0:
            return None
        return value / base


def metric_of(m: Measurement | None, metric: str) -> float | None:
    if m is None or m["status"] != "ok" or not m.get("result"):
        return None
    value = m["result"].get(metric)
    return float(value) if isinstance(value, int | float) else None


def fmt_number(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def fmt_ms(summary: dict[str, Any] | None, key: str) -> str:
    if not summary or summary.get(key) is None:
        return "-"
    return fmt_number(summary[key] * 1000, 1)


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def md_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def errors_cell(m: Measurement) -> str:
    if m["status"] != "ok":
        return f"**{m['status']}**"
    total = (m["result"] or {}).get("errors", {}).get("total", 0)
    return str(total)


def system_name(m: Measurement) -> str:
    """The system, with its warm-pool hits when it has a pool."""
    stats = (m.get("result") or {}).get("system_stats") or {}
    if "pool_hits" in stats and m["system"].endswith("-pool"):
        return f"{m['system']} ({stats['pool_hits']} pool hits)"
    return str(m["system"])


def other_cell(m: Measurement) -> str:
    """Share of the CPUs that processes outside the measurement used during it."""
    cpu = m.get("cpu") or {}
    share = cpu.get("other")
    if share is None:
        return "-"
    text = f"**{share:.0%}**" if share > CONTENDED else f"{share:.0%}"
    return text + (" (daemon restarted)" if cpu.get("daemon_restarted") else "")


def system_order(systems: list[str], run: dict[str, Any]) -> list[str]:
    known = list(run.get("systems", {}))
    return sorted(set(systems), key=lambda s: (known.index(s) if s in known else 99, s))


def of_workload(workload: str, run: dict[str, Any]) -> list[Measurement]:
    ms = [m for m in run["measurements"] if m["workload"] == workload]
    order = system_order([m["system"] for m in ms], run)
    return sorted(ms, key=lambda m: (order.index(m["system"]), params_key(m["params"])))


def leftovers_cell(m: Measurement) -> str:
    r = m.get("result") or {}
    during = r.get("leftovers")
    after = (m.get("after") or {}).get("leftovers_after_exit")
    if during is None and after is None:
        return "-"
    if after is None or after == during:
        return str(during)
    return f"{fmt_number(during, 0) if during is not None else '-'} (after exit: {after})"


def micros(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def verdict_of(value: float | None, target: float, *, above: bool = True) -> str:
    if value is None:
        return "not measured"
    met = value >= target if above else value <= target
    return "met" if met else "not met"
