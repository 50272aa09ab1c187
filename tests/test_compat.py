"""asyncsandbox.compat.cwsandbox / .aviato: the seed SDK's API over the blocking facade, on
the real process backend (the seeds' own code runs in tests/test_seeds.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import inspect
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncsandbox import (
    ExecTimeout,
    SandboxDefaults as NativeDefaults,
    SandboxFileError as NativeFileError,
)
from asyncsandbox.compat import _types, aviato, cwsandbox
from asyncsandbox.compat.cwsandbox import (
    CloudOnlyFeatureError,
    ProcessResult,
    Sandbox,
    SandboxDefaults,
    SandboxExecutionError,
    SandboxFileError,
    SandboxStatus,
    SandboxTimeoutError,
    Session,
    UnsupportedFeatureError,
)

from ._support import eventually, processes_with, unique_marker


@pytest.fixture(autouse=True)
def root(process_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every session of a test (the process-wide one of standalone sandboxes included)
    uses the test's own process root."""
    monkeypatch.setenv("ASYNCSANDBOX_PROCESS_ROOT", str(process_root))
    monkeypatch.delenv("ASYNCSANDBOX_BACKEND", raising=False)
    yield process_root
    from asyncsandbox.compat import _client

    if _client._default is not None:
        _client._default.close().result()
        _client._default = None


def dirs(root: Path) -> list[str]:
    try:
        return [n for n in os.listdir(root) if not n.startswith(".")]
    except FileNotFoundError:
        return []


# -- surface ----------------------------------------------------------------------------------


def test_both_spellings_export_the_same_documented_names() -> None:
    assert isinstance(cwsandbox.__all__, tuple)
    assert aviato.__all__ == cwsandbox.__all__
    for name in cwsandbox.__all__:
        assert inspect.getdoc(getattr(cwsandbox, name)), name
        if name != "Session":
            assert getattr(aviato, name) is getattr(cwsandbox, name), name
    assert issubclass(aviato.Session, cwsandbox.Session)
    for cls in (Session, Sandbox, cwsandbox.Process, cwsandbox.OperationRef):
        for name, member in vars(cls).items():
            if not name.startswith("_") and callable(member):
                assert inspect.getdoc(member), f"{cls.__name__}.{name}"


def test_signatures_are_the_sdks() -> None:
    """The parameters the guides and the reference use, by name, with their defaults."""

    def params(func: Callable[..., Any]) -> dict[str, object]:
        return {n: p.default for n, p in inspect.signature(func).parameters.items() if n != "self"}

    assert list(params(Session))[:2] == ["defaults", "report_to"]
    exec_params = params(Sandbox.exec)
    assert exec_params == {
        "command": inspect.Parameter.empty,
        "cwd": None,
        "check": False,
        "timeout_seconds": None,
        "stdin": False,
        "container": None,
    }
    assert params(cwsandbox.wait) == {
        "waitables": inspect.Parameter.empty,
        "num_returns": None,
        "timeout": None,
    }
    assert params(Session.log_metrics) == {"step": None, "reset": True}
    assert {"tags", "status", "show_terminated"} <= set(params(Sandbox.list))
    stop = params(Sandbox.stop)
    assert stop["graceful_shutdown_seconds"] == 10.0
    assert stop["missing_ok"] is False
    defaults = SandboxDefaults()
    assert defaults.container_image == "python:3.11"
    assert defaults.request_timeout_seconds == 300
    assert defaults.tags == ()
    assert defaults.args == ("-c", 'trap "exit 0" TERM INT; sleep infinity & wait')
    assert set(SandboxStatus.__members__) >= {"RUNNING", "PENDING", "CREATING", "TERMINATED"}


# -- exec, files, results -------------------------------------------------------------------


