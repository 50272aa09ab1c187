"""Load with chaos, and cancellation storms.

Load: N rollouts at concurrency C, one in ten hostile, with faults injected from outside
(containers killed, command trees SIGKILLed): every rollout ends with a typed result or a
typed infrastructure error — none lost, none duplicated — nothing is left, and our memory
stays bounded. CI runs a small N; ``ASYNCSANDBOX_TORTURE_FULL=1`` runs N=1000 at C=64.

Storms: 500 (process) / 120 (docker) operations in flight — creates, execs, uploads,
writes, removes — and random subsets cancelled at random points: afterwards no process,
container or directory is left and the Session's counters balance.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import (
    CommandError,
    InfrastructureError,
    Limits,
    Operation,
    Resources,
    Sandbox,
    SandboxClosed,
    SandboxError,
    Session,
)

from .._support import Target, processes_gone, unique_marker
from . import _host
from ._report import REPORT, full_run

# Load with chaos and cancellation storms: slow (`uv run pytest -m slow`; CI runs them once).
pytestmark = pytest.mark.slow

HOSTILE = {
    "loop": (["python3", "-c", "while True: pass"], 2),
    "fork_bomb": (["sh", "-c", "b() { b | b & }; b; sleep 100"], 2),
    "flood": (["head", "-c", "67108864", "/dev/zero"], 60),
    "memory_hog": (["python3", "-c", "x = bytearray(256 << 20)"], 60),
    "daemon": (["sh", "-c", "setsid sleep {marker} & nohup sleep {marker} & echo up"], 30),
    "sigterm_ignorer": (["sh", "-c", "trap '' TERM; sleep {marker}"], 2),
}


def sizes(target: str) -> tuple[int, int]:
    if full_run():
        return 1000, 64
    return (150, 16) if target == "docker" else (300, 32)


@pytest.mark.timeout(900)  # hundreds of rollouts: minutes when CI shares the machine
@pytest.mark.parametrize("target_name", ["process", "docker"])
async def test_load_with_chaos(
    target_name: str, request: pytest.FixtureRequest, rng: random.Random
) -> None:
    target: Target = request.getfixturevalue(f"{target_name}_target_fixture")
    n, concurrency = sizes(target_name)
    marker = unique_marker()
    outcomes: dict[int, list[str]] = {}
    hostile = 0
    faults = 0
    live: dict[int, Sandbox] = {}
    limiter = anyio.CapacityLimiter(concurrency)

    def note(i: int, what: str) -> None:
        outcomes.setdefault(i, []).append(what)

    async def rollout(s: Session, i: int) -> None:
        nonlocal hostile
        kind = rng.choice(sorted(HOSTILE)) if i % 10 == 0 else "honest"
        hostile += kind != "honest"
        async with limiter:
            outcome = f"{kind}: no outcome"
            try:
                async with s.sandbox() as sb:
                    live[i] = sb
                    try:
                        await sb.write_file("task.py", f"print({i} * 2)\n")
                        if kind == "honest":
                            r = await sb.exec(["python3", "task.py"], timeout=60)
                            assert r.stdout == f"{i * 2}\n".encode() or r.returncode != 0, r
                        else:
                            argv, timeout = HOSTILE[kind]
                            argv = [a.replace("{marker}", marker) for a in argv]
                            r = await sb.exec(argv, timeout=timeout)
                        outcome = f"{kind}: exit {r.returncode}"
                        await sb.read_file("task.py")
                    finally:
                        live.pop(i, None)
            except CommandError as exc:
                outcome = f"{kind}: {type(exc).__name__}"
            except InfrastructureError as exc:
                outcome = f"{kind}: infra {type(exc).__name__}"
            except SandboxError as exc:  # file errors after a fault
                outcome = f"{kind}: {type(exc).__name__}"
            note(i, outcome)  # exactly once per rollout, whatever happened

    async def chaos(s: Session) -> None:
        """Every so often, kill a random live sandbox (Docker) or command (process) from
        outside."""
        nonlocal faults
        while True:
            await anyio.sleep(rng.uniform(0.2, 0.6))
            if not live:
                continue
            sb = live.get(rng.choice(list(live)))
            if sb is None or sb.id is None:
                continue
            if target_name == "docker":
                await _host.adocker("kill", sb.id, check=False)
            else:
                _host.signal_processes(sb.id, signal.SIGKILL)  # the sandbox's processes
                _host.signal_processes(marker, signal.SIGKILL)
            faults += 1

    _host.reset_peak_rss()
    rss_before = _host.rss()
    started = time.monotonic()
    async with target.session(
        limits=Limits(max_live=concurrency, max_execs=concurrency),
        resources=Resources(memory_mb=128, pids=64),
    ) as s:
        async with anyio.create_task_group() as tg:
            tg.start_soon(chaos, s)
            async with anyio.create_task_group() as work:
                for i in range(n):
                    work.start_soon(rollout, s, i)
            tg.cancel_scope.cancel()
        stats = s.statistics()
    elapsed = time.monotonic() - started
    peak = _host.peak_rss() - rss_before
    lost = [i for i in range(n) if i not in outcomes]
    duplicated = [i for i, o in outcomes.items() if len(o) != 1]
    kinds = Counter(o[0].split(": ", 1)[1].split(" ")[0] for o in outcomes.values() if o)
    left = target.leftovers()
    gone = await processes_gone(marker, within=target.bound)
    REPORT.load(
        target_name,
        rollouts=n,
        concurrency=concurrency,
        hostile=hostile,
        faults_injected=faults,
        lost=len(lost),
        duplicated=len(duplicated),
        outcomes=dict(kinds),
        leftovers=len(left),
        seconds=round(elapsed, 1),
        rss_growth_mib=peak >> 20,
    )
    for i in lost:
        REPORT.lost("test_load_with_chaos", "rollout", f"{target_name} #{i}")
    assert lost == [], f"rollouts without an outcome: {lost[:20]}"
    assert duplicated == [], f"rollouts with two outcomes: {duplicated[:20]}"
    assert left == [], f"left behind: {left[:5]}"
    assert gone == []
    assert stats.sandboxes_started == stats.sandboxes_removed
    assert stats.live.active == stats.execs.active == stats.lifecycle.active == 0
    assert peak < 512 << 20, f"our memory grew by {peak >> 20} MiB"
    assert hostile >= n // 10


# -- cancellation storms ----------------------------------------------------------------------


def storm_size(target: str) -> int:
    return 500 if target == "process" or full_run() else 120


async def storm(target: Target, rng: random.Random, tmp_path: Path) -> dict[str, Any]:
    n = storm_size(target.name)
    marker = unique_marker()
    upload = tmp_path / "upload"
    upload.mkdir()
    for k in range(20):
        (upload / f"f{k}.txt").write_text("x" * 1000 * k)
    kinds = Counter[str]()
    async with target.session(limits=Limits(max_live=128, max_lifecycle=16)) as s:
        shared = [await s.sandbox().start() for _ in range(8)]
        doomed = [await s.sandbox().start() for _ in range(n // 10)]
        doomed_iter = iter(doomed)

        async def create() -> None:
            async with s.sandbox() as sb:
                await sb.exec(["sh", "-c", f"sleep 0.{rng.randrange(1, 9)}; : {marker}"])

        async def exec_() -> None:
            sb = rng.choice(shared)
            await sb.exec(["sleep", f"0.{rng.randrange(1, 99):02d}{marker[5:]}"], timeout=30)

        async def upload_() -> None:
            await rng.choice(shared).upload(upload, f"up/{rng.randrange(10**6)}")

        async def write() -> None:
            await rng.choice(shared).write_file(f"w/{rng.randrange(10**6)}", b"y" * 100_000)

        async def remove() -> None:
            sb = next(doomed_iter, None)
            if sb is not None:
                await sb.stop()

        jobs = {
            "create": create,
            "exec": exec_,
            "upload": upload_,
            "write": write,
            "remove": remove,
        }
        ops: list[Operation[None]] = []
        for _ in range(n):
            kind = rng.choice(sorted(jobs))
            kinds[kind] += 1
            ops.append(s.submit(jobs[kind](), name=kind))
        # Cancel random subsets at random points while they run.
        to_cancel = rng.sample(ops, k=n // 2)
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for op in to_cancel:

                async def cancel_later(op: Operation[None] = op) -> None:
                    await anyio.sleep(rng.uniform(0, 1.5))
                    op.cancel()

                tg.start_soon(cancel_later)
        with anyio.fail_after(120):
            for op in ops:
                with contextlib.suppress(SandboxError):
                    await op
        elapsed = time.monotonic() - started
        cancelled = sum(op.cancelled() for op in ops)
        failed = [op for op in ops if not op.cancelled() and op.exception() is not None]
        unexpected = [
            op.exception()
            for op in failed
            if not isinstance(op.exception(), SandboxClosed)  # a remove racing an exec
        ]
        for sb in shared:  # still usable after the storm
            assert (await sb.exec(["echo", "ok"], timeout=30)).stdout == b"ok\n"
    stats = s.statistics()
    left = target.leftovers()
    procs = await processes_gone(marker[5:], within=target.bound)
    summary = {
        "operations": n,
        "kinds": dict(kinds),
        "cancelled": cancelled,
        "failed": len(failed),
        "lost": len(left) + len(procs),
        "seconds": round(elapsed, 1),
    }
    REPORT.cancellation(target.name, **summary)
    assert unexpected == [], unexpected[:5]
    assert left == [], f"left behind: {left[:5]}"
    assert procs == [], f"processes left: {procs[:5]}"
    assert cancelled > 0
    assert stats.sandboxes_started == stats.sandboxes_removed, stats
    assert stats.live.active == stats.lifecycle.active == stats.execs.active == 0, stats
    assert stats.live.waiting == stats.lifecycle.waiting == stats.execs.waiting == 0, stats
    if target.name == "process":
        assert _host.cgroups_of({sb.id for sb in shared + doomed if sb.id}) == []
    return summary


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_cancellation_storm_process(
    process_target_fixture: Target, rng: random.Random, tmp_path: Path
) -> None:
    await storm(process_target_fixture, rng, tmp_path)


async def test_cancellation_storm_docker(
    docker_target_fixture: Target, rng: random.Random, tmp_path: Path
) -> None:
    await storm(docker_target_fixture, rng, tmp_path)
