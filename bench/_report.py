"""Markdown tables and PNG plots from a run's ``results.json``.

Ratios compare systems measured in the same run at the same parameters: ``x docker-py``
(common practice), ``x raw-aiodocker`` (the floor of the Engine API path) and, for execs,
``x host-spawn`` (the floor of process creation). Above 1 means faster than the reference.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._systems import BASELINE, FLOORS, RAY_DIRECT

Measurement = dict[str, Any]
CONTENDED = 0.10
"""Above this share of the CPUs used by other processes, a point is marked contended."""
WORKLOAD_ORDER = ("exec", "lifecycle", "rollout", "scale", "overhead")


def _key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


class Index:
    def __init__(self, measurements: list[Measurement]) -> None:
        self.by_key: dict[tuple[str, str, tuple[tuple[str, Any], ...]], Measurement] = {}
        for m in measurements:
            self.by_key[(m["workload"], m["system"], _key(m["params"]))] = m

    def get(self, workload: str, system: str, params: dict[str, Any]) -> Measurement | None:
        return self.by_key.get((workload, system, _key(params)))

    def ratio(self, m: Measurement, reference: str, metric: str = "throughput") -> float | None:
        ref = self.get(m["workload"], reference, m["params"])
        value = _metric(m, metric)
        base = _metric(ref, metric) if ref is not None else None
        if value is None or base is None or base == 0:
            return None
        return value / base


def _metric(m: Measurement | None, metric: str) -> float | None:
    if m is None or m["status"] != "ok" or not m.get("result"):
        return None
    value = m["result"].get(metric)
    return float(value) if isinstance(value, int | float) else None


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ms(summary: dict[str, Any] | None, key: str) -> str:
    if not summary or summary.get(key) is None:
        return "-"
    return _fmt(summary[key] * 1000, 1)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _errors(m: Measurement) -> str:
    if m["status"] != "ok":
        return f"**{m['status']}**"
    total = (m["result"] or {}).get("errors", {}).get("total", 0)
    return str(total)


def _name(m: Measurement) -> str:
    """The system, with its warm-pool hits when it has a pool."""
    stats = (m.get("result") or {}).get("system_stats") or {}
    if "pool_hits" in stats and m["system"].endswith("-pool"):
        return f"{m['system']} ({stats['pool_hits']} pool hits)"
    return str(m["system"])


def _other(m: Measurement) -> str:
    """Share of the CPUs that processes outside the measurement used during it."""
    cpu = m.get("cpu") or {}
    share = cpu.get("other")
    if share is None:
        return "-"
    text = f"**{share:.0%}**" if share > CONTENDED else f"{share:.0%}"
    return text + (" (daemon restarted)" if cpu.get("daemon_restarted") else "")


def _order(systems: list[str], run: dict[str, Any]) -> list[str]:
    known = list(run.get("systems", {}))
    return sorted(set(systems), key=lambda s: (known.index(s) if s in known else 99, s))


def _ms_of(workload: str, run: dict[str, Any]) -> list[Measurement]:
    ms = [m for m in run["measurements"] if m["workload"] == workload]
    order = _order([m["system"] for m in ms], run)
    return sorted(ms, key=lambda m: (order.index(m["system"]), _key(m["params"])))


# -- sections: one shape, five column specs --------------------------------------------

Cell = Callable[[Measurement, Index], str]


@dataclass(frozen=True)
class Section:
    """One workload's table: a heading, what it measures, and its columns."""

    workload: str
    intro: Callable[[dict[str, Any]], str]
    """What the table shows (of the run: some name its parameters)."""
    columns: tuple[tuple[str, Cell], ...]
    """(header, cell) per column."""
    footer: Callable[[list[Measurement]], list[str]] = lambda ms: []
    """Lines after the table (of the workload's measurements)."""

    def render(self, run: dict[str, Any], index: Index) -> list[str]:
        ms = _ms_of(self.workload, run)
        if not ms:
            return []
        rows = [[cell(m, index) for _, cell in self.columns] for m in ms]
        return [
            f"## {self.workload}",
            "",
            self.intro(run),
            "",
            *_table([header for header, _ in self.columns], rows),
            "",
            *self.footer(ms),
        ]


def _result(m: Measurement) -> dict[str, Any]:
    return m["result"] or {}


def _param(name: str) -> Cell:
    return lambda m, index: str(m["params"][name])


def _throughput(status_in_bold: bool = False) -> Cell:
    def cell(m: Measurement, index: Index) -> str:
        if m["status"] == "ok":
            return _fmt(_result(m).get("throughput"))
        return f"**{m['status']}**" if status_in_bold else "-"

    return cell


