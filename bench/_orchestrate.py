"""The orchestrator: runs each (workload, system) in a worker process and keeps the run
going whatever the systems do to the daemon.

While a worker runs, the orchestrator watches it: a phase past its time budget is killed
(``timeout``); a Docker daemon that fails ``info`` twice in a row (20 s each) is wedged: the
worker is killed, the wedge counted against the system being measured, the daemon
restarted with its own command line, the run's containers removed, and the next point
measured by a fresh worker. Nothing waits without a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _cpu, _daemon
from ._machine import REPO
from ._systems import SYSTEMS

HEALTH_EVERY = 15.0
POLL = 0.5


@dataclass
class Job:
    """Points of one workload on one system, with a time budget per phase."""

    workload: str
    system: str
    setup: dict[str, Any]
    points: list[dict[str, Any]]
    budgets: dict[str, float]
    """Seconds per phase: ``"setup"``, ``"teardown"``, ``"point"`` (each point), ``"open"``."""
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    events: list[dict[str, Any]]
    returncode: int | None
    ended: str
    """``exit``, ``timeout``, ``wedge`` or ``crash``."""
    phase: int | str | None
    """The phase running when the worker ended (None: it finished)."""
    log: Path
    cpu: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per point: the share of the machine's CPU used by the worker, the engine, others."""


