"""What a Docker backend and its sandboxes share: removing containers, and snapshots (images
committed from containers, in a repository of our own)."""

from __future__ import annotations

import contextlib
import json
import re

from asyncsandbox import InvalidArgument, SandboxError, SandboxNotFound, SnapshotInfo
from asyncsandbox.log import get_logger

from ._engine import Engine

__all__ = ("DELETED", "SNAPSHOT_LABEL", "SNAPSHOT_OWNER_LABEL", "Store", "snapshot_ref")

log = get_logger("asyncsandbox.docker")

SNAPSHOT_REPOSITORY = "asyncsandbox-snapshot"
SNAPSHOT_LABEL = "asyncsandbox.snapshot"
SNAPSHOT_OWNER_LABEL = "asyncsandbox.snapshot.labels"
"""The labels a snapshot was taken with (JSON): apart from the image's other labels,
which a commit copies from the container (its owner's, even for a kept snapshot)."""
DELETED = "deleted-"  # the tag of a snapshot deleted while sandboxes used it


def snapshot_ref(snapshot_id: str) -> str:
    if not re.fullmatch(r"s-[0-9a-f]{12}", snapshot_id):
        raise InvalidArgument(f"{snapshot_id!r} is not a Docker backend snapshot id")
    return f"{SNAPSHOT_REPOSITORY}:{snapshot_id}"


class Store:
    """The containers and snapshot images of one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def force_remove(self, name: str) -> bool:
        """Remove a container, whatever its state; False if that could not be confirmed."""
        try:
            await self.engine.call(
                "DELETE", f"containers/{name}", params={"force": True, "v": True}, sandbox_id=name
            )
        except SandboxNotFound:
            pass
        except SandboxError as exc:
            if "already in progress" in str(exc):
                return True
            log.warning("docker.remove.failed", sandbox_id=name, error=str(exc))
            return False
        return True

    async def snapshot_image(self, snapshot_id: str) -> str:
        """The image of snapshot ``snapshot_id``; :class:`InvalidArgument` if there is none."""
        image = snapshot_ref(snapshot_id)
        try:
            await self.engine.call("GET", f"images/{image}/json")
        except SandboxError as exc:
            if "no such image" in str(exc).lower():
                raise InvalidArgument(
                    f"no snapshot {snapshot_id!r} in this Docker engine (it was deleted, or "
                    "taken by another backend)"
                ) from None
            raise
        return image

    async def list_snapshots(self) -> list[SnapshotInfo]:
        images = await self.engine.call(
            "GET", "images/json", params={"filters": {"label": [SNAPSHOT_LABEL]}}
        )
        listed = []
        for image in images:
            labels = image.get("Labels") or {}
            snapshot_id = labels.get(SNAPSHOT_LABEL, "")
            try:
                taken_with = json.loads(labels.get(SNAPSHOT_OWNER_LABEL) or "{}")
            except ValueError:
                taken_with = {}
            if snapshot_id and isinstance(taken_with, dict):
                listed.append(
                    SnapshotInfo(id=snapshot_id, labels=taken_with, created_at=image.get("Created"))
                )
        return listed

    async def delete_snapshot(self, snapshot_id: str) -> None:
        image = snapshot_ref(snapshot_id)
        try:
            await self.engine.call("DELETE", f"images/{image}")
            return
        except SandboxError as exc:
            message = str(exc).lower()
            if "no such image" in message:
                return
            if "(409)" not in message:
                raise
        # Containers started from it still run: it goes once the last one does. Until
        # then it is renamed, so that no new sandbox starts from it.
        name, _, tag = image.partition(":")
        await self.engine.call(
            "POST", f"images/{image}/tag", params={"repo": name, "tag": DELETED + tag}
        )
        await self.engine.call("DELETE", f"images/{image}")

    async def forget_deleted_snapshot(self, snapshot_id: str) -> None:
        """After a sandbox of ``snapshot_id`` went: delete the snapshot's image if it was
        deleted while in use and nothing uses it any more."""
        name, _, tag = snapshot_ref(snapshot_id).partition(":")
        with contextlib.suppress(SandboxError):  # still in use, or never deleted
            await self.engine.call("DELETE", f"images/{name}:{DELETED}{tag}")