def _latency(key: str, quantile: str, *within: str) -> Cell:
    """Milliseconds of ``result[key]`` (or of ``result[within...][key]``) at ``quantile``."""

    def cell(m: Measurement, index: Index) -> str:
        found: Any = _result(m)
        for part in within:
            found = found.get(part) or {}
        return _ms(found.get(key), quantile)

    return cell


def _times(reference: str) -> Cell:
    return lambda m, index: _x(index.ratio(m, reference))


_SYSTEM: tuple[str, Cell] = ("system", lambda m, index: str(m["system"]))
_SYSTEM_POOL: tuple[str, Cell] = ("system", lambda m, index: _name(m))
_ERRORS: tuple[str, Cell] = ("errors", lambda m, index: _errors(m))
_OTHER: tuple[str, Cell] = ("other CPU", lambda m, index: _other(m))
_LEFTOVERS: tuple[str, Cell] = ("leftovers", lambda m, index: _left(m))
_RATIOS: tuple[tuple[str, Cell], ...] = (
    ("x docker-py", _times(BASELINE)),
    ("x raw-aiodocker", _times(FLOORS["api"])),
)


def _exec_intro(run: dict[str, Any]) -> str:
    setup: dict[str, Any] = next(
        (m["setup"] for m in run["measurements"] if m["workload"] == "exec"), {}
    )
    return (
        f"Execs/s and latency of one command, over {setup.get('sandboxes', '?')} live "
        "sandboxes (round-robin), at each concurrency, for a fixed time window "
        f"({run['parameters'].get('exec', {}).get('duration', '?')} s). `python`: "
        "`python3 -c 'print(sum(range(1000)))'`; `true`: `/bin/true`. Output is checked."
    )


def _left(m: Measurement) -> str:
    r = m.get("result") or {}
    during = r.get("leftovers")
    after = (m.get("after") or {}).get("leftovers_after_exit")
    if during is None and after is None:
        return "-"
    if after is None or after == during:
        return str(during)
    return f"{_fmt(during, 0) if during is not None else '-'} (after exit: {after})"


def _scale_live(m: Measurement, index: Index) -> str:
    return str(_result(m).get("live", "-")) if m["status"] == "ok" else f"**{m['status']}**"


def _ray_section(run: dict[str, Any], index: Index) -> list[str]:
    """Ray's hop: each asyncsandbox-ray figure beside the nodes' backend run directly."""
    rows = []
    for m in [m for w in ("exec", "lifecycle", "rollout") for m in _ms_of(w, run)]:
        if m["system"] != "asyncsandbox-ray":
            continue
        direct = index.get(m["workload"], RAY_DIRECT, m["params"])
        rows.append(
            [
                m["workload"],
                ", ".join(f"{k}={v}" for k, v in m["params"].items() if k != "duration"),
                _fmt(_metric(direct, "throughput")),
                _fmt(_metric(m, "throughput")) if m["status"] == "ok" else m["status"],
                _x(index.ratio(m, RAY_DIRECT)),
                _errors(m),
                _other(m),
            ]
        )
    if not rows:
        return []
    return [
        "## Ray: the driver-to-node hop",
        "",
        (
            f'The same points through `Session("ray")` (each call to the sandbox\'s node '
            f"agent, which runs it on the process backend) and on the process backend in the "
            f"driver (`{RAY_DIRECT}`), in this run. Per second: rollouts, execs, or "
            "create+remove cycles."
        ),
        "",
        *_table(
            ["workload", "point", f"{RAY_DIRECT} /s", "ray /s", "x direct", "errors", "other CPU"],
            rows,
        ),
        "",
    ]


def _engine_rss(m: Measurement, index: Index) -> str:
    rss = _result(m).get("daemon_rss_delta_per_sandbox_mib") or {}
    return _fmt(sum(v for v in rss.values() if isinstance(v, int | float)) if rss else None)


def _teardowns(ms: list[Measurement]) -> list[str]:
    teardowns: list[tuple[str, Any, dict[str, Any], Any]] = []
    for m in ms:
        teardown = (m.get("extra") or {}).get("teardown")
        if teardown and (m["system"], teardown.get("removed")) not in [t[:2] for t in teardowns]:
            teardowns.append(
                (
                    m["system"],
                    teardown.get("removed"),
                    teardown,
                    (m.get("after") or {}).get("leftovers_after_exit"),
                )
            )
    lines = []
    for system, removed, t, after in teardowns:
        errors = (t.get("errors") or {}).get("total", 0)
        lines.append(
            f"- {system}: removed {removed} in {_fmt(t.get('seconds'), 1)} s "
            f"({_fmt(t.get('rate'))}/s), {errors} removal errors, leftovers "
            f"{t.get('leftovers')} (after exit: {after})."
        )
    return [*lines, ""]