def test_exec_returns_a_future_of_str_output_and_the_sdks_errors() -> None:
    with Session(SandboxDefaults(container_image="python:3.11")) as session:
        sandbox = session.sandbox()
        process = sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_seconds=30)
        result = process.result()
        assert isinstance(result, ProcessResult)
        assert (result.stdout, result.stderr, result.returncode) == ("out\n", "err\n", 3)
        assert result.stdout_bytes == b"out\n"
        assert result.command == ["sh", "-c", "echo out; echo err >&2; exit 3"]
        assert process.returncode == process.poll() == process.wait() == 3
        assert list(process.stdout) == ["out\n"]
        assert process.stdin is None
        with pytest.raises(SandboxTimeoutError, match=r"timed out after 2s") as timed:
            sandbox.exec(["sh", "-c", "echo partial; sleep 60"], timeout_seconds=2).result()
        assert isinstance(timed.value, TimeoutError)
        assert isinstance(timed.value.__cause__, ExecTimeout)
        assert timed.value.exec_result is not None
        assert timed.value.exec_result.stdout == "partial\n"
        with pytest.raises(SandboxExecutionError) as failed:
            sandbox.exec(["false"], check=True).result()
        assert failed.value.exec_result is not None
        assert failed.value.exec_result.returncode == 1
        # The SDK's default: without timeout_seconds a command gets request_timeout_seconds.
        assert sandbox.exec(["true"])._timeout == 300
        quick = session.sandbox(request_timeout_seconds=0.3)
        with pytest.raises(SandboxTimeoutError):
            quick.exec(["sleep", "60"]).result()
        # result(timeout) is a local wait: the builtin TimeoutError, the command runs on.
        slow = sandbox.exec(["sh", "-c", "sleep 1; echo late"])
        with pytest.raises(TimeoutError) as waited:
            slow.result(timeout=0.05)
        assert not isinstance(waited.value, SandboxTimeoutError)
        assert slow.result().stdout == "late\n"
        assert sandbox.exec_stats == {
            "exec_count": 5,
            "completed_ok": 2,
            "completed_nonzero": 2,
            "failures": 1,
        }
        assert sandbox.exec_stats["exec_completed_ok"] == 2  # the 1.22 SDK's key
        assert sandbox.execution_stats == {"total": 5, "successes": 2, "failures": 2, "errors": 1}


def test_cancel_kills_the_command() -> None:
    with Session() as session:
        sandbox = session.sandbox()
        marker = unique_marker()
        process = sandbox.exec(["sleep", marker])
        sandbox.wait()
        eventually(lambda: processes_with(marker), what="the command runs")
        assert process.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            process.result()
        assert process.returncode is None
        eventually(lambda: not processes_with(marker), what="the command killed")
        assert sandbox.exec(["echo", "alive"]).result().stdout == "alive\n"


def test_files() -> None:
    with Session() as session:
        sandbox = session.sandbox()
        assert sandbox.write_file("dir/a.txt", b"hello").result() is None
        assert sandbox.read_file("dir/a.txt").result() == b"hello"
        assert list(sandbox.read_file_streaming("dir/a.txt")) == [b"hello"]
        sandbox.write_file_streaming("b.bin", iter([b"a", b"b"])).result()
        assert sandbox.read_file("b.bin").result() == b"ab"
        with pytest.raises(SandboxFileError) as missing:
            sandbox.read_file("nope.txt").result()
        assert missing.value.reason == "CWSANDBOX_FILE_NOT_FOUND"
        assert missing.value.filepath == "/workspace/nope.txt"
        assert isinstance(missing.value.__cause__, NativeFileError)
        with pytest.raises(TypeError, match="bytes"):
            sandbox.write_file("c.txt", "text")  # type: ignore[arg-type]


def test_mounted_files_are_there_before_the_first_command() -> None:
    with Session() as session:
        sandbox = session.sandbox(
            mounted_files=[{"mount_path": "/workspace/conf/app.ini", "file_content": b"x=1\n"}]
        )
        result = sandbox.exec(["sh", "-c", "cat conf/app.ini; stat -c %a conf/app.ini"]).result()
        assert result.stdout == "x=1\n444\n"


# -- lifecycle ------------------------------------------------------------------------------


def test_start_wait_stop_status_and_ids(root: Path) -> None:
    with Session(SandboxDefaults(tags=("life",))) as session:
        sandbox = session.sandbox(tags=["one"])
        assert sandbox.sandbox_id is None
        assert sandbox.status == SandboxStatus.UNSPECIFIED
        ref = sandbox.start()
        assert ref.result() is None
        assert sandbox.wait() is sandbox
        status: str = sandbox.status  # a StrEnum: plain strings compare equal
        assert status == SandboxStatus.RUNNING
        assert status == "running"
        assert sandbox.sandbox_id in dirs(root)
        assert sandbox.tags == ("life", "one")
        assert session.sandbox_count == 1
        sandbox.stop().result()
        assert sandbox.get_status() == SandboxStatus.TERMINATED
        assert dirs(root) == []
        with pytest.raises(cwsandbox.SandboxNotRunningError):
            sandbox.exec(["true"]).result()


