"""The public conformance suite, run against every built-in backend on asyncio and trio."""

from __future__ import annotations

import contextlib
import functools
import unittest
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from asyncsandbox import BackendUnavailable, Sandbox, SandboxFileError
from asyncsandbox._process import ProcessBackend
from asyncsandbox.abc import Backend
from asyncsandbox.testing import (
    CHECKS,
    Check,
    FakeBackend,
    FakeProcess,
    FakeWorld,
    LaunchFailure,
    check_backend,
)
from asyncsandbox.testing._fake import BUILTIN_COMMANDS

from ._support import gvisor_unavailable, process_launch_failure


def fake() -> tuple[Callable[[], Backend], LaunchFailure | None]:
    # One world per test, shared by every session of the check (as a daemon would be).
    world = FakeWorld()

    @asynccontextmanager
    async def launch_failure(sandbox: Sandbox) -> AsyncIterator[None]:
        assert sandbox.id is not None
        backend = FakeBackend(world=world)  # any backend of the world reaches its sandboxes
        backend.break_launcher(sandbox.id, "the fake launcher is broken")
        try:
            yield
        finally:
            backend.break_launcher(sandbox.id, None)

    return functools.partial(FakeBackend, world=world), launch_failure


def process() -> tuple[Callable[[], Backend], LaunchFailure | None]:
    return ProcessBackend, process_launch_failure


def process_gvisor() -> tuple[Callable[[], Backend], LaunchFailure | None]:
    if reason := gvisor_unavailable():
        pytest.skip(reason)
    return functools.partial(ProcessBackend, isolation="gvisor"), process_launch_failure


BACKENDS = {"fake": fake, "process": process, "process-gvisor": process_gvisor}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_conformance(backend: str, check: Check) -> None:
    make_backend, launch_failure = BACKENDS[backend]()
    if check.name == "launch_failure" and launch_failure is None:
        pytest.skip(f"no way yet to make the {backend} backend's launcher fail (issue 18)")
    await check.run(make_backend, launch_failure=launch_failure)


# -- the launch_failure check fails the backends it must fail -------------------------------


def reported_as(outcome: str) -> tuple[Callable[[], Backend], LaunchFailure]:
    """A fake backend whose launcher, when broken, gives ``outcome`` ("exit status" or
    "BackendUnavailable") instead of a LaunchError: the bug the check is there to catch."""
    world = FakeWorld()
    marker = "/tmp/launcher-is-broken"

    async def python3(p: FakeProcess) -> int:
        broken = False
        with contextlib.suppress(SandboxFileError):
            broken = p.read_file(marker) == b"yes"
        if broken:
            if outcome == "BackendUnavailable":
                raise BackendUnavailable("the launcher failed")
            await p.write("stderr", b"bwrap: Can't bind mount /etc/passwd\n")
            return 1
        return await BUILTIN_COMMANDS["python3"](p)

    @asynccontextmanager
    async def launch_failure(sandbox: Sandbox) -> AsyncIterator[None]:
        await sandbox.write_file(marker, b"yes")
        try:
            yield
        finally:
            await sandbox.write_file(marker, b"no")

    make = functools.partial(FakeBackend, world=world, commands={"python3": python3})
    return make, launch_failure


LAUNCH_CHECK = next(c for c in CHECKS if c.name == "launch_failure")


@pytest.mark.parametrize(
    ("outcome", "complaint"),
    [
        ("exit status", "gave exit status 1 .*bwrap.* instead of raising LaunchError"),
        ("BackendUnavailable", "raised BackendUnavailable .*it must be LaunchError"),
    ],
)
async def test_launch_failure_check_catches_a_backend_that_scores_it(
    outcome: str, complaint: str
) -> None:
    make_backend, launch_failure = reported_as(outcome)
    with pytest.raises(AssertionError, match=complaint):
        await LAUNCH_CHECK.run(make_backend, launch_failure=launch_failure)


async def test_launch_failure_check_needs_the_backends_hook() -> None:
    """Without a way to make the launcher fail, the check is skipped (with its reason),
    never passed; check_backend refuses to run unless it is skipped explicitly."""
    make_backend, _ = fake()
    with pytest.raises(unittest.SkipTest, match="pass launch_failure="):
        await LAUNCH_CHECK.run(make_backend)
    with pytest.raises(ValueError, match="pass launch_failure="):
        await check_backend(make_backend)
