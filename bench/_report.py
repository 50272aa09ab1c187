"""Markdown tables and PNG plots from a run's ``results.json``.

Ratios compare systems measured in the same run at the same parameters: ``x docker-py``
(common practice), ``x raw-aiodocker`` (the floor of the Engine API path) and, for execs,
``x host-spawn`` (the floor of process creation). Above 1 means faster than the reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._headlines import headlines, targets
from ._plots import plot
from ._systems import BASELINE, FLOORS, RAY_DIRECT
from ._tables import (
    WORKLOAD_ORDER,
    Index,
    Measurement,
    errors_cell,
    fmt_ms,
    fmt_number,
    fmt_x,
    leftovers_cell,
    md_table,
    metric_of,
    micros,
    of_workload,
    other_cell,
    system_name,
    verdict_of,
)

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
        ms = of_workload(self.workload, run)
        if not ms:
            return []
        rows = [[cell(m, index) for _, cell in self.columns] for m in ms]
        return [
            f"## {self.workload}",
            "",
            self.intro(run),
            "",
            *md_table([header for header, _ in self.columns], rows),
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
            return fmt_number(_result(m).get("throughput"))
        return f"**{m['status']}**" if status_in_bold else "-"

    return cell


def _latency(key: str, quantile: str, *within: str) -> Cell:
    """Milliseconds of ``result[key]`` (or of ``result[within...][key]``) at ``quantile``."""

    def cell(m: Measurement, index: Index) -> str:
        found: Any = _result(m)
        for part in within:
            found = found.get(part) or {}
        return fmt_ms(found.get(key), quantile)

    return cell


def _times(reference: str) -> Cell:
    return lambda m, index: fmt_x(index.ratio(m, reference))


_SYSTEM: tuple[str, Cell] = ("system", lambda m, index: str(m["system"]))
_SYSTEM_POOL: tuple[str, Cell] = ("system", lambda m, index: system_name(m))
_ERRORS: tuple[str, Cell] = ("errors", lambda m, index: errors_cell(m))
_OTHER: tuple[str, Cell] = ("other CPU", lambda m, index: other_cell(m))
_LEFTOVERS: tuple[str, Cell] = ("leftovers", lambda m, index: leftovers_cell(m))
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


def _scale_live(m: Measurement, index: Index) -> str:
    return str(_result(m).get("live", "-")) if m["status"] == "ok" else f"**{m['status']}**"


def _cpu_ms_per_op(m: Measurement | None, cores: int) -> float | None:
    """Milliseconds of CPU the system used per operation of a point: its processes' share
    of the machine (``cpu.ours``: the worker, and for Ray the whole local cluster, whose
    processes descend from it) times the point's seconds, over the operations done."""
    if m is None or m["status"] != "ok" or not m.get("result"):
        return None
    result, share = m["result"], (m.get("cpu") or {}).get("ours")
    done = result.get("ok") or result.get("count")
    if not isinstance(share, int | float) or not done or not result.get("seconds"):
        return None
    return 1000 * float(share) * float(result["seconds"]) * cores / float(done)


def _ray_section(run: dict[str, Any], index: Index) -> list[str]:
    """Ray's hop: each asyncsandbox-ray figure beside the nodes' backend run directly."""
    cores = int(run.get("machine", {}).get("cores") or 1)
    rows = []
    for m in [m for w in ("exec", "lifecycle", "rollout") for m in of_workload(w, run)]:
        if m["system"] != "asyncsandbox-ray":
            continue
        direct = index.get(m["workload"], RAY_DIRECT, m["params"])
        cpu_direct, cpu_ray = _cpu_ms_per_op(direct, cores), _cpu_ms_per_op(m, cores)
        rows.append(
            [
                m["workload"],
                ", ".join(f"{k}={v}" for k, v in m["params"].items() if k != "duration"),
                fmt_number(metric_of(direct, "throughput")),
                fmt_number(metric_of(m, "throughput")) if m["status"] == "ok" else m["status"],
                fmt_x(index.ratio(m, RAY_DIRECT)),
                fmt_number(cpu_direct),
                fmt_number(cpu_ray),
                fmt_x(cpu_direct / cpu_ray if cpu_direct and cpu_ray else None),
                errors_cell(m),
                other_cell(m),
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
            "create+remove cycles. CPU ms per operation: the system's processes' CPU (the "
            "worker's, and for Ray the whole local cluster's: raylets, GCS, node agents, "
            "sandboxes) over the point, per rollout, exec or cycle; `x direct (CPU)` is "
            "their ratio (above 1: Ray used less)."
        ),
        "",
        *md_table(
            [
                "workload",
                "point",
                f"{RAY_DIRECT} /s",
                "ray /s",
                "x direct",
                "CPU ms/op direct",
                "CPU ms/op ray",
                "x direct (CPU)",
                "errors",
                "other CPU",
            ],
            rows,
        ),
        "",
    ]


def _engine_rss(m: Measurement, index: Index) -> str:
    rss = _result(m).get("daemon_rss_delta_per_sandbox_mib") or {}
    return fmt_number(sum(v for v in rss.values() if isinstance(v, int | float)) if rss else None)


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
            f"- {system}: removed {removed} in {fmt_number(t.get('seconds'), 1)} s "
            f"({fmt_number(t.get('rate'))}/s), {errors} removal errors, leftovers "
            f"{t.get('leftovers')} (after exit: {after})."
        )
    return [*lines, ""]


def _overhead_us(quantile: str) -> Cell:
    return lambda m, index: fmt_number(micros((_result(m).get("latency") or {}).get(quantile)), 1)


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
            ("s to reach", lambda m, index: fmt_number(_result(m).get("seconds_to_reach"), 1)),
            ("creates/s", lambda m, index: fmt_number(_result(m).get("rate"))),
            (
                "MiB/sandbox (host)",
                lambda m, index: fmt_number(_result(m).get("memory_per_sandbox_mib")),
            ),
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
            ("target ≥ 20,000/s", lambda m, index: verdict_of(metric_of(m, "throughput"), 20_000)),
        ),
    ),
)
"""The workloads' tables, in :data:`WORKLOAD_ORDER`."""


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
            f"{fmt_number(run.get('seconds', 0) / 60, 1)} min.  "
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
    lines += headlines(run, index)
    lines += targets(run, index)
    sections = {section.workload: section for section in SECTIONS}
    for workload in WORKLOAD_ORDER:
        lines += sections[workload].render(run, index)
        for picture in run.get("plots", {}).get(workload, []):
            lines += [f"![{Path(picture).stem}]({link_prefix}{picture})", ""]
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
