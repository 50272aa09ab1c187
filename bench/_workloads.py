"""The workloads, defined once over :class:`~bench._systems.System`.

Each runs a list of points (one parameter setting each) and reports every finished point
at once through :class:`Progress`, so the orchestrator keeps what was measured even when
it has to kill this process (a wedged daemon). Every operation has a deadline
(``Config.op_deadline``); an operation that fails counts as an error of its point, by type.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from . import _daemon
from ._stats import summary
from ._system import COMMANDS, PYTHON, System

T = TypeVar("T")

ERROR_PAUSE = 0.05  # after a failed operation: a dead daemon must not turn into a busy loop
PAYLOAD = bytes(random.Random(0).getrandbits(8) for _ in range(4096))
ROLLOUT_EXECS = 5
SETUP_WIDTH = 8


class Progress:
    """JSON lines to the orchestrator: which point runs, and each point's result."""

    def __init__(self, path: Path, raw_dir: Path | None) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker
        self._raw = raw_dir

    def event(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": kind, "t": time.time(), **fields}) + "\n")
        self._file.flush()

    def start(self, index: int | str) -> None:
        """A phase begins: a point's index, or ``"setup"`` / ``"teardown"``."""
        self.event("start", index=index)

    def done(self, index: int, result: dict[str, Any], samples: dict[str, Any] | None) -> None:
        if samples and self._raw is not None:
            self._raw.mkdir(parents=True, exist_ok=True)
            target = self._raw / f"point-{os.getpid()}-{index}.json"
            target.write_text(json.dumps(samples))
            result = {**result, "raw_samples": str(target)}
        self.event("done", index=index, result=result)


class Errors:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, what: str, exc: BaseException | str) -> None:
        key = f"{what}: {exc if isinstance(exc, str) else type(exc).__name__}"
        self.counts[key] += 1
        if key not in self.examples:
            self.examples[key] = str(exc)[:300]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_type": dict(self.counts), "examples": self.examples}


async def bounded(deadline: float, awaitable: Awaitable[T]) -> T:
    with anyio.fail_after(deadline):
        return await awaitable


async def shielded_remove(system: System, handle: Any) -> None:
    # Shielded: a rollout that failed or was cancelled must still give its sandbox back.
    with anyio.CancelScope(shield=True):
        await bounded(system.config.op_deadline, system.remove(handle))


async def create_many(system: System, count: int, width: int, errors: Errors) -> list[Any]:
    handles: list[Any] = []
    remaining = iter(range(count))

    async def worker() -> None:
        for _ in remaining:
            try:
                handles.append(await bounded(system.config.op_deadline, system.create()))
            except Exception as exc:  # noqa: BLE001 - counted
                errors.add("create", exc)
                await anyio.sleep(ERROR_PAUSE)

    async with anyio.create_task_group() as tg:
        for _ in range(min(width, count)):
            tg.start_soon(worker)
    return handles


async def remove_many(system: System, handles: list[Any], width: int, errors: Errors) -> None:
    remaining = iter(list(handles))

    async def worker() -> None:
        for handle in remaining:
            try:
                await shielded_remove(system, handle)
            except Exception as exc:  # noqa: BLE001 - counted
                errors.add("remove", exc)

    async with anyio.create_task_group() as tg:
        for _ in range(min(width, max(1, len(handles)))):
            tg.start_soon(worker)


async def check_exec(system: System, handle: Any, command: str) -> None:
    argv, expected = COMMANDS[command]
    code, out = await bounded(system.config.op_deadline, system.exec(handle, argv))
    if code != 0 or out != expected:
        raise WrongResult(f"exit {code}, stdout {out[:80]!r} (expected {expected!r})")