def _overhead_us(quantile: str) -> Cell:
    return lambda m, index: _fmt(_us((_result(m).get("latency") or {}).get(quantile)), 1)


SECTIONS: tuple[Section, ...] = (
    Section(
        "exec",
        _exec_intro,
        (
            _SYSTEM,
            ("command", _param("command")),
            ("conc", _param("concurrency")),
            ("execs/s", _throughput()),
            ("p50 ms", _latency("latency", "p50")),
            ("p95 ms", _latency("latency", "p95")),
            ("p99 ms", _latency("latency", "p99")),
            _ERRORS,
            _OTHER,
            *_RATIOS,
            ("x host-spawn", _times(FLOORS["spawn"])),
        ),
    ),
    Section(
        "lifecycle",
        lambda run: (
            "`count` sandboxes per point, each created (until ready for a command) and then "
            "removed, by `conc` workers. sandboxes/s counts complete create+remove cycles."
        ),
        (
            _SYSTEM_POOL,
            ("conc", _param("concurrency")),
            ("count", _param("count")),
            ("sandboxes/s", _throughput()),
            ("create p50 ms", _latency("create", "p50")),
            ("p95", _latency("create", "p95")),
            ("p99", _latency("create", "p99")),
            ("remove p50 ms", _latency("remove", "p50")),
            ("p95", _latency("remove", "p95")),
            ("p99", _latency("remove", "p99")),
            _ERRORS,
            _OTHER,
            _LEFTOVERS,
            *_RATIOS,
        ),
    ),
    Section(
        "rollout",
        lambda run: (
            "`R` rollouts by `C` workers; a rollout is create, 5 x the Python command, write a "
            "4 KiB file, read it back (compared), remove. Latency is per whole rollout; phase "
            "columns are per call. Leftovers: containers of the run still present when the point "
            "ended (and after the worker exited, if different)."
        ),
        (
            _SYSTEM_POOL,
            ("R", _param("rollouts")),
            ("C", _param("concurrency")),
            ("rollouts/s", _throughput()),
            ("p50 ms", _latency("latency", "p50")),
            ("p95 ms", _latency("latency", "p95")),
            ("p99 ms", _latency("latency", "p99")),
            ("create p50", _latency("create", "p50", "phases")),
            ("exec p50", _latency("exec", "p50", "phases")),
            ("remove p50", _latency("remove", "p50", "phases")),
            _ERRORS,
            _OTHER,
            _LEFTOVERS,
            *_RATIOS,
        ),
    ),
    Section(
        "scale",
        lambda run: (
            "Grow to each size in turn, keeping every sandbox alive; at each size: seconds since "
            "the start, creates/s of that step, host memory per live sandbox (MemAvailable "
            "delta), Docker's own resident memory per sandbox (dockerd + containerd + shims, "
            "delta), and the latency of Python execs on random live sandboxes (4 at a time)."
        ),
        (
            _SYSTEM,
            ("N", _param("sandboxes")),
            ("live", _scale_live),
            ("s to reach", lambda m, index: _fmt(_result(m).get("seconds_to_reach"), 1)),
            ("creates/s", lambda m, index: _fmt(_result(m).get("rate"))),
            ("MiB/sandbox (host)", lambda m, index: _fmt(_result(m).get("memory_per_sandbox_mib"))),
            ("MiB/sandbox (engine RSS)", _engine_rss),
            ("exec p50 ms", _latency("exec_latency", "p50")),
            ("exec p95 ms", _latency("exec_latency", "p95")),
            _ERRORS,
            _OTHER,
        ),
        _teardowns,
    ),
    Section(
        "overhead",
        lambda run: (
            'No-op execs (`["true"]`) through a Session on `asyncsandbox.testing.FakeBackend`, '
            "one sandbox, `conc` tasks: the runtime's own cost per call (validation, limits, "
            "bounded output buffers, metrics, the backend contract), apart from any engine. "
            "structlog is configured at WARNING (per-call debug events are filtered out)."
        ),
        (
            ("library", _param("library")),
            ("conc", _param("concurrency")),
            ("execs/s", _throughput(status_in_bold=True)),
            ("p50 us", _overhead_us("p50")),
            ("p99 us", _overhead_us("p99")),
            ("target ≥ 20,000/s", lambda m, index: _verdict(_metric(m, "throughput"), 20_000)),
        ),
    ),
)
"""The workloads' tables, in :data:`WORKLOAD_ORDER`."""


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def _verdict(value: float | None, target: float, *, above: bool = True) -> str:
    if value is None:
        return "not measured"
    met = value >= target if above else value <= target
    return "met" if met else "not met"


