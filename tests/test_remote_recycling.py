"""Recycling through REAL servers on loopback: a sandbox released to a recycling warm pool
is reset on the server, in place, and comes back indistinguishable from a fresh one (under
load too); the reset and snapshot routes answer only their tenant; and a server whose
backend cannot reset refuses recycling.
"""

from __future__ import annotations

import pytest

from asyncsandbox import InvalidArgument, Session, WarmPool

from . import _remote_support as remote
from ._remote_support import create_sandbox
from ._support import (
    ALICE,
    BOB,
    Server,
    a_recycled_sandbox_is_fresh,
    docker_test_image,
    episodes_leave_nothing,
)

# The remote family's fixtures (tests/_remote_support.py), this module's by name.
anyio_backend = remote.anyio_backend
server_dir = remote.server_dir
process_server = remote.process_server
docker_server = remote.docker_server


# -- recycling: a reset on the server --------------------------------------------------------


def _recycling(server: Server, size: int = 1) -> Session:
    return Session(
        server.backend(ALICE)(), warm_pool=WarmPool(size=size, recycle=True), sweep=False
    )


async def test_a_recycled_remote_sandbox_is_indistinguishable_from_a_fresh_one(
    process_server: Server,
) -> None:
    """The recycling check of the process and Docker backends (tests/_support/_recycling.py), through
    a real server: the released sandbox comes back with its id, reset on the server."""
    async with _recycling(process_server) as s:
        await a_recycled_sandbox_is_fresh(s, within=60)
        metrics = s.metrics()
        assert metrics["asyncsandbox/reset_count"] >= 1
        assert s.statistics().pool_hits > 0


async def test_remote_recycling_under_load_hands_over_no_state(process_server: Server) -> None:
    async with _recycling(process_server, size=2) as s:
        seen = await episodes_leave_nothing(s, episodes=16, concurrency=4)
        assert s.statistics().pool_hits > 0
    assert len(seen) < 16, "no sandbox was reused"


def test_reset_route_resets_in_place_for_its_tenant_only(process_server: Server) -> None:
    with process_server.client(ALICE) as alice, process_server.client(BOB) as bob:
        info = alice.get("/v1/info").json()
        assert info["capabilities"]["reset"] is True
        mine = create_sandbox(alice)
        base = f"/v1/sandboxes/{mine}"
        assert alice.put(f"{base}/files", params={"path": "f"}, content=b"x").is_success
        refused = bob.post(f"{base}/reset")
        assert refused.status_code == 404, refused.text
        assert alice.get(f"{base}/files", params={"path": "f"}).content == b"x"
        reset = alice.post(f"{base}/reset")
        assert reset.status_code == 204, reset.text
        assert alice.get(f"{base}/files", params={"path": "f"}).status_code == 404
        again = alice.post(f"{base}/exec", json={"argv": ["ls", "-A", "."]})
        assert again.json()["stdout"] == "", again.text  # the same sandbox, usable, empty
        assert alice.delete(base).status_code == 204
        assert alice.post(f"{base}/reset").status_code == 404


async def test_recycling_is_refused_where_the_server_cannot_reset(docker_server: Server) -> None:
    """The Docker server's containers are not recyclable (no ``recyclable=True``): its
    info says so, a recycling session is refused, and the route answers 400."""
    with pytest.raises(InvalidArgument, match="reset"):
        async with _recycling(docker_server):
            pass
    with docker_server.client(ALICE) as alice:
        assert alice.get("/v1/info").json()["capabilities"]["reset"] is False
        mine = create_sandbox(alice, image=docker_test_image())
        try:
            refused = alice.post(f"/v1/sandboxes/{mine}/reset")
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == "invalid_argument"
        finally:
            alice.delete(f"/v1/sandboxes/{mine}")


def test_snapshot_routes_answer_only_their_tenant(process_server: Server) -> None:
    with process_server.client(ALICE) as alice, process_server.client(BOB) as bob:
        mine = create_sandbox(alice)
        assert bob.post(f"/v1/sandboxes/{mine}/snapshot").status_code == 404
        created = alice.post(f"/v1/sandboxes/{mine}/snapshot")
        assert created.status_code == 201, created.text
        snapshot = created.json()["id"]
        refused = bob.post("/v1/sandboxes", json={"snapshot": snapshot})
        assert refused.status_code == 400
        assert bob.delete(f"/v1/snapshots/{snapshot}").status_code == 204  # a no-op for bob
        copy = alice.post("/v1/sandboxes", json={"snapshot": snapshot})
        assert copy.status_code == 201, copy.text
        assert alice.delete(f"/v1/snapshots/{snapshot}").status_code == 204
        for sandbox_id in (mine, copy.json()["id"]):
            assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