def test_dropped_sandboxes_are_stopped_and_the_session_closed_at_exit(root: Path) -> None:
    script = textwrap.dedent(
        """
        import gc
        import asyncsandbox.compat.cwsandbox as cwsandbox

        session = cwsandbox.Session()  # module level, never closed, as in the TRL guide
        for _ in range(5):
            assert session.sandbox().exec(["true"]).result().returncode == 0
        gc.collect()
        kept = session.sandbox()
        kept.start().result()
        standalone = cwsandbox.Sandbox.run()
        print(len(session._sync.list()), flush=True)
        """
    )
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    # The five dropped ones were gone before the end; the two held ones went at exit.
    assert done.stdout.decode().split()[0] in ("2", "3", "4", "5", "6", "7")
    assert dirs(root) == []


def test_a_dropped_sandbox_is_stopped_when_collected(root: Path) -> None:
    with Session() as session:
        session.sandbox().exec(["true"]).result()
        gc.collect()
        eventually(lambda: dirs(root) == [])


def test_standalone_sandboxes_list_from_id_and_delete(root: Path) -> None:
    first = Sandbox.run(tags=["solo"])
    with Sandbox(tags=["solo", "second"]) as second:
        assert second.status == SandboxStatus.RUNNING
        found = Sandbox.list(tags=["solo"]).result()
        assert sorted(s.sandbox_id or "" for s in found) == sorted(
            [first.sandbox_id or "", second.sandbox_id or ""]
        )
        running = Sandbox.list(
            tags=["solo"], status=[SandboxStatus.RUNNING, SandboxStatus.PENDING]
        ).result()
        assert len(running) == 2
        assert Sandbox.list(tags=["solo"], status="pending").result() == []
        assert first.sandbox_id is not None
        same = Sandbox.from_id(first.sandbox_id).result()
        assert same.tags == ("solo",)
        with pytest.raises(UnsupportedFeatureError, match="can stop it"):
            same.exec(["true"])
        Sandbox.delete(first.sandbox_id).result()
        assert first.sandbox_id not in dirs(root)
        with pytest.raises(cwsandbox.SandboxNotFoundError):
            Sandbox.delete(first.sandbox_id)
        assert Sandbox.delete(first.sandbox_id, missing_ok=True).result() is None
        with pytest.raises(cwsandbox.SandboxNotFoundError):
            Sandbox.from_id("p-000000000000").result()
    assert dirs(root) == []


def test_a_dead_owners_sandbox_is_not_listed_as_running_and_is_collected(root: Path) -> None:
    script = (
        "import os, asyncsandbox.compat.cwsandbox as c\n"
        "c.Sandbox.run(tags=['orphan'])\n"
        "os._exit(0)  # no cleanup: like a crash\n"
    )
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root)}
    # The orphan must still be on disk when the listing below runs, or the listing proves
    # nothing. Once in CI's newcomer run (1 of 1,197 tests; not reproduced in 20 runs
    # here) it was gone before this check, removed by nothing this test runs: tried again,
    # at most three times, and what was seen is said if it never stays.
    seen = []
    for _ in range(3):
        subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=True)
        seen.append(sorted(os.listdir(root)) if root.exists() else None)
        if len(dirs(root)) == 1:
            break
    assert len(dirs(root)) == 1, f"the dead owner's sandbox was gone at once: {seen}"
    # Never counted as running; the session opened to list it removes it (its owner is gone).
    assert Sandbox.list(tags=["orphan"], status=SandboxStatus.RUNNING).result() == []
    assert Sandbox.list(tags=["orphan"], show_terminated=True).result() == []
    assert dirs(root) == []
    # The status mapping of such a sandbox, where one is still listed (another session):
    assert SandboxStatus.from_native("dead") == SandboxStatus.FAILED
    assert SandboxStatus.FAILED not in _types.ACTIVE