# -- headlines and targets ------------------------------------------------------------


def _best(ms: list[Measurement]) -> Measurement | None:
    ok = [m for m in ms if _metric(m, "throughput") is not None]
    return max(ok, key=lambda m: _metric(m, "throughput") or 0.0) if ok else None


def _headlines(run: dict[str, Any], index: Index) -> list[str]:
    lines = ["## Headlines", ""]
    # Rollouts at R=256, C=32 (the reference point) or the run's own points.
    rollout = _ms_of("rollout", run)
    if rollout:
        reference = {"rollouts": 256, "concurrency": 32}
        at_ref = [m for m in rollout if m["params"] == reference]
        points = at_ref or rollout
        title = "R = 256, C = 32" if at_ref else "every rollout point of this run"
        rows = []
        for m in points:
            p = m["params"]
            rows.append(
                [
                    m["system"],
                    f"{p['rollouts']}/{p['concurrency']}",
                    _fmt(_metric(m, "throughput")) if m["status"] == "ok" else f"**{m['status']}**",
                    _x(index.ratio(m, BASELINE)),
                    _x(index.ratio(m, FLOORS["api"])),
                    _errors(m),
                    _other(m),
                    _left(m),
                ]
            )
        lines += [f"Rollouts/s ({title}):", ""]
        lines += _table(
            [
                "system",
                "R/C",
                "rollouts/s",
                "x docker-py",
                "x raw-aiodocker",
                "errors",
                "other CPU",
                "leftovers",
            ],
            rows,
        )
        lines.append("")
    execs = _ms_of("exec", run)
    if execs:
        rows = []
        for command in ("python", "true"):
            systems = _order([m["system"] for m in execs if m["params"]["command"] == command], run)
            peaks = {
                s: _best(
                    [m for m in execs if m["system"] == s and m["params"]["command"] == command]
                )
                for s in systems
            }
            ref = {name: peaks.get(name) for name in (BASELINE, FLOORS["api"], FLOORS["spawn"])}
            for system, peak in peaks.items():
                value = _metric(peak, "throughput")
                cells = [system, command]
                cells.append(f"{_fmt(value)} (C={peak['params']['concurrency']})" if peak else "-")
                for name in (BASELINE, FLOORS["api"], FLOORS["spawn"]):
                    base = _metric(ref[name], "throughput")
                    cells.append(_x(value / base if value and base else None))
                rows.append(cells)
        lines += ["Peak exec throughput (best concurrency of each system):", ""]
        lines += _table(
            [
                "system",
                "command",
                "execs/s (at C)",
                "x docker-py",
                "x raw-aiodocker",
                "x host-spawn",
            ],
            rows,
        )
        lines.append("")
    lifecycle = _ms_of("lifecycle", run)
    if lifecycle:
        concurrencies = sorted({m["params"]["concurrency"] for m in lifecycle})
        systems = _order([m["system"] for m in lifecycle], run)
        rows = []
        for system in systems:
            cells = [system]
            for c in concurrencies:
                found = [
                    x
                    for x in lifecycle
                    if x["system"] == system and x["params"]["concurrency"] == c
                ]
                if not found:
                    cells.append("-")
                elif found[0]["status"] != "ok":
                    cells.append(f"**{found[0]['status']}**")
                else:
                    cells.append(
                        f"{_fmt(_metric(found[0], 'throughput'))} "
                        f"(p50 {_ms(found[0]['result'].get('create'), 'p50')} ms)"
                    )
            rows.append(cells)
        lines += ["Lifecycle: sandboxes/s (create-to-ready p50) by concurrency:", ""]
        lines += _table(["system", *[f"C={c}" for c in concurrencies]], rows)
        lines.append("")
    overhead = _ms_of("overhead", run)
    if overhead:
        cells = [
            f"{m['params']['library']} C={m['params']['concurrency']}: "
            f"{_fmt(_metric(m, 'throughput'))}/s"
            for m in overhead
        ]
        lines += ["Runtime overhead (no-op execs/s on FakeBackend): " + "; ".join(cells), ""]
    scale = _ms_of("scale", run)
    if scale:
        lines.append("Scale (largest size reached per system):")
        lines.append("")
        for system in _order([m["system"] for m in scale], run):
            ok = [m for m in scale if m["system"] == system and m["status"] == "ok"]
            if not ok:
                lines.append(f"- {system}: nothing reached")
                continue
            top = max(ok, key=lambda m: m["params"]["sandboxes"])
            r = top["result"]
            teardown = (top.get("extra") or {}).get("teardown") or {}
            lines.append(
                f"- {system}: {r['live']} live in {_fmt(r['seconds_to_reach'], 1)} s, "
                f"{_fmt(r.get('memory_per_sandbox_mib'))} MiB host memory per sandbox, exec "
                f"p50 {_ms(r.get('exec_latency'), 'p50')} ms at that size, "
                f"{r['errors']['total']} errors; removal "
                f"{_fmt(teardown.get('seconds'), 1)} s with "
                f"{(teardown.get('errors') or {}).get('total', '?')} errors, leftovers "
                f"{teardown.get('leftovers', '?')}"
            )
        lines.append("")
    lines += _wedges(run)
    return lines


