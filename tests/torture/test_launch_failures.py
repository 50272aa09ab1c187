"""A sandbox that cannot be set up is an infrastructure error, never the command's exit
status (issue: correct solutions scored 0 while the host managed its users).

The host's ``/etc/passwd`` and ``/etc/group`` replaced by rename in a loop — as
``useradd``, package installs and configuration management do — while commands run, on
every isolation mechanism: each exec returns the command's own status or raises a typed
:class:`~asyncsandbox.InfrastructureError`. The churn happens on a private copy of
``/etc`` bind-mounted in a private mount namespace of a child process, so the host's own
files are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from asyncsandbox import LaunchError, RetryPolicy, Session

from .._support import (
    PROCESS_MECHANISMS,
    eventually_async,
    mechanism_unavailable,
    new_process_root,
    process_options,
)
from ._report import REPORT

# Launchers broken while commands churn: slow (`uv run pytest -m slow`; CI runs them once).
pytestmark = pytest.mark.slow

CHURN = r"""
import collections, ctypes, json, os, shutil, sys, threading
import anyio
import asyncsandbox

options, root, copy = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_REC, MS_PRIVATE, MS_BIND = 0x20000, 16384, 1 << 18, 4096
assert libc.unshare(CLONE_NEWNS) == 0, os.strerror(ctypes.get_errno())
assert libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
shutil.copytree("/etc", copy, symlinks=True)
assert libc.mount(copy.encode(), b"/etc", None, MS_BIND | MS_REC, None) == 0
stop = threading.Event()
replaced = [0]

def churn():
    while not stop.is_set():
        for name in ("passwd", "group"):
            shutil.copyfile("/etc/" + name, "/etc/" + name + ".new")
            os.rename("/etc/" + name + ".new", "/etc/" + name)
            replaced[0] += 1

statuses, errors = collections.Counter(), collections.Counter()

async def main():
    limits = asyncsandbox.Limits(max_execs=16)
    options["root"] = root
    async with asyncsandbox.Session(
        "process", backend_options=options, limits=limits, sweep=False, report_to=[]
    ) as s:
        threading.Thread(target=churn, daemon=True).start()
        sandboxes = [await s.sandbox().start() for _ in range(4)]

        async def run(sb):
            try:
                statuses[(await sb.exec(["true"])).returncode] += 1
            except asyncsandbox.InfrastructureError as exc:
                errors[type(exc).__name__] += 1

        async with anyio.create_task_group() as tg:
            for i in range(400):
                tg.start_soon(run, sandboxes[i % 4])
    stop.set()

anyio.run(main)
print(json.dumps({"statuses": statuses, "errors": errors, "replaced": replaced[0]}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace needs root")
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
def test_host_replacing_etc_files_never_becomes_an_exit_status(
    mechanism: str, tmp_path: Path
) -> None:
    reason = mechanism_unavailable(mechanism)
    if reason:
        pytest.skip(reason)
    root = new_process_root("torture-")
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                CHURN,
                json.dumps(process_options(mechanism)),
                str(root),
                str(tmp_path / "etc"),
            ],
            capture_output=True,
            timeout=300,
            check=False,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])  # after any warning printed
    statuses, errors = outcome["statuses"], outcome["errors"]
    REPORT.fault("etc replaced by rename", f"process-{mechanism}", json.dumps(outcome))
    assert outcome["replaced"] > 100, "the churn did not run"
    # `true` exits 0; a typed infrastructure error is allowed, a setup tool's status is not.
    assert set(statuses) <= {"0"}, outcome
    assert sum(statuses.values()) + sum(errors.values()) == 400


# -- a launch failure is typed, counted, and retried when transient ---------------------


@pytest.fixture(params=PROCESS_MECHANISMS)
def mechanism(request: pytest.FixtureRequest) -> str:
    reason = mechanism_unavailable(str(request.param))
    if reason:
        pytest.skip(reason)
    return str(request.param)


async def test_a_sandbox_that_cannot_be_set_up_raises_launch_error(mechanism: str) -> None:
    """The sandbox's /etc taken away: the launcher cannot build the view. The command never
    runs, exec raises LaunchError (not an exit status), the metrics count it; once /etc is
    back, the same sandbox works."""
    root = new_process_root("torture-")
    options = {"root": root, **process_options(mechanism)}
    retries = RetryPolicy(attempts=2, backoff=0.01)
    try:
        async with (
            Session("process", backend_options=options, retries=retries, sweep=False) as s,
            s.sandbox() as sb,
        ):
            etc = anyio.Path(sb._life.handle._box.layout.etc)  # type: ignore[union-attr]
            aside = etc.with_name(etc.name + ".aside")
            await etc.rename(aside)
            with capture_logs() as logs, pytest.raises(LaunchError) as caught:
                await sb.exec(["touch", "ran"])
            await aside.rename(etc)
            assert caught.value.retryable
            if mechanism != "gvisor":  # runsc says only that the gVisor sandbox failed
                assert str(etc) in str(caught.value)  # the launcher's own words
            assert [e["event"] for e in logs].count("backend.retry") == 1  # 2 attempts
            assert s.metrics()["asyncsandbox/exec_infrastructure_errors"] == 1
            assert (await sb.exec(["test", "-e", "ran"])).returncode != 0  # it never ran
            assert (await sb.exec(["true"])).returncode == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_transient_launch_failure_is_retried(mechanism: str) -> None:
    root = new_process_root("torture-")
    options = {"root": root, **process_options(mechanism)}
    retries = RetryPolicy(attempts=6, backoff=0.5, max_backoff=0.5)
    try:
        async with (
            Session("process", backend_options=options, retries=retries, sweep=False) as s,
            s.sandbox() as sb,
        ):
            etc = anyio.Path(sb._life.handle._box.layout.etc)  # type: ignore[union-attr]
            aside = etc.with_name(etc.name + ".aside")
            await etc.rename(aside)
            with capture_logs() as logs:
                async with anyio.create_task_group() as tg:
                    results: list[int] = []

                    async def run() -> None:
                        results.append((await sb.exec(["echo", "ran"])).returncode)

                    tg.start_soon(run)
                    # The first attempt fails at once; restore /etc during the backoff.
                    await eventually_async(
                        lambda: any(e["event"] == "backend.retry" for e in logs),
                        within=30,
                        what="the first attempt failed",
                    )
                    await aside.rename(etc)
            assert results == [0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
