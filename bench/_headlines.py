"""A report's headlines (the figures the README quotes, each with what it is measured
against) and its targets (the issues' goals, met or not, in this run)."""

from __future__ import annotations

from typing import Any

from ._systems import BASELINE, FLOORS, RAY_DIRECT
from ._tables import (
    Index,
    Measurement,
    errors_cell,
    fmt_ms,
    fmt_number,
    fmt_x,
    leftovers_cell,
    md_table,
    metric_of,
    of_workload,
    other_cell,
    system_order,
    verdict_of,
)


def _best(ms: list[Measurement]) -> Measurement | None:
    ok = [m for m in ms if metric_of(m, "throughput") is not None]
    return max(ok, key=lambda m: metric_of(m, "throughput") or 0.0) if ok else None


def headlines(run: dict[str, Any], index: Index) -> list[str]:
    lines = ["## Headlines", ""]
    # Rollouts at R=256, C=32 (the reference point) or the run's own points.
    rollout = of_workload("rollout", run)
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
                    fmt_number(metric_of(m, "throughput"))
                    if m["status"] == "ok"
                    else f"**{m['status']}**",
                    fmt_x(index.ratio(m, BASELINE)),
                    fmt_x(index.ratio(m, FLOORS["api"])),
                    errors_cell(m),
                    other_cell(m),
                    leftovers_cell(m),
                ]
            )
        lines += [f"Rollouts/s ({title}):", ""]
        lines += md_table(
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
    execs = of_workload("exec", run)
    if execs:
        rows = []
        for command in ("python", "true"):
            systems = system_order(
                [m["system"] for m in execs if m["params"]["command"] == command], run
            )
            peaks = {
                s: _best(
                    [m for m in execs if m["system"] == s and m["params"]["command"] == command]
                )
                for s in systems
            }
            ref = {name: peaks.get(name) for name in (BASELINE, FLOORS["api"], FLOORS["spawn"])}
            for system, peak in peaks.items():
                value = metric_of(peak, "throughput")
                cells = [system, command]
                cells.append(
                    f"{fmt_number(value)} (C={peak['params']['concurrency']})" if peak else "-"
                )
                for name in (BASELINE, FLOORS["api"], FLOORS["spawn"]):
                    base = metric_of(ref[name], "throughput")
                    cells.append(fmt_x(value / base if value and base else None))
                rows.append(cells)
        lines += ["Peak exec throughput (best concurrency of each system):", ""]
        lines += md_table(
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
    lifecycle = of_workload("lifecycle", run)
    if lifecycle:
        concurrencies = sorted({m["params"]["concurrency"] for m in lifecycle})
        systems = system_order([m["system"] for m in lifecycle], run)
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
                        f"{fmt_number(metric_of(found[0], 'throughput'))} "
                        f"(p50 {fmt_ms(found[0]['result'].get('create'), 'p50')} ms)"
                    )
            rows.append(cells)
        lines += ["Lifecycle: sandboxes/s (create-to-ready p50) by concurrency:", ""]
        lines += md_table(["system", *[f"C={c}" for c in concurrencies]], rows)
        lines.append("")
    overhead = of_workload("overhead", run)
    if overhead:
        cells = [
            f"{m['params']['library']} C={m['params']['concurrency']}: "
            f"{fmt_number(metric_of(m, 'throughput'))}/s"
            for m in overhead
        ]
        lines += ["Runtime overhead (no-op execs/s on FakeBackend): " + "; ".join(cells), ""]
    scale = of_workload("scale", run)
    if scale:
        lines.append("Scale (largest size reached per system):")
        lines.append("")
        for system in system_order([m["system"] for m in scale], run):
            ok = [m for m in scale if m["system"] == system and m["status"] == "ok"]
            if not ok:
                lines.append(f"- {system}: nothing reached")
                continue
            top = max(ok, key=lambda m: m["params"]["sandboxes"])
            r = top["result"]
            teardown = (top.get("extra") or {}).get("teardown") or {}
            lines.append(
                f"- {system}: {r['live']} live in {fmt_number(r['seconds_to_reach'], 1)} s, "
                f"{fmt_number(r.get('memory_per_sandbox_mib'))} MiB host memory per sandbox, exec "
                f"p50 {fmt_ms(r.get('exec_latency'), 'p50')} ms at that size, "
                f"{r['errors']['total']} errors; removal "
                f"{fmt_number(teardown.get('seconds'), 1)} s with "
                f"{(teardown.get('errors') or {}).get('total', '?')} errors, leftovers "
                f"{teardown.get('leftovers', '?')}"
            )
        lines.append("")
    lines += _wedges(run)
    return lines


def _wedges(run: dict[str, Any]) -> list[str]:
    systems = system_order(
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


def targets(run: dict[str, Any], index: Index) -> list[str]:
    """The issue's targets, as far as this run measured them."""
    lines = []

    def find(workload: str, system: str, params: dict[str, Any]) -> Measurement | None:
        return index.get(workload, system, params)

    ref = {"rollouts": 256, "concurrency": 32}
    ours = find("rollout", "asyncsandbox-docker", ref)
    if ours is not None:
        lines.append(
            f"- Docker rollouts/s at C=32, R=256 ≥ 2x docker-py: "
            f"{fmt_x(index.ratio(ours, BASELINE))} → "
            f"{verdict_of(index.ratio(ours, BASELINE), 2.0)}"
        )
    api = find("rollout", "asyncsandbox-docker-api", ref)
    if api is not None:
        ratio = index.ratio(api, FLOORS["api"])
        lines.append(
            f"- fast path off, rollouts within 10% of raw aiodocker: {fmt_x(ratio)} → "
            f"{verdict_of(ratio, 0.9)}"
        )
    for m in of_workload("rollout", run):
        if m["system"] == "asyncsandbox-ray" and m["params"]["concurrency"] in (16, 32):
            ratio = index.ratio(m, RAY_DIRECT)
            lines.append(
                f"- Ray rollouts ≥ 0.9x the nodes' backend directly ({RAY_DIRECT}), "
                f"R={m['params']['rollouts']}, C={m['params']['concurrency']}: {fmt_x(ratio)} → "
                f"{verdict_of(ratio, 0.9)}"
            )
    execs = of_workload("exec", run)

    def peak(system: str) -> float | None:
        return metric_of(
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
            f"path (asyncsandbox-docker-api): {fmt_x(fast / api_exec)} → "
            f"{verdict_of(fast / api_exec, 3.0)}"
        )
    if fast is not None and spawn:
        lines.append(
            f"- exec throughput (python, peak), fast path ({fast_name}) ≥ 0.7x host spawn: "
            f"{fmt_x(fast / spawn)} → "
            f"{verdict_of(fast / spawn, 0.7)}"
        )
    pool = [m for m in of_workload("lifecycle", run) if m["system"] == "asyncsandbox-docker-pool"]
    for m in pool:
        p50 = ((m.get("result") or {}).get("create") or {}).get("p50")
        lines.append(
            f"- warm-pool acquisition p50 < 10 ms (C={m['params']['concurrency']}): "
            f"{fmt_ms((m.get('result') or {}).get('create'), 'p50')} ms → "
            f"{verdict_of(p50 * 1000 if p50 is not None else None, 10.0, above=False)}"
        )
    for system, goal in (("asyncsandbox-docker", 1000), ("asyncsandbox-process", 5000)):
        ms = [m for m in of_workload("scale", run) if m["system"] == system]
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
    for m in of_workload("overhead", run):
        value = metric_of(m, "throughput")
        lines.append(
            f"- runtime overhead ≥ 20,000 no-op execs/s ({m['params']['library']}, "
            f"C={m['params']['concurrency']}): {fmt_number(value)} → {verdict_of(value, 20_000)}"
        )
    high = [
        m for m in of_workload("rollout", run)
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