def test_wait_semantics() -> None:
    with Session() as session:
        slow = session.sandbox().exec(["sleep", "1"])
        fast = session.sandbox().exec(["true"])
        sandbox = session.sandbox()
        done, pending = cwsandbox.wait([slow, fast], num_returns=1)
        assert done == [fast]
        assert pending == [slow]
        done, pending = cwsandbox.wait([sandbox, slow])  # a sandbox is done once running
        assert set(map(id, done)) == {id(sandbox), id(slow)}
        assert pending == []
        assert sandbox.status == SandboxStatus.RUNNING
        assert cwsandbox.wait([]) == ([], [])
        with pytest.raises(ValueError, match="num_returns"):
            cwsandbox.wait([fast], num_returns=0)
        hanging = session.sandbox().exec(["sleep", "60"])
        assert cwsandbox.wait([hanging], timeout=0.1) == ([], [hanging])
        failing = session.sandbox().exec(["sleep", "60"], timeout_seconds=0.1)
        assert cwsandbox.wait([failing]) == ([failing], [])  # an error counts as done
        with pytest.raises(SandboxTimeoutError):
            failing.result()
        assert cwsandbox.results([fast]) == [fast.result()]
        hanging.cancel()


def test_await_from_asyncio() -> None:
    async def main() -> tuple[str, SandboxStatus]:
        async with Session() as session:
            sandbox = await session.sandbox()
            result = await sandbox.exec(["echo", "awaited"])
            return result.stdout, sandbox.status

    assert asyncio.run(main()) == ("awaited\n", SandboxStatus.RUNNING)


# -- metrics --------------------------------------------------------------------------------


def test_metric_names_of_both_spellings() -> None:
    for module, names in (
        (cwsandbox, ("cwsandbox/exec_completed_ok", "cwsandbox/exec_completed_nonzero")),
        (aviato, ("aviato/exec_successes", "aviato/exec_failures")),
    ):
        with module.Session() as session:
            sandbox = session.sandbox()
            sandbox.exec(["true"]).result()
            sandbox.exec(["false"]).result()
            with pytest.raises(SandboxTimeoutError):
                sandbox.exec(["sleep", "9"], timeout_seconds=0.1).result()
            metrics = session.get_metrics()
            ok, nonzero = names
            assert metrics[ok] == 1
            assert metrics[nonzero] == 1
            assert metrics[f"{module.__name__.rsplit('.', 1)[1]}/executions"] == 3
            assert session.log_metrics(step=1) is False  # no W&B run: nothing logged
            assert metrics == session.get_metrics()  # so nothing was reset
    with aviato.Session() as session:
        session.sandbox().exec(["sleep", "9"], timeout_seconds=0.1)
        eventually(lambda: session.get_metrics()["aviato/executions"] == 1)
        metrics = session.get_metrics()
        assert metrics["aviato/exec_errors"] == 1
        assert metrics["aviato/error_rate"] == 1.0
        assert metrics["aviato/success_rate"] == 0.0
        assert metrics["aviato/avg_execs_per_sandbox"] == 1


def test_report_to() -> None:
    with Session(report_to=[]) as session:
        session.sandbox().exec(["true"]).result()
        assert session.get_metrics() == {}
        assert session.log_metrics(step=1) is False
    for bad in (["tensorboard"], "wandb"):
        with pytest.raises(ValueError, match="report_to"):
            Session(report_to=bad)  # type: ignore[arg-type]


def test_log_metrics_to_an_offline_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="asyncsandbox-compat-tests", dir=str(tmp_path))
    try:
        with aviato.Session() as session:
            sandbox = session.sandbox()
            sandbox.exec(["true"]).result()
            assert session.log_metrics(step=1) is True
            assert session.get_metrics()["aviato/executions"] == 0  # reset after logging
            sandbox.exec(["true"]).result()
            assert session.log_metrics(step=2, reset=False) is True
            assert session.get_metrics()["aviato/executions"] == 1
    finally:
        run.finish()
        wandb.teardown()
    [log] = list(tmp_path.rglob("*.wandb"))
    recorded = log.read_bytes()
    assert b"aviato/exec_successes" in recorded
    assert b"aviato/avg_execs_per_sandbox" in recorded
    assert b"cwsandbox/" not in recorded


# -- configuration and clear errors ---------------------------------------------------------


def test_defaults_positional_mapping_and_merges() -> None:
    defaults = SandboxDefaults(tags=("a",), environment_variables={"X": "1"}, working_dir="/work")
    assert defaults.merge_tags(["b", "a"]) == ("a", "b", "a")
    assert defaults.with_overrides(tags=("z",)).tags == ("z",)
    loaded = SandboxDefaults.from_dict({"tags": ["a"], "not_a_field": 1})
    assert loaded.tags == ("a",)
    with Session(defaults) as session:  # positional, as in the guides
        sandbox = session.sandbox(environment_variables={"Y": "2"})
        result = sandbox.exec(["sh", "-c", 'echo "$X$Y"; pwd']).result()
        assert result.stdout == "12\n/work\n"
    with Session({"tags": ["m"], "request_timeout_seconds": 5}) as session:
        assert session.defaults.tags == ("m",)
        assert session._sync.limits.capacity_timeout == 5  # never waits forever
    assert Session()._sync.limits.capacity_timeout == 300