class WrongResult(Exception):
    """A command or a file transfer gave a wrong answer."""


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counters over a point (``pool_hits``); levels (``pool_ready``) as they ended."""
    return {k: v - before.get(k, 0) if k.endswith("hits") else v for k, v in after.items()}


def _width(system: System, width: int) -> None:
    setter: Callable[[int], None] | None = getattr(system, "set_width", None)
    if setter is not None:
        setter(width)


# -- exec -----------------------------------------------------------------------------


async def exec_workload(
    system: System, setup: dict[str, Any], points: list[dict[str, Any]], progress: Progress
) -> None:
    """``sandboxes`` live sandboxes, then per point: ``command`` at ``concurrency`` for
    ``duration`` seconds, round-robin over the sandboxes."""
    errors = Errors()
    count = int(setup["sandboxes"])
    progress.start("setup")
    _width(system, SETUP_WIDTH)
    started = time.perf_counter()
    handles = await create_many(system, count, SETUP_WIDTH, errors)
    try:
        answering = []
        for handle in handles:  # each sandbox answers before anything is timed
            try:
                await check_exec(system, handle, "python")
            except Exception as exc:  # noqa: BLE001 - counted, and the sandbox left out
                errors.add("first exec", exc)
                continue
            answering.append(handle)
        progress.event(
            "setup",
            seconds=time.perf_counter() - started,
            sandboxes=len(answering),
            errors=errors.as_dict(),
        )
        if not answering:
            raise RuntimeError(f"no sandbox could be created: {errors.as_dict()}")
        for index, point in enumerate(points):
            progress.start(index)
            result, samples = await _exec_point(system, answering, point)
            result["setup_errors"] = errors.as_dict()
            progress.done(index, result, samples)
    finally:
        with anyio.CancelScope(shield=True):
            progress.start("teardown")
            _width(system, SETUP_WIDTH)
            await remove_many(system, handles, SETUP_WIDTH, Errors())


async def _exec_point(
    system: System, handles: list[Any], point: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    concurrency = int(point["concurrency"])
    duration = float(point["duration"])
    argv, expected = COMMANDS[point["command"]]
    deadline = system.config.op_deadline
    _width(system, concurrency)
    latencies: list[float] = []
    errors = Errors()
    begin = time.perf_counter()
    end = begin + duration
    last = begin

    async def worker(first: int) -> None:
        nonlocal last
        index = first
        while time.perf_counter() < end:
            handle = handles[index % len(handles)]
            index += concurrency
            t0 = time.perf_counter()
            try:
                code, out = await bounded(deadline, system.exec(handle, argv))
            except Exception as exc:  # noqa: BLE001 - counted
                errors.add("exec", exc)
                await anyio.sleep(ERROR_PAUSE)
                continue
            finally:
                last = max(last, time.perf_counter())
            if code != 0 or out != expected:
                errors.add("exec", f"exit {code}, stdout {out[:60]!r}")
            else:
                latencies.append(time.perf_counter() - t0)

    async with anyio.create_task_group() as tg:
        for first in range(concurrency):
            tg.start_soon(worker, first)
    elapsed = last - begin
    return (
        {
            "ok": len(latencies),
            "seconds": elapsed,
            "throughput": len(latencies) / elapsed if elapsed > 0 else 0.0,
            "latency": summary(latencies),
            "errors": errors.as_dict(),
            "sandboxes": len(handles),
        },
        {"latency": latencies},
    )


# -- lifecycle ------------------------------------------------------------------------


async def lifecycle_workload(
    system: System, setup: dict[str, Any], points: list[dict[str, Any]], progress: Progress
) -> None:
    """Per point: ``count`` sandboxes, each created (to ready) then removed, by
    ``concurrency`` workers."""
    await _each_point(system, points, progress, "count", _lifecycle_point)


Point = Callable[[System, int, int], Awaitable[tuple[dict[str, Any], dict[str, Any]]]]


async def _each_point(
    system: System,
    points: list[dict[str, Any]],
    progress: Progress,
    count_key: str,
    run_point: Point,
) -> None:
    """Run ``run_point(system, concurrency, point[count_key])`` for each point, with the
    system's statistics delta and leftovers recorded."""
    await system.ready()
    for index, point in enumerate(points):
        progress.start(index)
        concurrency, count = int(point["concurrency"]), int(point[count_key])
        _width(system, concurrency)
        before = system.stats()
        result, samples = await run_point(system, concurrency, count)
        result["system_stats"] = _delta(before, system.stats())
        result["leftovers"] = await system.count_leftovers()
        progress.done(index, result, samples)
        await system.ready()  # a warm pool refills between points


