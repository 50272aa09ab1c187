"""Listing and garbage collection, on the fake backend: gc removes the sandboxes of dead
owners and those past their lifetime, a session sweeps when it starts, and delete wants a
selector. Every test runs on asyncio and trio."""

from __future__ import annotations

import time

import pytest

from asyncsandbox import InvalidArgument, SandboxDefaults, Session, _owner
from asyncsandbox.testing import FakeBackend, FakeWorld

from ._session_support import session
from ._support import eventually_async


async def lifetime_over(world: FakeWorld, sandbox_id: str) -> None:
    """Wait until the clock passes the expiry that ``max_lifetime`` wrote on the sandbox."""
    expires = float(world.sandboxes[sandbox_id].spec.labels[_owner.EXPIRES])
    await eventually_async(lambda: time.time() > expires, what="the lifetime is over")


async def test_gc_removes_sandboxes_of_dead_owners_and_expired_ones() -> None:
    world = FakeWorld()
    async with session(FakeBackend(world=world), defaults=SandboxDefaults(tags=("gc",))) as s:
        alive = await s.sandbox().start()
        dead = await s.sandbox().start()
        expired = await s.sandbox(max_lifetime=0.01).start()
        for sandbox, labels in ((dead, {_owner.OWNER: "vm-x/boot/1/2"}),):
            assert sandbox.id is not None
            world.sandboxes[sandbox.id].spec.labels.update(labels)
        # A dead owner on *this* host: a pid that does not exist.
        assert dead.id is not None
        host, boot = _owner._this_host()
        world.sandboxes[dead.id].spec.labels[_owner.OWNER] = f"{host}/{boot}/999999999/1"
        assert expired.id is not None
        await lifetime_over(world, expired.id)
        report = await s.gc(dry_run=True)
        assert {i.id: r for i, r in report} == {
            dead.id: "owner process is gone",
            expired.id: "max lifetime exceeded",
        }
        assert len(world.sandboxes) == 3
        await s.gc()
        assert set(world.sandboxes) == {alive.id}


async def test_session_start_sweeps_by_default() -> None:
    world = FakeWorld()
    async with session(FakeBackend(world=world)) as s:
        sb = await s.sandbox(max_lifetime=0.01).start()
        assert sb.id is not None
        world.sandboxes[sb.id].spec.labels[_owner.OWNER] = "elsewhere/boot/1/1"
        s._sandboxes.clear()  # forget it, as a crashed owner would
        s._runtime.live.release()
        await lifetime_over(world, sb.id)
    async with Session(FakeBackend(world=world)):
        pass
    assert world.live == 0


async def test_delete_requires_a_selector() -> None:
    async with session() as s:
        with pytest.raises(InvalidArgument, match="refusing"):
            await s.delete()
        with pytest.raises(InvalidArgument, match="single string"):
            await s.delete(ids="abc")
        with pytest.raises(InvalidArgument, match="status"):
            await s.list(status="sleeping")
