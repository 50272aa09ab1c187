"""Result and description types returned by the runtime (frozen msgspec Structs)."""

from __future__ import annotations

import enum
from typing import Literal

import msgspec

__all__ = (
    "ExecResult",
    "OutputChunk",
    "SandboxInfo",
    "SandboxStatus",
    "Snapshot",
    "SnapshotInfo",
    "Stream",
)

Stream = Literal["stdout", "stderr"]


def _text(data: bytes) -> str:
    # Model-written programs print anything; decoding must never raise.
    return data.decode("utf-8", errors="replace")


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a finished command produced. A non-zero ``returncode`` is data, not an error."""

    argv: tuple[str, ...]
    returncode: int
    """Exit status as a shell reports it: 0-255, and 128+N when a signal N ended it."""
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    """Seconds from start to end of the command (waiting for capacity excluded)."""
    timed_out: bool = False
    """The command ran past its ``timeout`` and was killed."""
    stdout_truncated: bool = False
    """``stdout`` lost its middle: it holds the first and last bytes of a longer output."""
    stderr_truncated: bool = False
    stdout_size: int = 0
    """Bytes the command wrote to stdout in total (larger than ``len(stdout)`` if truncated)."""
    stderr_size: int = 0
    signal: int | None = None
    """The signal that ended the command, when the backend can tell."""
    oom_killed: bool = False
    """The command was killed for exceeding the sandbox's memory limit."""
    cpu_time: float | None = None
    """CPU seconds (user and system) of the command's main process and of the children it
    waited for; ``None`` where the backend cannot tell."""

    @property
    def stdout_text(self) -> str:
        """``stdout`` decoded as UTF-8; invalid bytes become U+FFFD (never raises)."""
        return _text(self.stdout)

    @property
    def stderr_text(self) -> str:
        """``stderr`` decoded as UTF-8; invalid bytes become U+FFFD (never raises)."""
        return _text(self.stderr)

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 (and was not killed)."""
        return self.returncode == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated


class OutputChunk(msgspec.Struct, frozen=True):
    """A piece of output from a streaming exec, in the order the backend received it."""

    stream: Stream
    data: bytes

    @property
    def text(self) -> str:
        """``data`` decoded as UTF-8 with replacement. A multi-byte character split across
        two chunks decodes as replacement characters; join the bytes to decode exactly."""
        return _text(self.data)


class SandboxStatus(enum.StrEnum):
    """Lifecycle state of a sandbox as its backend reports it."""

    CREATING = "creating"
    RUNNING = "running"
    STOPPED = "stopped"
    """Its processes are gone but it still holds resources (files, a container)."""
    REMOVING = "removing"
    DEAD = "dead"
    """Broken or expired; only removal is possible."""


class SandboxInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A sandbox as its backend describes it (also for sandboxes of other sessions)."""

    id: str
    status: SandboxStatus
    tags: tuple[str, ...] = ()
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Every backend label, including the runtime's own ``asyncsandbox.*`` labels."""
    image: str | None = None
    created_at: float | None = None
    """Creation time as a Unix timestamp."""
    backend: str = ""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A sandbox's filesystem state at one moment (workdir, home, ``/tmp``, what was
    installed; not its processes), from :meth:`Sandbox.snapshot`. Start any number of
    sandboxes from it with ``session.sandbox(from_snapshot=snapshot)``. Deleted with its
    session unless ``kept`` (then :meth:`Session.delete_snapshot` deletes it)."""

    id: str
    source: str
    """The id of the sandbox it was taken of."""
    kept: bool = False


class SnapshotInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot as its backend lists it (:meth:`asyncsandbox.abc.Backend.list_snapshots`)."""

    id: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Its owner's labels, when it goes with its session (one that is kept has none: it
    is never collected)."""
    created_at: float | None = None
    """Unix time."""