async def _lifecycle_point(
    system: System, concurrency: int, count: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    create: list[float] = []
    remove: list[float] = []
    errors = Errors()
    remaining = iter(range(count))
    deadline = system.config.op_deadline

    async def worker() -> None:
        for _ in remaining:
            t0 = time.perf_counter()
            try:
                handle = await bounded(deadline, system.create())
            except Exception as exc:  # noqa: BLE001 - counted
                errors.add("create", exc)
                await anyio.sleep(ERROR_PAUSE)
                continue
            t1 = time.perf_counter()
            create.append(t1 - t0)
            try:
                await shielded_remove(system, handle)
            except Exception as exc:  # noqa: BLE001 - counted
                errors.add("remove", exc)
                continue
            remove.append(time.perf_counter() - t1)

    begin = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    elapsed = time.perf_counter() - begin
    result = {
        "ok": len(remove),
        "seconds": elapsed,
        "throughput": len(remove) / elapsed if elapsed > 0 else 0.0,
        "create": summary(create),
        "remove": summary(remove),
        "errors": errors.as_dict(),
    }
    return result, {"create": create, "remove": remove}


# -- rollout --------------------------------------------------------------------------


async def rollout_workload(
    system: System, setup: dict[str, Any], points: list[dict[str, Any]], progress: Progress
) -> None:
    """Per point: ``rollouts`` rollouts by ``concurrency`` workers; a rollout is create,
    5 runs of the Python command, write a 4 KiB file, read it back, remove."""
    await _each_point(system, points, progress, "rollouts", _rollout_point)


async def _rollout_point(
    system: System, concurrency: int, count: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    deadline = system.config.op_deadline
    totals: list[float] = []
    phases: dict[str, list[float]] = {p: [] for p in ("create", "exec", "write", "read", "remove")}
    errors = Errors()
    remaining = iter(range(count))

    async def timed(phase: str, awaitable: Awaitable[T]) -> T:
        t0 = time.perf_counter()
        value = await bounded(deadline, awaitable)
        phases[phase].append(time.perf_counter() - t0)
        return value

    async def rollout() -> None:
        t0 = time.perf_counter()
        phase = "create"
        try:
            handle = await timed("create", system.create())
        except Exception as exc:  # noqa: BLE001 - counted
            errors.add(phase, exc)
            await anyio.sleep(ERROR_PAUSE)
            return
        failed = False
        try:
            phase = "exec"
            for _ in range(ROLLOUT_EXECS):
                code, out = await timed("exec", system.exec(handle, PYTHON))
                if code != 0 or out != COMMANDS["python"][1]:
                    raise WrongResult(f"exit {code}, stdout {out[:60]!r}")
            phase = "write"
            await timed("write", system.write_file(handle, PAYLOAD))
            phase = "read"
            if await timed("read", system.read_file(handle)) != PAYLOAD:
                raise WrongResult("the file read back differs from the one written")
        except Exception as exc:  # noqa: BLE001 - counted
            errors.add(phase, exc)
            failed = True
        finally:
            try:
                # Shielded: the sandbox goes back even if this task is being cancelled.
                with anyio.CancelScope(shield=True):
                    await timed("remove", system.remove(handle))
            except Exception as exc:  # noqa: BLE001 - counted
                if not failed:
                    errors.add("remove", exc)
                failed = True
        if not failed:
            totals.append(time.perf_counter() - t0)

    async def worker() -> None:
        for _ in remaining:
            await rollout()

    begin = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    elapsed = time.perf_counter() - begin
    return (
        {
            "ok": len(totals),
            "seconds": elapsed,
            "throughput": len(totals) / elapsed if elapsed > 0 else 0.0,
            "latency": summary(totals),
            "phases": {name: summary(values) for name, values in phases.items()},
            "errors": errors.as_dict(),
        },
        {"latency": totals, **phases},
    )


# -- scale ----------------------------------------------------------------------------


async def scale_workload(
    system: System, setup: dict[str, Any], points: list[dict[str, Any]], progress: Progress
) -> None:
    """Grow to each size in turn (the points, ascending) with ``concurrency`` creating
    workers; at each size: growth time so far, host memory per sandbox, exec latency
    (``exec_samples`` Python commands, 4 at a time, on random sandboxes). Then remove all."""
    width = int(setup["concurrency"])
    samples = int(setup["exec_samples"])
    _width(system, width)
    growth = _Growth(system, width)
    mem0 = await _settled_memory()
    rss0 = _daemon.daemon_rss_kib()
    try:
        for index, point in enumerate(points):
            progress.start(index)
            size = int(point["sandboxes"])
            errors = Errors()
            need = max(0, size - len(growth.handles))
            step = await growth.grow(need, errors)
            mem = await _settled_memory()
            rss = _daemon.daemon_rss_kib()
            latencies, exec_errors = await _sample_execs(system, growth.handles, samples, index)
            live = len(growth.handles)
            result = {
                "sandboxes": size,
                "live": live,
                "seconds_to_reach": growth.seconds,
                "seconds_this_step": step,
                "rate": (need / step) if need > 0 and step > 0 else None,
                "mem_available_delta_mib": (mem0 - mem) / 1024,
                "memory_per_sandbox_mib": ((mem0 - mem) / 1024 / live) if live else None,
                "daemon_rss_mib": {k: v / 1024 for k, v in rss.items()},
                "daemon_rss_delta_per_sandbox_mib": {
                    k: ((rss[k] - rss0.get(k, 0)) / 1024 / live) if live else None for k in rss
                },
                "exec_latency": summary(latencies),
                "errors": {
                    "create": errors.as_dict(),
                    "exec": exec_errors.as_dict(),
                    "total": errors.total + exec_errors.total,
                },
            }
            progress.done(index, result, {"exec_latency": latencies})
            if errors.total > max(5, need // 10):
                progress.event("note", text=f"stopped growing at {live}: too many create errors")
                break  # the system is failing: do not push it further
    finally:
        with anyio.CancelScope(shield=True):
            progress.start("teardown")
            removal_errors = Errors()
            t0 = time.perf_counter()
            count = len(growth.handles)
            await remove_many(system, growth.handles, width, removal_errors)
            removed_in = time.perf_counter() - t0
            progress.event(
                "teardown",
                removed=count,
                seconds=removed_in,
                rate=count / removed_in if removed_in > 0 else None,
                errors=removal_errors.as_dict(),
                leftovers=await system.count_leftovers(),
                timeline=_thin(growth.timeline, 200),
            )


class _Growth:
    """Creates sandboxes and keeps them; its clock runs only while it grows."""

    def __init__(self, system: System, width: int) -> None:
        self.system = system
        self.width = width
        self.handles: list[Any] = []
        self.timeline: list[tuple[float, int]] = []
        self.seconds = 0.0

    async def grow(self, need: int, errors: Errors) -> float:
        remaining = iter(range(need))
        began = time.perf_counter()

        async def worker() -> None:
            for _ in remaining:
                try:
                    handle = await bounded(self.system.config.op_deadline, self.system.create())
                except Exception as exc:  # noqa: BLE001 - counted
                    errors.add("create", exc)
                    await anyio.sleep(ERROR_PAUSE)
                    continue
                self.handles.append(handle)
                now = self.seconds + time.perf_counter() - began
                self.timeline.append((now, len(self.handles)))

        async with anyio.create_task_group() as tg:
            for _ in range(min(self.width, max(1, need))):
                tg.start_soon(worker)
        step = time.perf_counter() - began
        self.seconds += step
        return step


async def _sample_execs(
    system: System, handles: list[Any], count: int, seed: int
) -> tuple[list[float], Errors]:
    latencies: list[float] = []
    errors = Errors()
    picks = iter(random.Random(seed).choices(handles, k=count) if handles else [])

    async def sampler() -> None:
        for handle in picks:
            t0 = time.perf_counter()
            try:
                await check_exec(system, handle, "python")
            except Exception as exc:  # noqa: BLE001 - counted
                errors.add("exec", exc)
                continue
            latencies.append(time.perf_counter() - t0)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(sampler)
    return latencies, errors


def _thin(series: list[tuple[float, int]], keep: int) -> list[tuple[float, int]]:
    if len(series) <= keep:
        return series
    step = len(series) / keep
    return [series[int(i * step)] for i in range(keep)] + [series[-1]]


async def _settled_memory() -> int:
    await anyio.sleep(2.0)  # let freed pages and daemon bookkeeping settle
    return _daemon.meminfo_kib("MemAvailable")


# -- overhead -------------------------------------------------------------------------


async def overhead_point(point: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """No-op execs (``["true"]``) through a Session on the in-memory FakeBackend: the
    runtime's own per-call cost, on whichever async library runs this."""
    import asyncsandbox
    from asyncsandbox.testing import FakeBackend

    concurrency = int(point["concurrency"])
    duration = float(point["duration"])
    latencies: list[float] = []
    async with (
        asyncsandbox.Session(FakeBackend(), report_to=[]) as session,
        session.sandbox() as sandbox,
    ):
        for _ in range(200):  # warm-up
            await sandbox.exec(["true"])
        begin = time.perf_counter()
        end = begin + duration

        async def worker() -> None:
            while (now := time.perf_counter()) < end:
                await sandbox.exec(["true"])
                latencies.append(time.perf_counter() - now)

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        elapsed = time.perf_counter() - begin
    return (
        {
            "ok": len(latencies),
            "seconds": elapsed,
            "throughput": len(latencies) / elapsed,
            "latency": summary(latencies),
            "errors": {"total": 0, "by_type": {}, "examples": {}},
        },
        {},
    )


WORKLOADS: dict[
    str, Callable[[System, dict[str, Any], list[dict[str, Any]], Progress], Awaitable[None]]
] = {
    "exec": exec_workload,
    "lifecycle": lifecycle_workload,
    "rollout": rollout_workload,
    "scale": scale_workload,
}
