"""A run's PNG plots (matplotlib, when installed)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._systems import BASELINE
from ._tables import Index, Measurement, fmt_x, metric_of, of_workload


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

    def rate_and_p50(
        ms: list[Measurement], phase: str, unit: str, titles: tuple[str, str], ylabel: str
    ) -> Any:
        """Two panels over concurrency: the rate (``unit``) and the p50 of ``phase`` in ms
        (each concurrency axis made log base 2 by :func:`tidy`)."""
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system, (xs, ys) in series(
            ms, "concurrency", lambda m: metric_of(m, "throughput")
        ).items():
            left.plot(xs, ys, marker="o", label=system)

        def p50(m: Measurement) -> float | None:
            ok = metric_of(m, "throughput")
            return (m["result"][phase].get("p50") or 0) * 1000 if ok else None

        for system, (xs, ys) in series(ms, "concurrency", p50).items():
            right.plot(xs, ys, marker="o", label=system)
        left.set(yscale="log", xlabel="concurrency", ylabel=unit, title=titles[0])
        right.set(yscale="log", xlabel="concurrency", ylabel=ylabel, title=titles[1])
        left.legend(fontsize=7)
        for ax in (left, right):
            tidy(ax, ms, "concurrency")
            ax.grid(True, which="both", alpha=0.3)
        return fig

    execs = of_workload("exec", run)
    for command in ("python", "true"):
        ms = [m for m in execs if m["params"]["command"] == command]
        if ms:
            titles = (f"exec throughput ({command})", f"exec latency p50 ({command})")
            fig = rate_and_p50(ms, "latency", "execs/s", titles, "p50 latency (ms)")
            save(fig, "exec", f"exec-{command}.png")
    lifecycle = of_workload("lifecycle", run)
    if lifecycle:
        titles = ("create+remove cycles/s", "create-to-ready p50")
        fig = rate_and_p50(lifecycle, "create", "sandboxes/s", titles, "ms")
        save(fig, "lifecycle", "lifecycle.png")
    rollout = of_workload("rollout", run)
    if rollout:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in sorted({m["params"]["rollouts"] for m in rollout}):
            ms = [m for m in rollout if m["params"]["rollouts"] == r]
            for system, (xs, ys) in series(
                ms, "concurrency", lambda m: metric_of(m, "throughput")
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
            values = [metric_of(m, "throughput") or 0.0 for m in reference]
            bars = ax.bar(names, values, color="tab:blue")
            index = Index(run["measurements"])
            for bar, m in zip(bars, reference, strict=True):
                ratio = index.ratio(m, BASELINE)
                label = m["status"] if m["status"] != "ok" else fmt_x(ratio) + " docker-py"
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)  # fmt: skip
            ax.set(ylabel="rollouts/s", title="rollouts/s at R=256, C=32")
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
            save(fig, "rollout", "rollout-r256-c32.png")
    scale = of_workload("scale", run)
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
            scale, "sandboxes", lambda m: metric_of(m, "memory_per_sandbox_mib")
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
    overhead = of_workload("overhead", run)
    if overhead:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [f"{m['params']['library']}\nC={m['params']['concurrency']}" for m in overhead]
        ax.bar(labels, [metric_of(m, "throughput") or 0.0 for m in overhead], color="tab:green")
        ax.axhline(20_000, color="tab:red", linestyle="--", label="target 20,000/s")
        ax.set(ylabel="no-op execs/s", title="runtime overhead (FakeBackend)")
        ax.legend(fontsize=8)
        save(fig, "overhead", "overhead.png")
    return made