class Run:
    """One invocation: a results folder, its measurements, wedge counts, the daemon."""

    def __init__(
        self, run_id: str, out_dir: Path, raw_dir: Path, *, restart: bool, quiet_wait: float
    ) -> None:
        self.run_id = run_id
        self.quiet_wait = quiet_wait
        self.out_dir = out_dir
        self.raw_dir = raw_dir
        self.restart_allowed = restart
        self.measurements: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.wedges: Counter[str] = Counter()
        self.restarts: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.daemon_command = _daemon.dockerd_command()
        self.daemon_dead = False
        self._serial = 0

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.events.append(line)

    # -- the daemon -------------------------------------------------------------------

    def daemon_state(self) -> str:
        """``ok``, ``wedged`` (``info`` silent twice: load can be bursty, so a second
        chance) or ``down`` (nothing listens for a minute: someone else may be restarting
        it, so give them that minute before calling it down)."""
        state = _daemon.health()
        if state == "wedged":
            state = _daemon.health()
        if state == "down":
            for _ in range(30):
                time.sleep(2.0)
                state = _daemon.health(5.0)
                if state != "down":
                    break
            if state == "ok":
                self.say("  the daemon was down and came back by itself (restarted by others?)")
        return state

    def recover(self, why: str) -> bool:
        """Restart the daemon and remove the run's containers; False if that failed."""
        if not self.restart_allowed:
            self.say(f"daemon unhealthy ({why}); --no-restart: Docker measurements stop here")
            self.daemon_dead = True
            return False
        command = _daemon.dockerd_command() or self.daemon_command
        if not command:
            self.say("cannot restart the daemon: no dockerd command line known")
            self.daemon_dead = True
            return False
        self.daemon_command = command
        self.say(f"restarting the Docker daemon ({why}): {' '.join(command)}")
        try:
            seconds = _daemon.restart(command, log=_daemon.STATE_DIR / "dockerd.log")
        except _daemon.DaemonTimeout as exc:
            self.say(f"the daemon did not come back: {exc}")
            self.restarts.append({"why": why, "ok": False, "error": str(exc)})
            self.daemon_dead = True
            return False
        self.say(f"daemon answers again after {seconds:.1f}s")
        left = self.cleanup_containers()
        self.restarts.append({"why": why, "ok": True, "seconds": seconds, "leftovers": left})
        return True

    def cleanup_containers(self) -> int | None:
        """Remove the run's containers; return how many there were (None: unknown)."""
        try:
            ids = _daemon.containers_of(self.run_id)
        except (_daemon.DaemonTimeout, _daemon.DaemonError) as exc:
            self.say(f"could not list leftover containers: {exc}")
            return None
        if ids:
            failed = _daemon.remove_containers(ids)
            self.say(f"removed {len(ids) - len(failed)} leftover containers ({len(failed)} failed)")
        return len(ids)

    def process_root(self) -> Path:
        return Path(f"/var/lib/asyncsandbox/bench-{self.run_id}")

    def cleanup_process_root(self) -> int:
        root = self.process_root()
        if not root.exists():
            return 0
        count = sum(1 for e in root.iterdir() if not e.name.startswith("."))
        shutil.rmtree(root, ignore_errors=True)
        return count

    # -- workers ----------------------------------------------------------------------

    def execute(self, job: Job) -> None:
        """Measure every point of ``job``; record each as ok, error, timeout or wedged."""
        kind = SYSTEMS[job.system].kind if job.system in SYSTEMS else "fake"
        remaining = list(enumerate(job.points))
        while remaining:
            if kind == "docker" and (self.daemon_dead or not self._ensure_daemon()):
                for _, point in remaining:
                    self._record(job, point, "skipped", note="the Docker daemon is unavailable")
                return
            indices = [i for i, _ in remaining]
            sub = Job(
                job.workload,
                job.system,
                job.setup,
                [p for _, p in remaining],
                job.budgets,
                job.config,
            )
            busy = _cpu.wait_quiet(limit=self.quiet_wait)
            if busy is not None:
                self.say(
                    f"  the machine is busy ({busy:.0%} of the CPUs used by other processes "
                    f"for {self.quiet_wait:.0f}s): measuring anyway (see the other-CPU column)"
                )
            outcome = self._spawn(sub, watch_daemon=kind == "docker")
            done: dict[int, dict[str, Any]] = {}
            notes: list[str] = []
            extra: dict[str, Any] = {}
            for event in outcome.events:
                if event["event"] == "done":
                    done[indices[event["index"]]] = event["result"]
                elif event["event"] in ("ready", "notes"):
                    notes = list(dict.fromkeys(notes + event.get("notes", [])))
                elif event["event"] in ("setup", "teardown", "note"):
                    extra[event["event"]] = {
                        k: v for k, v in event.items() if k not in ("event", "t")
                    }
            unavailable = next(
                (e["reason"] for e in outcome.events if e["event"] == "unavailable"), None
            )
            if unavailable is not None:
                self.say(f"{job.system}: unavailable: {unavailable}")
                self.skipped.append(
                    {"workload": job.workload, "system": job.system, "reason": unavailable}
                )
                return
            crash = next((e for e in outcome.events if e["event"] == "crash"), None)
            after = self._after_worker(job.system, kind, outcome)
            for index, point in remaining:
                if index in done:
                    self._record(
                        job,
                        point,
                        "ok",
                        result=done[index],
                        notes=notes,
                        extra=extra,
                        log=outcome.log,
                        after=after,
                        cpu=outcome.cpu.get(indices.index(index)),
                    )

            if outcome.ended == "exit" and crash is None:
                return
            # Which point did it die in? Everything before is recorded; that one is marked.
            unfinished = [(i, p) for i, p in remaining if i not in done]
            if not unfinished:
                return
            status = {"wedge": "wedged", "timeout": "timeout"}.get(outcome.ended, "error")
            note = (
                crash["error"]
                if crash is not None
                else f"worker ended by {outcome.ended} in phase {outcome.phase!r}"
            )
            if not isinstance(outcome.phase, int):
                # Outside any point (opening, setup): every remaining point shares the fate.
                for _, point in unfinished:
                    self._record(job, point, status, note=note, log=outcome.log, after=after)
                return
            failed_index = indices[outcome.phase]
            self._record(
                job, job.points[failed_index], status, note=note, log=outcome.log, after=after
            )
            remaining = [(i, p) for i, p in unfinished if i != failed_index]

    def _ensure_daemon(self) -> bool:
        state = self.daemon_state()
        if state == "ok":
            return True
        if state == "wedged":
            self.wedges["(between measurements)"] += 1
        return self.recover(f"{state} before a measurement")

    def _after_worker(self, system: str, kind: str, outcome: Outcome) -> dict[str, Any]:
        """Health check, leftover count and cleanup after a worker ended."""
        after: dict[str, Any] = {"ended": outcome.ended}
        if kind == "docker":
            state = "wedged" if outcome.ended == "wedge" else self.daemon_state()
            if state == "wedged" and outcome.ended != "wedge":
                outcome.ended = "wedge"
                after["ended"] = "wedge"
                self.wedges[system] += 1
                self.say(f"  WEDGE after {system}: `info` does not answer")
            if state == "wedged":
                after["wedged"] = True
                self.recover("wedged")
            elif state == "down":
                after["daemon_down"] = True
                self.recover("down")
            after["leftovers_after_exit"] = self.cleanup_containers()
        elif kind == "process":
            after["leftovers_after_exit"] = self.cleanup_process_root()
        return after

    def _spawn(self, job: Job, *, watch_daemon: bool) -> Outcome:
        self._serial += 1
        stem = f"{self._serial:03d}-{job.workload}-{job.system}"
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        spec_path = self.raw_dir / f"{stem}.spec.json"
        progress_path = self.raw_dir / f"{stem}.progress.jsonl"
        log_path = self.raw_dir / f"{stem}.log"
        progress_path.unlink(missing_ok=True)
        spec = {
            "workload": job.workload,
            "system": job.system,
            "config": job.config,
            "setup": job.setup,
            "points": job.points,
            "progress": str(progress_path),
            "raw_dir": str(self.raw_dir / stem),
        }
        spec_path.write_text(json.dumps(spec, indent=1))
        self.say(f"{job.workload} / {job.system}: {len(job.points)} point(s)")
        with open(log_path, "ab") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "bench._worker", str(spec_path)],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: killed whole
            )
        events: list[dict[str, Any]] = []
        offset = 0
        phase: int | str | None = "open"
        phase_started = time.monotonic()
        last_health = time.monotonic()
        misses = 0
        ended = "exit"
        snapshots: dict[int, _cpu.Snapshot] = {}
        daemons: dict[int, list[int]] = {}
        cpu: dict[int, dict[str, float]] = {}
        while True:
            time.sleep(POLL)
            offset = _read_events(progress_path, offset, events)
            for event in events:
                if event.get("_seen"):
                    continue
                event["_seen"] = True
                if event["event"] == "start":
                    phase, phase_started = event["index"], time.monotonic()
                    if isinstance(phase, int):
                        snapshots[phase] = _cpu.snapshot(worker.pid)
                        daemons[phase] = _daemon.pids_named("dockerd")
                        self.say(f"  point {phase}: {_describe(job.points[phase])}")
                elif event["event"] == "done":
                    if event["index"] in snapshots:
                        cpu[event["index"]] = _cpu.shares(
                            snapshots[event["index"]], _cpu.snapshot(worker.pid)
                        )
                        if watch_daemon and daemons.get(event["index"]) != _daemon.pids_named(
                            "dockerd"
                        ):
                            cpu[event["index"]]["daemon_restarted"] = 1.0
                            self.say("  the daemon was restarted during this point")
                    other = cpu.get(event["index"], {}).get("other", 0.0)
                    self.say(
                        f"  point {event['index']}: {_headline(event['result'])}"
                        + (
                            f" [other processes used {other:.0%} of the CPUs]"
                            if other > 0.1
                            else ""
                        )
                    )
                    phase, phase_started = None, time.monotonic()
            if worker.poll() is not None:
                break
            budget = job.budgets.get(
                phase if isinstance(phase, str) else "point", job.budgets["point"]
            )
            if time.monotonic() - phase_started > budget:
                self.say(f"  phase {phase!r} ran past its budget of {budget:.0f}s: killing")
                ended = "timeout"
                break
            if watch_daemon and time.monotonic() - last_health > HEALTH_EVERY:
                last_health = time.monotonic()
                state = _daemon.health()
                if state != "wedged":
                    misses = 0
                    if state == "down":
                        self.say("  the daemon is down (restarted by someone else?)")
                else:
                    misses += 1
                    self.say(f"  the daemon did not answer `info` ({misses} in a row)")
                    if misses >= 2:
                        ended = "wedge"
                        self.wedges[job.system] += 1
                        self.say(f"  WEDGE during {job.workload} / {job.system}: killing")
                        break
        if worker.poll() is None:
            _kill_group(worker)
        offset = _read_events(progress_path, offset, events)
        for event in events:
            event.pop("_seen", None)
        if ended == "exit" and any(e["event"] == "crash" for e in events):
            ended = "crash"
        if ended == "exit" and not any(e["event"] in ("exit", "unavailable") for e in events):
            ended = "crash"  # died without a word (killed, out of memory)
            events.append(
                {"event": "crash", "error": f"worker exited {worker.returncode} without report"}
            )
        return Outcome(events, worker.returncode, ended, phase, log_path, cpu)

    def _record(
        self,
        job: Job,
        point: dict[str, Any],
        status: str,
        *,
        result: dict[str, Any] | None = None,
        note: str | None = None,
        notes: list[str] | None = None,
        extra: dict[str, Any] | None = None,
        log: Path | None = None,
        after: dict[str, Any] | None = None,
        cpu: dict[str, float] | None = None,
    ) -> None:
        if status not in ("ok", "skipped"):
            self.say(f"  {job.workload} / {job.system} {_describe(point)}: {status}: {note}")
        self.measurements.append(
            {
                "workload": job.workload,
                "system": job.system,
                "params": point,
                "setup": job.setup,
                "status": status,
                "result": result,
                "note": note,
                "notes": notes or [],
                "extra": extra or {},
                "after": after or {},
                "cpu": cpu,
                "log": _relative(log),
            }
        )


def _relative(path: Path | None) -> str | None:
    if path is None:
        return None
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _read_events(path: Path, offset: int, events: list[dict[str, Any]]) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return offset + end


def _kill_group(worker: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.wait(timeout=30)


def _describe(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _headline(result: dict[str, Any]) -> str:
    parts = []
    if result.get("throughput") is not None:
        parts.append(f"{result['throughput']:.2f}/s")
    latency = result.get("latency") or result.get("exec_latency") or result.get("create")
    if isinstance(latency, dict) and latency.get("p50") is not None:
        parts.append(f"p50 {latency['p50'] * 1000:.1f} ms")
    if result.get("seconds_to_reach") is not None:
        parts.append(f"reached in {result['seconds_to_reach']:.1f}s")
    errors = result.get("errors", {})
    parts.append(f"errors {errors.get('total', 0)}")
    if result.get("leftovers"):
        parts.append(f"leftovers {result['leftovers']}")
    return ", ".join(parts)
