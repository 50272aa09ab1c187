"""Host uids for sandboxes: one per live sandbox, when the backend runs as root.

Inside, every sandbox's user is uid 1000; on the host, each live sandbox is its own uid,
so that even a kernel-level slip in one sandbox's isolation does not open another's files
or processes to it (they would be another user's). The uids come from a range no account
uses (by default 2^20 of them from ``0x70000000``, outside systemd's and the usual
subordinate ranges; ``uid_range=`` chooses another), claimed machine-wide through one file
per uid in :data:`REGISTRY`, so that backends of other processes and roots never share one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
from pathlib import Path

from ._layout import HostIds

REGISTRY = Path("/var/lib/asyncsandbox/uids")
DEFAULT_RANGE = (0x70000000, 1 << 20)
ATTEMPTS = 64


class UidPool:
    """Claims and releases host uids for sandboxes (root only)."""

    def __init__(self, start: int, count: int, registry: Path = REGISTRY) -> None:
        self.start, self.count, self.registry = start, count, registry

    def claim(self, owner: Path) -> HostIds:
        """A free uid (and the gid of the same number) for the sandbox directory ``owner``."""
        self.registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _ in range(ATTEMPTS):
            uid = self.start + random.randrange(self.count)
            slot = self.registry / str(uid)
            try:
                fd = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                self._reclaim_if_stale(slot)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(owner))
            return HostIds(uid, uid)
        raise OSError(errno.EAGAIN, f"no free host uid found in {self.registry}")

    def release(self, ids: HostIds, owner: Path) -> None:
        slot = self.registry / str(ids.uid)
        with contextlib.suppress(FileNotFoundError):
            if slot.read_text() == str(owner):
                slot.unlink()

    @staticmethod
    def _reclaim_if_stale(slot: Path) -> None:
        """A slot whose sandbox directory is gone (its owner crashed before removing it,
        and the directory was removed since) is free again."""
        with contextlib.suppress(FileNotFoundError):
            owner = Path(slot.read_text())
            if owner.is_absolute() and not owner.exists():
                slot.unlink()