def _wedges(run: dict[str, Any]) -> list[str]:
    systems = _order(
        [m["system"] for m in run["measurements"] if m["system"] in run.get("docker_systems", [])],
        run,
    )
    wedges = run.get("wedges", {})
    cells = [f"{s}: {wedges.get(s, 0)}" for s in systems]
    cells += [f"{s}: {n}" for s, n in wedges.items() if s not in systems]
    restarts = run.get("restarts", [])
    return [
        "Daemon wedges per system (`info` silent for 2 x 20 s; the daemon was restarted "
        f"{len(restarts)} time(s)): " + ("; ".join(cells) if cells else "no Docker system ran"),
        "",
    ]


def _targets(run: dict[str, Any], index: Index) -> list[str]:
    """The issue's targets, as far as this run measured them."""
    lines = []

    def find(workload: str, system: str, params: dict[str, Any]) -> Measurement | None:
        return index.get(workload, system, params)

    ref = {"rollouts": 256, "concurrency": 32}
    ours = find("rollout", "asyncsandbox-docker", ref)
    if ours is not None:
        lines.append(
            f"- Docker rollouts/s at C=32, R=256 ≥ 2x docker-py: "
            f"{_x(index.ratio(ours, BASELINE))} → "
            f"{_verdict(index.ratio(ours, BASELINE), 2.0)}"
        )
    api = find("rollout", "asyncsandbox-docker-api", ref)
    if api is not None:
        ratio = index.ratio(api, FLOORS["api"])
        lines.append(
            f"- fast path off, rollouts within 10% of raw aiodocker: {_x(ratio)} → "
            f"{_verdict(ratio, 0.9)}"
        )
    for m in _ms_of("rollout", run):
        if m["system"] == "asyncsandbox-ray" and m["params"]["concurrency"] in (16, 32):
            ratio = index.ratio(m, RAY_DIRECT)
            lines.append(
                f"- Ray rollouts ≥ 0.9x the nodes' backend directly ({RAY_DIRECT}), "
                f"R={m['params']['rollouts']}, C={m['params']['concurrency']}: {_x(ratio)} → "
                f"{_verdict(ratio, 0.9)}"
            )
    execs = _ms_of("exec", run)

    def peak(system: str) -> float | None:
        return _metric(
            _best(
                [m for m in execs if m["system"] == system and m["params"]["command"] == "python"]
            ),
            "throughput",
        )

    # With fast_path on by default, asyncsandbox-docker is the fast-path figure.
    fast_name = (
        "asyncsandbox-docker"
        if "fast_path_default" in run.get("features", [])
        else "asyncsandbox-docker-fast"
    )
    fast, api_exec, spawn = (
        peak(fast_name),
        peak("asyncsandbox-docker-api"),
        peak("host-spawn"),
    )
    if fast is not None and api_exec:
        lines.append(
            f"- exec throughput (python, peak), fast path ({fast_name}) ≥ 3x the Engine API "
            f"path (asyncsandbox-docker-api): {_x(fast / api_exec)} → "
            f"{_verdict(fast / api_exec, 3.0)}"
        )
    if fast is not None and spawn:
        lines.append(
            f"- exec throughput (python, peak), fast path ({fast_name}) ≥ 0.7x host spawn: "
            f"{_x(fast / spawn)} → "
            f"{_verdict(fast / spawn, 0.7)}"
        )
    pool = [m for m in _ms_of("lifecycle", run) if m["system"] == "asyncsandbox-docker-pool"]
    for m in pool:
        p50 = ((m.get("result") or {}).get("create") or {}).get("p50")
        lines.append(
            f"- warm-pool acquisition p50 < 10 ms (C={m['params']['concurrency']}): "
            f"{_ms((m.get('result') or {}).get('create'), 'p50')} ms → "
            f"{_verdict(p50 * 1000 if p50 is not None else None, 10.0, above=False)}"
        )
    for system, goal in (("asyncsandbox-docker", 1000), ("asyncsandbox-process", 5000)):
        ms = [m for m in _ms_of("scale", run) if m["system"] == system]
        if not ms:
            continue
        top = [m for m in ms if m["params"]["sandboxes"] >= goal]
        if not top:
            largest = max(m["params"]["sandboxes"] for m in ms)
            lines.append(f"- {goal} live sandboxes on {system}: largest size tried {largest}")
            continue
        m = top[0]
        teardown = (m.get("extra") or {}).get("teardown") or {}
        errors = (
            (m.get("result") or {}).get("errors", {}).get("total")
            if m["status"] == "ok"
            else m["status"]
        )
        left = teardown.get("leftovers")
        met = (
            m["status"] == "ok"
            and errors == 0
            and not left
            and not (teardown.get("errors") or {}).get("total")
        )
        lines.append(
            f"- {goal} live sandboxes on {system} with zero errors and leftovers: "
            f"errors {errors}, removal errors {(teardown.get('errors') or {}).get('total')}, "
            f"leftovers {left} → {'met' if met else 'not met'}"
        )
    for m in _ms_of("overhead", run):
        value = _metric(m, "throughput")
        lines.append(
            f"- runtime overhead ≥ 20,000 no-op execs/s ({m['params']['library']}, "
            f"C={m['params']['concurrency']}): {_fmt(value)} → {_verdict(value, 20_000)}"
        )
    high = [
        m for m in _ms_of("rollout", run)
        if m["system"].startswith("asyncsandbox-docker") and m["params"]["concurrency"] >= 64
    ]  # fmt: skip
    if high:
        wedged = [
            m for m in high if m["status"] == "wedged" or (m.get("after") or {}).get("wedged")
        ]
        lines.append(
            f"- zero wedges for asyncsandbox at rollout C ≥ 64: {len(wedged)} of {len(high)} "
            f"points wedged → {'met' if not wedged else 'not met'}"
        )
    if not lines:
        return []
    return ["## Targets (issue 5), as measured in this run", "", *lines, ""]


