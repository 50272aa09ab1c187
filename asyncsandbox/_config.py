"""Configuration structs: what a sandbox looks like, how much may run at once, how long
infrastructure calls may take. All are frozen msgspec Structs that reject unknown fields
(so a typo such as ``imgae=`` is an error, not a silent default) and validate on
construction as well as on ``msgspec.convert`` from a dict or a config file."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from . import _validate as check
from ._errors import InvalidArgument

__all__ = ("Resources", "SandboxDefaults", "Limits", "Timeouts", "RetryPolicy", "WarmPool")

Network = Literal["none", "host"]
NETWORK_MODES: tuple[Network, ...] = ("none", "host")


class _Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied (validated like a new instance)."""
        return msgspec.structs.replace(self, **changes)


class Resources(_Config, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource limits of one sandbox. ``None`` means "no limit"."""

    cpus: float | None = None
    """CPU time, in cores (1.5 = one and a half cores)."""
    memory_mb: int | None = 1024
    """Memory of the whole sandbox, in MiB; exceeding it OOM-kills the offending process."""
    pids: int | None = 512
    """Maximum number of processes and threads in the sandbox (contains fork bombs)."""
    disk_mb: int | None = None
    """Space for what the sandbox writes (workdir, home, ``/tmp`` together), in MiB; writes
    beyond it fail with ``ENOSPC``. Process backend (as root): the writable areas are a
    tmpfs of this size, so their content lives in memory and counts toward ``memory_mb``."""

    def __post_init__(self) -> None:
        if self.cpus is not None:
            cpus = check.seconds("cpus", self.cpus)  # same rules: finite, >= 0
            if not cpus:
                raise InvalidArgument("cpus must be > 0 or None")
        check.optional_positive_int("memory_mb", self.memory_mb)
        check.optional_positive_int("pids", self.pids)
        check.optional_positive_int("disk_mb", self.disk_mb)


class SandboxDefaults(_Config, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a new sandbox looks like; ``session.sandbox(**overrides)`` changes single fields.

    On override, ``tags`` and ``env`` are merged with the defaults (tags appended, env
    keys replaced); every other field is replaced.
    """

    image: str | None = None
    """Image to run. Docker: an image reference. Process backend: ``None`` (a read-only view
    of the host system) or the path of a root filesystem directory."""
    tags: tuple[str, ...] = ()
    """Labels for finding sandboxes later (``session.list(tags=...)``); all must match."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Environment variables for every command."""
    workdir: str = "/workspace"
    """Working directory of commands and base of relative paths; created on start."""
    resources: Resources = msgspec.field(default_factory=Resources)
    network: Network = "none"
    """``"none"``: no network at all (loopback only). ``"host"``: the host's network."""
    max_lifetime: float | None = 3600.0
    """Seconds after which the sandbox is removed even if its owner forgot (or crashed)."""
    max_output_bytes: int = 1024 * 1024
    """Per stream and exec: output kept in memory beyond this is cut from the middle."""
    from_snapshot: str | None = None
    """Start from this :class:`Snapshot` (or its id) instead of an empty workdir, home and
    ``/tmp``; the image is the snapshot's. Backends with ``capabilities.snapshots`` only."""
    recyclable: bool = False
    """When the sandbox stops, it may be reset to the state it was created in and kept for
    the next sandbox of the same settings, instead of being removed and a new one created:
    to that one it is a fresh sandbox (the reset's guarantee), at a fraction of the cost,
    but its id comes back. For sandboxes whose id is not kept (one per request):
    :meth:`Session.run`, :meth:`Session.judge` and the server's per-request sandboxes ask
    for it. Where the backend cannot reset (``capabilities.reset``), it is removed."""

    def __post_init__(self) -> None:
        check.optional_text("image", self.image)
        msgspec.structs.force_setattr(self, "tags", check.tags(self.tags))
        msgspec.structs.force_setattr(self, "env", check.env("env", self.env))
        msgspec.structs.force_setattr(self, "workdir", check.absolute_path("workdir", self.workdir))
        resources: object = self.resources
        if not isinstance(resources, Resources):
            raise InvalidArgument(f"resources must be a Resources, got {resources!r}")
        check.choice("network", self.network, NETWORK_MODES)
        check.seconds("max_lifetime", self.max_lifetime)
        if self.max_lifetime == 0:
            raise InvalidArgument("max_lifetime must be > 0 or None")
        check.positive_int("max_output_bytes", self.max_output_bytes)
        snapshot: object = self.from_snapshot
        if snapshot is not None and not isinstance(snapshot, str):  # a Snapshot
            msgspec.structs.force_setattr(self, "from_snapshot", getattr(snapshot, "id", snapshot))
        check.optional_text("from_snapshot", self.from_snapshot)
        if not isinstance(self.recyclable, bool):
            raise InvalidArgument(f"recyclable must be a bool, got {self.recyclable!r}")

    def merged(self, overrides: dict[str, Any]) -> SandboxDefaults:
        """These defaults with per-sandbox ``overrides`` applied (see the class docstring)."""
        unknown = set(overrides) - set(self.__struct_fields__)
        if unknown:
            raise InvalidArgument(
                f"unknown sandbox option(s): {', '.join(sorted(unknown))}; "
                f"known: {', '.join(self.__struct_fields__)}"
            )
        changes = dict(overrides)
        if "tags" in changes:
            changes["tags"] = self.tags + check.tags(changes["tags"])
        if "env" in changes:
            changes["env"] = {**self.env, **check.env("env", changes["env"])}
        return self.replace(**changes) if changes else self


class Limits(_Config, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How much a Session lets run at once. Waiting is first-come, first-served and shows in
    ``session.statistics()``. ``None`` means unbounded."""

    max_live: int | None = 512
    """Sandboxes alive at once (from the start of their creation to the end of removal)."""
    max_lifecycle: int = 8
    """Concurrent create and remove calls. Protects daemons that wedge under bursts."""
    max_execs: int | None = 256
    """Concurrent commands and file transfers over all sandboxes of the session."""
    capacity_timeout: float | None = None
    """Longest wait for any slot before :class:`CapacityTimeout`; ``None`` waits forever."""
    capacity_warning: float | None = 5.0
    """Seconds of waiting for a slot after which a warning is logged (``session.capacity.
    waiting``, naming the limit, how many hold it, and the likely cause), then at most every
    30 s per limit; ``None``: never."""

    def __post_init__(self) -> None:
        check.optional_positive_int("max_live", self.max_live)
        check.positive_int("max_lifecycle", self.max_lifecycle)
        check.optional_positive_int("max_execs", self.max_execs)
        check.seconds("capacity_timeout", self.capacity_timeout)
        check.seconds("capacity_warning", self.capacity_warning)


class Timeouts(_Config, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Deadlines, in seconds, of infrastructure calls (never of your commands: that is
    ``exec(timeout=...)``). Exceeding one raises :class:`BackendTimeout`. ``None``: no limit."""

    create: float | None = 300.0
    """Creating and starting a sandbox, image pulls included."""
    remove: float | None = 60.0
    operation: float | None = 60.0
    """Listing, inspecting and other short calls."""
    cleanup: float = 30.0
    """How long cleanup may take when it runs shielded from cancellation (on exit paths):
    killing a command's process tree once its timeout or a cancellation came, for one.
    Backends read it (``Backend.timeouts``)."""

    def __post_init__(self) -> None:
        for name in ("create", "remove", "operation"):
            check.seconds(name, getattr(self, name))
        if not check.seconds("cleanup", self.cleanup, allow_none=False):
            raise InvalidArgument("cleanup must be > 0")


class RetryPolicy(_Config, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Retries of calls that failed with a *retryable* infrastructure error. A command is
    retried only when it never ran (:class:`LaunchError`): running one twice is not the
    same as running it once."""

    attempts: int = 4
    """Total tries, the first included (1 disables retries)."""
    backoff: float = 0.25
    """First delay; it doubles on each retry, with full jitter, up to ``max_backoff``."""
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        check.positive_int("attempts", self.attempts)
        check.seconds("backoff", self.backoff, allow_none=False)
        check.seconds("max_backoff", self.max_backoff, allow_none=False)


class WarmPool(_Config, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sandboxes kept started ahead of need, so that starting one is a hand-over.

    The pool holds sandboxes of the session's default spec (``session.sandbox()`` without
    overrides takes one; with overrides, a sandbox is created as usual) and refills in the
    background. A pooled sandbox goes to exactly one :class:`Sandbox` and is removed when
    that one stops (or, with ``recycle``, reset): never shared between episodes. Pooled sandboxes count toward
    ``Limits.max_live``, and their ``max_lifetime`` counts from their creation.
    """

    size: int
    """How many ready sandboxes to keep. With ``recycle``, how many the pool keeps in
    all: those out in an episode count too (they come back), so the pool makes no new
    ones while its own are in use, and a start that finds none ready while the pool's
    are being created waits for one of those rather than creating another. Starts beyond
    ``size`` at once create their own, which join the pool when their episode ends."""
    max_age: float | None = 600.0
    """Seconds after which an unused pooled sandbox is replaced by a fresh one (counted
    from its creation, recycled or not)."""
    recycle: bool = False
    """Reuse sandboxes: when a sandbox of the pool's spec stops, it is reset to the
    state it was created in (every process killed, every writable place restored) and
    returns to the pool, instead of being removed and replaced by a new one. A sandbox
    whose reset fails is removed (never handed over dirty). Backends with
    ``capabilities.reset`` only: the session refuses to open otherwise."""

    def __post_init__(self) -> None:
        check.positive_int("size", self.size)
        if not isinstance(self.recycle, bool):
            raise InvalidArgument(f"recycle must be a bool, got {self.recycle!r}")
        check.seconds("max_age", self.max_age)
        if self.max_age == 0:
            raise InvalidArgument("max_age must be > 0 or None")