def test_resources_map_onto_asyncsandbox() -> None:
    resources = _types.native_resources({"cpu": "500m", "memory": "2Gi"})
    assert resources is not None
    assert (resources.cpus, resources.memory_mb) == (0.5, 2048)
    nested = _types.native_resources({"requests": {"cpu": "1"}, "limits": {"memory": "512Mi"}})
    assert nested is not None
    assert nested.memory_mb == 512
    with pytest.raises(CloudOnlyFeatureError, match="GPU"):
        _types.native_resources({"gpu": {"count": 1}})
    with pytest.raises(ValueError, match="memory"):
        _types.native_resources({"memory": "lots"})


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: SandboxDefaults(container_imgae="x"), TypeError, "did you mean 'container_image'"),
        (lambda: SandboxDefaults(image="x"), TypeError, "calls it 'container_image'"),
        (lambda: SandboxDefaults(profile_ids=["p"]), TypeError, "removed from the SDK"),
        (lambda: SandboxDefaults(tags="one"), ValueError, "not a single string"),
        (lambda: SandboxDefaults(request_timeout_seconds=float("nan")), ValueError, "finite"),
        (
            lambda: Session(SandboxDefaults(base_url="https://x")),
            CloudOnlyFeatureError,
            "control plane",
        ),
        (lambda: Session(SandboxDefaults(runner_ids=["r"])), CloudOnlyFeatureError, "runners"),
        (lambda: Session(auth="key"), CloudOnlyFeatureError, "authentication"),
        (lambda: Session(NativeDefaults()), ValueError, "container_image"),  # type: ignore[arg-type]
        (lambda: Session().sandbox(env={"A": "1"}), TypeError, "environment_variables"),
        (lambda: Session().sandbox(timeout_seconds=3), TypeError, "unexpected keyword"),
        (lambda: Session().sandbox(volumes=["v"]), CloudOnlyFeatureError, "volumes"),
        (
            lambda: Session().sandbox(command="python", args=["app.py"]),
            UnsupportedFeatureError,
            "main process",
        ),
        (lambda: Session().sandbox().exec(["cat"], stdin=True), UnsupportedFeatureError, "stdin"),
        (
            lambda: Session().sandbox().exec(["true"], container="side"),
            CloudOnlyFeatureError,
            "multi-container",
        ),
        (lambda: Session().sandbox().exec("echo hi"), ValueError, "list of strings"),
        (
            lambda: Session().sandbox().stop(snapshot_on_stop=True),
            CloudOnlyFeatureError,
            "snapshots",
        ),
        (lambda: Session().sandbox().service_urls, CloudOnlyFeatureError, "exposed services"),
        (lambda: Session().sandbox().shell(), UnsupportedFeatureError, "terminal"),
        (lambda: Session().sandbox().stream_logs(), UnsupportedFeatureError, "main process"),
        (lambda: Session().function(), UnsupportedFeatureError, "Session.function"),
        (lambda: Sandbox.list(runner_ids=["r"]), CloudOnlyFeatureError, "runner"),
        (lambda: cwsandbox.list_runners(), CloudOnlyFeatureError, "runner discovery"),
        (
            lambda: Session(SandboxDefaults(network={"egress": [{"dns_name": "pypi.org"}]})),
            CloudOnlyFeatureError,
            "allow-lists",
        ),
    ],
)
def test_clear_errors(make: Callable[[], object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_errors_are_translated_with_the_original_as_cause() -> None:
    from asyncsandbox import CapacityTimeout, SandboxDied

    capacity = _types.translate(CapacityTimeout("live", 300.0))
    assert isinstance(capacity, cwsandbox.SandboxResourceExhaustedError)
    assert "stopped" in str(capacity)
    died = _types.translate(SandboxDied("p-1", "removed"))
    assert isinstance(died, cwsandbox.SandboxFailedError)
    assert died.status_reason == "removed"
    other = RuntimeError("not ours")
    assert _types.translate(other) is other
