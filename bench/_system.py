"""The systems' one small interface, so every workload is defined once, and what the
systems share.

A system creates sandboxes, runs a command in one, writes and reads back a file, and
removes it. Every Docker baseline creates the same container (the image's ``sleep`` under
Docker's init, no network, 1 GiB memory, 512 pids, all capabilities dropped,
``no-new-privileges``, no logging driver) labelled ``asyncsandbox.bench=<run id>``, and
puts a deadline on every call it makes. The baselines run commands as root in ``/``; the
runtime runs them as an unprivileged user under its shepherd (process-tree kill, bounded
output): that extra work is part of what is measured.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.to_thread

from . import _daemon

PYTHON = ("python3", "-c", "print(sum(range(1000)))")
TRUE = ("/bin/true",)
COMMANDS: dict[str, tuple[tuple[str, ...], bytes]] = {
    "python": (PYTHON, b"499500\n"),
    "true": (TRUE, b""),
}
"""The workloads' commands and their expected stdout."""

FILE_NAME = "data.bin"
BASELINE_DIR = "/tmp"
MEMORY = 1024 * 1024 * 1024
PIDS = 512
LIFETIME = "3600"  # seconds; the containers end themselves if everything else fails

Kind = Literal["docker", "process", "host", "ray"]
ALL_WORKLOADS = frozenset({"exec", "lifecycle", "rollout", "scale"})
SANDBOX_WORKLOADS = frozenset({"lifecycle", "rollout", "scale"})


class Unavailable(Exception):
    """The system cannot run here (a missing feature, tool or package); the reason says."""


@dataclass(frozen=True)
class Config:
    """What a system needs to know about the run."""

    run_id: str
    image: str
    op_deadline: float
    """Seconds any single operation may take before it counts as failed."""
    width: int = 32
    """Thread-pool width (docker-py): the workload's concurrency."""
    process_root: str = "/var/lib/asyncsandbox/bench"
    unbounded_live: bool = False
    """asyncsandbox: lift ``Limits.max_live`` (the scale workload goes past its 512)."""
    pool_size: int = 16
    count_fill: bool = False
    """Warm pools: measure from the session's start, the pool's fill included, instead of
    waiting for a full pool before each point."""
    ray_address: str | None = None
    """A running Ray cluster for ``asyncsandbox-ray`` (None: it starts one of its own)."""


class System(ABC):
    """One way of running sandboxes. Handles are opaque to the workloads."""

    name: str

    def __init__(self, name: str, config: Config) -> None:
        self.name = name
        self.config = config
        self.notes: list[str] = []

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass

    async def ready(self) -> None:  # noqa: B027 - optional hook
        """Wait until the system is ready to be measured (a warm pool filled)."""

    @abstractmethod
    async def create(self) -> Any: ...

    @abstractmethod
    async def remove(self, handle: Any) -> None: ...

    @abstractmethod
    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        """(exit status, stdout)."""

    @abstractmethod
    async def write_file(self, handle: Any, data: bytes) -> None: ...

    @abstractmethod
    async def read_file(self, handle: Any) -> bytes: ...

    def leftovers(self) -> int | None:
        """Sandboxes of this run that still exist (None: not countable here)."""
        return None

    async def count_leftovers(self) -> int | None:
        """Sandboxes of this run that exist but that nothing holds any more."""
        return await anyio.to_thread.run_sync(self.leftovers)

    def stats(self) -> dict[str, int]:
        """System-specific counters worth keeping with each point (warm pool hits)."""
        return {}


# -- helpers --------------------------------------------------------------------------


def container_name(run_id: str) -> str:
    return f"asb-bench-{run_id}-{uuid.uuid4().hex[:10]}"


def single_file_tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def first_file(archive: bytes | tarfile.TarFile) -> bytes:
    if isinstance(archive, bytes):
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            return first_file(tar)
    for member in archive:
        if member.isfile():
            extracted = archive.extractfile(member)
            if extracted is not None:
                return extracted.read()
    raise ValueError("the archive holds no regular file")


def docker_leftovers(run_id: str) -> int | None:
    try:
        return len(_daemon.containers_of(run_id, deadline=30.0))
    except (_daemon.DaemonTimeout, _daemon.DaemonError):
        return None


class CommandFailed(Exception):
    """A baseline's call answered with an error."""
