"""Session metrics: the names dashboards chart, windows, reset and reporters."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio
import pytest

from asyncsandbox import ExecTimeout, InvalidArgument, Session
from asyncsandbox.testing import FakeBackend, FakeProcess


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, float], int | None]] = []

    def __call__(self, metrics: Mapping[str, float], step: int | None) -> None:
        self.calls.append((dict(metrics), step))


async def _slow(p: FakeProcess) -> int:
    await anyio.sleep_forever()  # until its timeout kills it
    return 0


def session(recorder: Recorder, **kwargs: object) -> Session:
    backend = FakeBackend(commands={"slow": _slow})
    return Session(backend, report_to=[recorder], sweep=False, **kwargs)  # type: ignore[arg-type]


async def test_metric_names_and_values() -> None:
    recorder = Recorder()
    async with session(recorder) as s:
        async with s.sandbox() as a:
            await a.exec(["true"])
            await a.exec(["false"])
            with pytest.raises(ExecTimeout):
                await a.exec(["slow"], timeout=0.01)
            assert a.exec_stats == {
                "exec_count": 3,
                "exec_completed_ok": 1,
                "exec_completed_nonzero": 1,
                "exec_failures": 1,
            }
        async with s.sandbox() as b:
            await b.exec(["true"])
        metrics = s.log_metrics(step=7)
    p = "asyncsandbox/"
    assert metrics[p + "sandboxes_created"] == 2
    assert metrics[p + "executions"] == 4
    assert metrics[p + "exec_completed_ok"] == 2
    assert metrics[p + "exec_completed_nonzero"] == 1
    assert metrics[p + "exec_failures"] == 1
    assert metrics[p + "exec_timeouts"] == 1
    assert metrics[p + "exec_completion_rate"] == 0.5
    assert metrics[p + "exec_failure_rate"] == 0.25
    assert metrics[p + "startup_count"] == 2
    assert (
        metrics[p + "min_startup_seconds"]
        <= metrics[p + "avg_startup_seconds"]
        <= metrics[p + "max_startup_seconds"]
    )
    assert (metrics[p + "min_execs_per_sandbox"], metrics[p + "max_execs_per_sandbox"]) == (1, 3)
    assert metrics[p + "avg_execs_per_sandbox"] == 2
    assert 0 <= metrics[p + "exec_latency_p50_seconds"] <= metrics[p + "exec_latency_p99_seconds"]
    assert recorder.calls[0] == (metrics, 7)


async def test_reset_starts_a_new_window_and_close_flushes() -> None:
    recorder = Recorder()
    async with session(recorder, metrics_prefix="sbx/") as s:
        await s.run(["true"])
        first = s.log_metrics(step=1)
        assert first["sbx/executions"] == 1
        await s.run(["true"])
        await s.run(["true"])
        kept = s.log_metrics(step=2, reset=False)
        assert kept["sbx/executions"] == 2
        again = s.log_metrics(step=3)
        assert again["sbx/executions"] == 2
        await s.run(["false"])
    # closing logged the last window once more, without a step
    final, step = recorder.calls[-1]
    assert step is None
    assert final["sbx/exec_completed_nonzero"] == 1
    assert len(recorder.calls) == 4


async def test_capacity_waits_are_measured() -> None:
    from asyncsandbox import Limits

    recorder = Recorder()
    async with session(recorder, limits=Limits(max_live=1)) as s:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(s.run, ["sleep", "0.3"])
        metrics = s.metrics()
    # One run at a time: the others wait about 0.3 s and 0.6 s. (Runs of 0.05 s were
    # shorter than a loaded CI's delays before a task even asked: a wait of 0.061 s.)
    assert metrics["asyncsandbox/capacity_wait_seconds"] >= 0.5
    assert metrics["asyncsandbox/capacity_wait_max_seconds"] >= 0.25


async def test_no_active_reporter_keeps_counting() -> None:
    async with Session(FakeBackend(), sweep=False) as s:  # auto: W&B only when a run is active
        await s.run(["true"])
        s.log_metrics(step=1)
        await s.run(["true"])
        assert s.metrics()["asyncsandbox/executions"] == 2


async def test_a_broken_reporter_does_not_break_training() -> None:
    def broken(metrics: Mapping[str, float], step: int | None) -> None:
        raise RuntimeError("dashboard down")

    recorder = Recorder()
    async with Session(FakeBackend(), report_to=[broken, recorder], sweep=False) as s:
        await s.run(["true"])
        s.log_metrics(step=1)
    assert len(recorder.calls) == 1


def test_reporter_validation() -> None:
    with pytest.raises(InvalidArgument, match="unknown reporter"):
        Session(FakeBackend(), report_to=["tensorboard"])
    with pytest.raises(InvalidArgument, match="a list"):
        Session(FakeBackend(), report_to="wandb")


async def test_log_reporter_emits_a_structured_event() -> None:
    import structlog

    with structlog.testing.capture_logs() as logs:
        async with Session(FakeBackend(), report_to=["log"], sweep=False) as s:
            await s.run(["true"])
            s.log_metrics(step=3)
    events = [e for e in logs if e["event"] == "session.metrics"]
    assert events[0]["step"] == 3
    assert events[0]["asyncsandbox.executions"] == 1


def test_wandb_offline_run_receives_the_metrics(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Auto mode (report_to=None) finds an active W&B run; offline, nothing leaves the machine."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="asyncsandbox-tests", dir=str(tmp_path))
    try:

        async def train() -> None:
            async with Session(FakeBackend(), sweep=False) as s:
                await s.run(["true"])
                await s.run(["false"])
                s.log_metrics(step=1)
                assert s.metrics()["asyncsandbox/executions"] == 0  # reset after delivery

        anyio.run(train)
    finally:
        run.finish()
        wandb.teardown()  # waits for the W&B service to close the run's files
    # The run's offline log (protobuf records) holds what it was given.
    files = list(Path(str(tmp_path)).rglob("*.wandb"))
    assert len(files) == 1
    recorded = files[0].read_bytes()
    assert b"asyncsandbox/executions" in recorded
    assert b"asyncsandbox/exec_completed_nonzero" in recorded


async def test_execs_per_sandbox_count_live_sandboxes_and_reach_the_close_flush() -> None:
    """Per-sandbox exec counts are in every log_metrics (sandboxes still running included)
    and in the close-time flush, not only for sandboxes removed before a log."""
    recorder = Recorder()
    async with session(recorder) as s:
        a = await s.sandbox().start()
        b = await s.sandbox().start()
        for _ in range(3):
            await a.exec(["true"])
        await b.exec(["true"])
        first = s.log_metrics(step=1)  # both still live
        assert (
            first["asyncsandbox/min_execs_per_sandbox"],
            first["asyncsandbox/max_execs_per_sandbox"],
        ) == (1, 3)
        assert first["asyncsandbox/avg_execs_per_sandbox"] == 2
        await a.exec(["true"])  # the next window: only what ran in it
        await a.exec(["false"])
        second = s.log_metrics(step=2)
        assert second["asyncsandbox/max_execs_per_sandbox"] == 2
        assert second["asyncsandbox/min_execs_per_sandbox"] == 2
        await b.exec(["true"])  # still live when the session closes
    final, step = recorder.calls[-1]
    assert step is None
    assert final["asyncsandbox/avg_execs_per_sandbox"] == 1
    assert final["asyncsandbox/executions"] == 1


async def test_commands_that_cannot_run_are_counted_and_warned_once_per_program() -> None:
    import structlog

    recorder = Recorder()
    with structlog.testing.capture_logs() as logs:
        async with session(recorder) as s:
            async with s.sandbox() as sb:
                for _ in range(3):
                    result = await sb.exec(["python", "-c", "print(1)"])
                    assert result.returncode == 127  # the fake backend has no python
                await sb.exec(["no-such-tool"])
                await sb.exec(["true"])
                await sb.exec(["false"])  # exit 1: not a missing program
            metrics = s.metrics()
    assert metrics["asyncsandbox/exec_command_not_found"] == 4
    assert metrics["asyncsandbox/exec_completed_nonzero"] == 5
    warnings = [e for e in logs if e["event"] == "sandbox.exec.command_not_found"]
    assert [(w["program"], w["returncode"], w["log_level"]) for w in warnings] == [
        ("python", 127, "warning"),
        ("no-such-tool", 127, "warning"),
    ]
    assert "python: command not found" in warnings[0]["stderr"]
    assert "python3 vs python" in warnings[0]["hint"]