# -- the document ---------------------------------------------------------------------


def render(run: dict[str, Any], *, link_prefix: str = "", log: bool = True) -> str:
    index = Index(run["measurements"])
    from ._machine import short

    lines = [
        f"# asyncsandbox bench — run {run['run_id']}",
        "",
        f"Command: `{run['command_line']}`  ",
        (
            f"Preset: {run['preset']}; started {run['started']}, took "
            f"{_fmt(run.get('seconds', 0) / 60, 1)} min.  "
        ),
        f"Machine: {short(run['machine'])}.  ",
        (
            f"Image: `{run['parameters'].get('image')}`; operation deadline "
            f"{run['parameters'].get('op_deadline')} s."
        ),
        "",
        (
            "Columns: `x docker-py` / `x raw-aiodocker` / `x host-spawn` divide a figure by "
            "that system's at the same parameters in this run (above 1: faster). `other CPU`: "
            "the share of the machine's CPUs used, while the point ran, by processes that are "
            "neither the measuring worker nor the Docker engine (bold above 10%: the point "
            "was measured on a busy machine and is pessimistic)."
        ),
        "",
    ]
    lines += _headlines(run, index)
    lines += _targets(run, index)
    sections = {section.workload: section for section in SECTIONS}
    for workload in WORKLOAD_ORDER:
        lines += sections[workload].render(run, index)
        for plot in run.get("plots", {}).get(workload, []):
            lines += [f"![{Path(plot).stem}]({link_prefix}{plot})", ""]
    lines += _ray_section(run, index)
    problems = [m for m in run["measurements"] if m["status"] not in ("ok",)]
    errors = [
        m for m in run["measurements"]
        if m["status"] == "ok" and (m["result"] or {}).get("errors", {}).get("total")
    ]  # fmt: skip
    if problems or errors or run.get("skipped"):
        lines += ["## Problems, skips and notes", ""]
        for s in run.get("skipped", []):
            lines.append(f"- skipped {s['workload']} / {s['system']}: {s['reason']}")
        for m in problems:
            lines.append(
                f"- {m['workload']} / {m['system']} {m['params']}: **{m['status']}** — "
                f"{(m.get('note') or '').splitlines()[0][:300] if m.get('note') else ''} "
                f"(log: `{m.get('log')}`)"
            )
        for m in errors:
            by_type = m["result"]["errors"]["by_type"]
            examples = m["result"]["errors"].get("examples", {})
            first = next(iter(examples.items()), ("", ""))
            lines.append(
                f"- {m['workload']} / {m['system']} {m['params']}: errors {by_type}; e.g. "
                f"{first[0]}: {first[1][:200]!r}"
            )
        lines.append("")
    notes = sorted({(m["system"], n) for m in run["measurements"] for n in m.get("notes", [])})
    if notes:
        lines += ["Notes from the systems:", ""]
        lines += [f"- {system}: {note}" for system, note in notes]
        lines.append("")
    if log:
        lines += ["## Systems", ""]
        lines += [f"- **{name}**: {text}" for name, text in run.get("systems", {}).items()]
        lines += ["", "## Log of the run", "", "```", *run.get("log", []), "```", ""]
    return "\n".join(lines)


