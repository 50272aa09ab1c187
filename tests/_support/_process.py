"""The process backend: private sandbox roots, the isolation mechanisms it has (and which
of them run here), and its failures made real (a launcher broken, a sandbox's processes
killed)."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import Sandbox
from asyncsandbox._process._backend import default_root


def new_process_root(prefix: str = "") -> Path:
    """A fresh sandbox root for the process backend. pytest's tmp_path is not reachable by
    the unprivileged sandbox user, so it lives next to the default root."""
    root = default_root().parent / "tests" / (prefix + uuid.uuid4().hex[:10])
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    return root


def sandbox_dirs(root: Path) -> list[str]:
    """The sandboxes (their directories) under a process backend's root."""
    try:
        return sorted(name for name in os.listdir(root) if not name.startswith("."))
    except FileNotFoundError:
        return []


PROCESS_MECHANISMS = ("bwrap", "native", "executor", "gvisor")
"""``bwrap`` and ``native``: a launcher per command. ``executor``: the native launcher's
resident executor (the fast path), where commands run in namespaces of their own inside
long-lived ones. ``gvisor``: the executor inside a gVisor sandbox (runsc). Tests of the
process backend's isolation run on each one the machine has."""


def process_options(mechanism: str) -> dict[str, Any]:
    """The process backend's options that select ``mechanism``."""
    if mechanism == "executor":
        return {"isolation": "native", "fast_path": True}
    if mechanism == "gvisor":
        return {"isolation": "gvisor", "fast_path": True}
    return {"isolation": mechanism, "fast_path": False}


def default_process_mechanism() -> str | None:
    """Which of :data:`PROCESS_MECHANISMS` ``ProcessBackend()`` is here, if one: without
    bubblewrap, the native launcher's resident executor (the fast path is on by default);
    with it, bubblewrap with the native executor's commands, which no entry names; or the
    mechanism ``$ASYNCSANDBOX_PROCESS_ISOLATION`` forces (bubblewrap, forced, is that
    pair too)."""
    mode = os.environ.get("ASYNCSANDBOX_PROCESS_ISOLATION") or "auto"
    if mode == "auto":
        mode = "bwrap" if shutil.which("bwrap") else "native"
    return {"bwrap": None, "native": "executor"}.get(mode, mode)


def mechanism_unavailable(mechanism: str) -> str | None:
    """Why ``mechanism`` does not run here (a skip reason), or None."""
    forced = os.environ.get("ASYNCSANDBOX_PROCESS_ISOLATION")
    if forced and forced != process_options(mechanism)["isolation"]:
        return f"ASYNCSANDBOX_PROCESS_ISOLATION={forced} forces another mechanism"
    if mechanism == "bwrap" and shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    if mechanism == "gvisor":
        return gvisor_unavailable()
    return None


def gvisor_unavailable() -> str | None:
    """Why the gvisor mechanism does not run here (a skip reason), or None; with
    ``ASYNCSANDBOX_REQUIRE_GVISOR=1`` (CI, where runsc is installed) the test fails instead."""
    problem = None
    if shutil.which("runsc") is None:
        problem = "gVisor's runsc is not installed (Debian/Ubuntu: apt-get install runsc)"
    elif os.geteuid() != 0:
        problem = "the gvisor mechanism needs root"
    if problem is not None and os.environ.get("ASYNCSANDBOX_REQUIRE_GVISOR") == "1":
        pytest.fail(f"gVisor is required (ASYNCSANDBOX_REQUIRE_GVISOR=1): {problem}")
    return problem


@asynccontextmanager
async def process_launcher_broken(sandbox_dir: Path) -> AsyncIterator[None]:
    """While inside, the process sandbox at ``sandbox_dir`` (on the host) cannot be set up:
    its ``/tmp`` is taken away on the host, so every mechanism fails to bind it into the
    sandbox's view (bubblewrap: "Can't find source path"; the native launcher: its mount
    fails) and the command never runs. Put back on exit."""
    tmp = anyio.Path(sandbox_dir, "fs", "tmp")
    aside = anyio.Path(sandbox_dir, "fs", "tmp.broken")
    await tmp.rename(aside)
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await aside.rename(tmp)


def kill_process_sandbox_processes(sandbox_id: str) -> int:
    """SIGKILL every process of a process sandbox, through its cgroup (root only: that is
    where the backend has cgroups); return how many were signalled."""
    killed = 0
    # os.walk, not Path.glob("**"): cgroups come and go under the walk (the sandbox's own,
    # once its processes are dead), and a glob fails on a directory that vanished.
    for directory, subdirectories, _ in os.walk("/sys/fs/cgroup"):
        path = Path(directory)
        if path.name != sandbox_id or path.parent.name != "asyncsandbox":
            continue
        subdirectories.clear()
        try:
            pids = (path / "cgroup.procs").read_text().split()
        except OSError:  # gone, or going (ENODEV): the kills in another hierarchy ended it
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


@asynccontextmanager
async def process_launch_failure(sandbox: Sandbox) -> AsyncIterator[None]:
    """The conformance suite's launch_failure hook for a local process sandbox: its
    launcher broken (above), and its resident executor, if it has one, stopped, so that
    the next command needs a new one, which cannot be set up."""
    from asyncsandbox._process import ProcessAttributes

    async with process_launcher_broken(sandbox.extra(ProcessAttributes.root)):
        handle: Any = sandbox._life.handle
        await handle.stop_executor()
        yield
