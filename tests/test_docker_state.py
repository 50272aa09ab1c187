"""Sandbox state on the Docker backend, on a real engine: fork and snapshots (images of
their own, gone with the last sandbox of a deleted one), the gc of the snapshot images a
crashed owner left, and recycling through a reset (refused unless the backend is
recyclable; a recycled container is indistinguishable from a fresh one, under load too).
asyncio only: aiodocker is asyncio-based (tests/test_docker_engine.py's
test_refuses_trio_with_a_clear_error)."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from asyncsandbox import InvalidArgument, SandboxDefaults, Session, WarmPool

from . import _docker_support as docker
from ._docker_support import docker_containers, docker_session, unique_tag
from ._support import (
    a_recycled_sandbox_is_fresh,
    docker_backend,
    docker_test_image,
    episodes_leave_nothing,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]
IMAGE = docker_test_image()

# Docker's fixtures (tests/_docker_support.py), this module's by name: its tests run on
# asyncio, and each is followed by a check that the daemon still answers.
anyio_backend = docker.docker_anyio_backend
daemon_still_answers = docker.docker_daemon_still_answers


def snapshot_images() -> list[str]:
    done = subprocess.run(
        ["docker", "images", "--format", "{{.Tag}}", "asyncsandbox-snapshot"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode().split()


@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_fork_and_snapshots_on_docker(fast_path: bool) -> None:
    tag = unique_tag()
    before = snapshot_images()
    s = Session(
        docker_backend(fast_path=fast_path), defaults=SandboxDefaults(tags=(tag,)), sweep=False
    )
    async with s, s.sandbox() as parent:
        await parent.exec(
            ["sh", "-c", "echo repo > f; mkdir -p ~/.cache && echo x > ~/.cache/y; (sleep 1004 &)"],
            check=True,
        )
        listing = ["sh", "-c", "cat f ~/.cache/y; id -u; ps -eo args= | grep -c 'sleep 100[4]'"]
        want = (await parent.exec(listing)).stdout
        children = await parent.fork(3)
        for child in children:
            # Files, owner and home carried; the parent's processes are not.
            assert (await child.exec(listing)).stdout == want.replace(b"\n1\n", b"\n0\n")
        await children[0].write_file("f", "changed")
        assert await children[1].read_file("f") == b"repo\n"
        kept = await parent.snapshot(keep=True)
        async with s.sandbox(from_snapshot=kept) as again:
            assert await again.read_file("f") == b"repo\n"
            # Deleted while a sandbox of it runs: no new sandbox starts from it, and its
            # image goes with the last sandbox of it.
            await s.delete_snapshot(kept)
            with pytest.raises(InvalidArgument, match="no snapshot"):
                await s.sandbox(from_snapshot=kept).start()
        for child in children:
            await child.stop()
    assert snapshot_images() == before
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


CRASHING_OWNER = """
import os, sys, anyio
from asyncsandbox import Session
from asyncsandbox_docker import DockerBackend
async def main():
    async with Session(DockerBackend(default_image=sys.argv[1]), sweep=False) as s:
        async with s.sandbox() as sb:
            await sb.write_file("note", "x")
            dropped = await sb.snapshot()
            kept = await sb.snapshot(keep=True)
            print(dropped.id, kept.id, flush=True)
            os._exit(9)  # the owner dies: nothing of it runs its cleanup
anyio.run(main)
"""


async def test_gc_deletes_the_snapshot_images_a_crashed_owner_left() -> None:
    done = await anyio.run_process([sys.executable, "-c", CRASHING_OWNER, IMAGE], check=False)
    assert done.returncode == 9, done.stderr.decode()
    dropped, kept = done.stdout.decode().split()
    async with Session(docker_backend(), sweep=False) as s:
        listed = await s.gc(dry_run=True)
        assert [(item.id, why) for item, why in listed if item.id in (dropped, kept)] == [
            (dropped, "owner process is gone")
        ]
        await s.gc()
        assert {dropped, kept} & set(snapshot_images()) == {kept}
        await s.delete_snapshot(kept)
    assert kept not in snapshot_images()


async def test_recycling_is_refused_on_docker_unless_recyclable() -> None:
    s = docker_session(unique_tag(), warm_pool=WarmPool(size=1, recycle=True))
    with pytest.raises(InvalidArgument, match="does not support reset"):
        async with s:
            pass


@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_a_recycled_container_is_indistinguishable_from_a_fresh_one(fast_path: bool) -> None:
    tag = unique_tag()
    s = Session(
        docker_backend(fast_path=fast_path, recyclable=True),
        defaults=SandboxDefaults(tags=(tag,)),
        warm_pool=WarmPool(size=1, recycle=True),
        sweep=False,
    )
    async with s:
        await a_recycled_sandbox_is_fresh(s, within=60)
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


def test_recyclable_needs_the_sandbox_user() -> None:
    with pytest.raises(InvalidArgument, match="user='sandbox'"):
        docker_backend(recyclable=True, user="root")


@pytest.mark.slow  # 64 episodes (the process backend's, in test_state, are not slow)
@pytest.mark.timeout(600)  # under CI load
async def test_recycling_under_load_hands_over_no_state() -> None:
    s = Session(
        docker_backend(recyclable=True),
        defaults=SandboxDefaults(tags=(unique_tag(),)),
        warm_pool=WarmPool(size=8, recycle=True),
        sweep=False,
    )
    async with s:
        seen = await episodes_leave_nothing(s, episodes=64, concurrency=16)
    assert len(seen) < 64, "no container was reused"