# -- plots ----------------------------------------------------------------------------


def plot(run: dict[str, Any], run_dir: Path) -> dict[str, list[str]]:
    """PNG plots into ``run_dir/plots``; returns their paths relative to ``run_dir`` by
    workload (empty when matplotlib is not installed)."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return {}
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[str]] = {}

    ticker: Any = importlib.import_module("matplotlib.ticker")

    def tidy(ax: Any, ms: list[Measurement], x: str) -> None:
        """Concurrency axes: log base 2, ticks at the measured values, plain numbers."""
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({m["params"][x] for m in ms}))
        ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        if ax.get_yscale() == "log":
            ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())

    def save(fig: Any, workload: str, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        made.setdefault(workload, []).append(f"plots/{name}")

    def series(
        ms: list[Measurement], x: str, y: Callable[[Measurement], float | None]
    ) -> dict[str, tuple[list[float], list[float]]]:
        out: dict[str, tuple[list[float], list[float]]] = {}
        for m in ms:
            value = y(m)
            if value is None:
                continue
            xs, ys = out.setdefault(m["system"], ([], []))
            xs.append(m["params"][x])
            ys.append(value)
        return out

    execs = _ms_of("exec", run)
    for command in ("python", "true"):
        ms = [m for m in execs if m["params"]["command"] == command]
        if not ms:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system, (xs, ys) in series(
            ms, "concurrency", lambda m: _metric(m, "throughput")
        ).items():
            left.plot(xs, ys, marker="o", label=system)
        for system, (xs, ys) in series(
            ms,
            "concurrency",
            lambda m: (
                (m["result"]["latency"].get("p50") or 0) * 1000
                if _metric(m, "throughput")
                else None
            ),
        ).items():
            right.plot(xs, ys, marker="o", label=system)
        left.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="execs/s",
                 title=f"exec throughput ({command})")  # fmt: skip
        right.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="p50 latency (ms)",
                  title=f"exec latency p50 ({command})")  # fmt: skip
        left.legend(fontsize=7)
        for ax in (left, right):
            tidy(ax, ms, "concurrency")
            ax.grid(True, which="both", alpha=0.3)
        save(fig, "exec", f"exec-{command}.png")
    lifecycle = _ms_of("lifecycle", run)
    if lifecycle:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system, (xs, ys) in series(
            lifecycle, "concurrency", lambda m: _metric(m, "throughput")
        ).items():
            left.plot(xs, ys, marker="o", label=system)
        for system, (xs, ys) in series(
            lifecycle,
            "concurrency",
            lambda m: (
                (m["result"]["create"].get("p50") or 0) * 1000 if _metric(m, "throughput") else None
            ),
        ).items():
            right.plot(xs, ys, marker="o", label=system)
        left.set(
            yscale="log", xlabel="concurrency", ylabel="sandboxes/s", title="create+remove cycles/s"
        )
        right.set(
            xscale="log",
            yscale="log",
            xlabel="concurrency",
            ylabel="ms",
            title="create-to-ready p50",
        )
        left.legend(fontsize=7)
        for ax in (left, right):
            tidy(ax, lifecycle, "concurrency")
            ax.grid(True, which="both", alpha=0.3)
        save(fig, "lifecycle", "lifecycle.png")
    rollout = _ms_of("rollout", run)
    if rollout:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in sorted({m["params"]["rollouts"] for m in rollout}):
            ms = [m for m in rollout if m["params"]["rollouts"] == r]
            for system, (xs, ys) in series(
                ms, "concurrency", lambda m: _metric(m, "throughput")
            ).items():
                ax.plot(xs, ys, marker="o", label=f"{system} R={r}")
        ax.set(xlabel="concurrency", ylabel="rollouts/s", title="rollout throughput")
        tidy(ax, rollout, "concurrency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "rollout", "rollout.png")
        reference = [m for m in rollout if m["params"] == {"rollouts": 256, "concurrency": 32}]
        if reference:
            fig, ax = plt.subplots(figsize=(8, 4))
            names = [m["system"] for m in reference]
            values = [_metric(m, "throughput") or 0.0 for m in reference]
            bars = ax.bar(names, values, color="tab:blue")
            index = Index(run["measurements"])
            for bar, m in zip(bars, reference, strict=True):
                ratio = index.ratio(m, BASELINE)
                label = m["status"] if m["status"] != "ok" else _x(ratio) + " docker-py"
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)  # fmt: skip
            ax.set(ylabel="rollouts/s", title="rollouts/s at R=256, C=32")
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
            save(fig, "rollout", "rollout-r256-c32.png")
    scale = _ms_of("scale", run)
    if scale:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        seen = set()
        for m in scale:
            teardown = (m.get("extra") or {}).get("teardown") or {}
            timeline = teardown.get("timeline") or []
            if timeline and m["system"] not in seen:
                seen.add(m["system"])
                left.plot([t for t, _ in timeline], [n for _, n in timeline], label=m["system"])
        for system, (xs, ys) in series(
            scale, "sandboxes", lambda m: _metric(m, "memory_per_sandbox_mib")
        ).items():
            right.plot(xs, ys, marker="o", label=system)
        left.set(xlabel="seconds", ylabel="live sandboxes", title="time to reach N")
        right.set(
            xscale="log",
            xlabel="live sandboxes",
            ylabel="MiB per sandbox",
            title="host memory per sandbox",
        )
        tidy(right, scale, "sandboxes")
        for ax in (left, right):
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        save(fig, "scale", "scale.png")
    overhead = _ms_of("overhead", run)
    if overhead:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [f"{m['params']['library']}\nC={m['params']['concurrency']}" for m in overhead]
        ax.bar(labels, [_metric(m, "throughput") or 0.0 for m in overhead], color="tab:green")
        ax.axhline(20_000, color="tab:red", linestyle="--", label="target 20,000/s")
        ax.set(ylabel="no-op execs/s", title="runtime overhead (FakeBackend)")
        ax.legend(fontsize=8)
        save(fig, "overhead", "overhead.png")
    return made


def write(run_dir: Path) -> Path:
    """(Re)write ``results.md`` and the plots of the run in ``run_dir``."""
    results = run_dir / "results.json"
    run = json.loads(results.read_text())
    run["plots"] = plot(run, run_dir)
    results.write_text(json.dumps(run, indent=1) + "\n")
    target = run_dir / "results.md"
    target.write_text(render(run))
    return target


def write_latest(run_dirs: list[Path], target: Path) -> None:
    """``latest.md``: the given runs' reports in the given order, with links relative to
    ``target``'s folder (each run's own ``results.md`` also has its log and system list)."""
    runs = []
    for run_dir in run_dirs:
        run_dir = run_dir.resolve()
        run = json.loads((run_dir / "results.json").read_text())
        base = target.parent.resolve()
        prefix = f"{run_dir.relative_to(base)}/" if run_dir.is_relative_to(base) else f"{run_dir}/"
        runs.append((run, prefix))
    parts = [
        "# asyncsandbox bench — latest results",
        "",
        (
            "Each section below is one run: one command line, one machine stamp, every "
            "ratio computed between systems of that run only. Full data: each run folder's "
            "`results.json`; per-operation samples and worker logs: `bench/results/raw/` "
            "(not committed). What the systems are and how to read the columns: "
            "[bench/README.md](../README.md)."
        ),
        "",
    ]
    parts += [
        f"- [{run['run_id']}]({prefix}results.md): `{run['command_line']}`" for run, prefix in runs
    ]
    parts.append("")
    for run, prefix in runs:
        body = render(run, link_prefix=prefix, log=False)
        parts.append(("#" + body).replace("\n## ", "\n### "))
        parts.append("")
    target.write_text("\n".join(parts))
