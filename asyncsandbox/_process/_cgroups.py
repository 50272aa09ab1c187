"""Per-sandbox control groups: memory, pids and CPU limits, OOM counts, kill-everything.

Works with cgroup v2 (unified) and v1 (one hierarchy per controller), when this process
may create cgroups (usually: root). Without them, limits are not enforced and the
backend says so in its capabilities.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from .._config import Resources

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "asyncsandbox"


class Cgroups:
    """Factory for sandbox cgroups on this machine (see :meth:`detect`)."""

    def __init__(self, version: int, bases: dict[str, Path]) -> None:
        self.version = version
        self._bases = bases  # controller -> our parent directory ("unified" for v2)

    @classmethod
    def detect(cls) -> Cgroups | None:
        try:
            if (CGROUP_ROOT / "cgroup.controllers").exists():
                return cls._detect_v2()
            return cls._detect_v1()
        except OSError:
            return None

    @classmethod
    def _detect_v2(cls) -> Cgroups | None:
        available = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
        wanted = [c for c in ("memory", "pids", "cpu") if c in available]
        if not wanted:
            return None
        base = CGROUP_ROOT / PARENT
        base.mkdir(exist_ok=True)
        # Controllers must be enabled from the root down to our parent's children.
        for directory in (CGROUP_ROOT, base):
            enabled = (directory / "cgroup.subtree_control").read_text().split()
            missing = [c for c in wanted if c not in enabled]
            if missing:
                (directory / "cgroup.subtree_control").write_text(
                    " ".join("+" + c for c in missing)
                )
        return cls(2, {"unified": base})

    @classmethod
    def _detect_v1(cls) -> Cgroups | None:
        bases: dict[str, Path] = {}
        for controller in ("memory", "pids", "cpu", "freezer"):  # freezer: for snapshots
            mount = CGROUP_ROOT / controller
            if (mount / "cgroup.procs").exists() and os.access(mount, os.W_OK):
                base = mount / PARENT
                base.mkdir(exist_ok=True)
                bases[controller] = base
        if "memory" not in bases and "pids" not in bases:
            return None
        return cls(1, bases)

    @property
    def controllers(self) -> frozenset[str]:
        if self.version == 2:
            return frozenset({"memory_mb", "pids", "cpus"})
        names = {"memory": "memory_mb", "pids": "pids", "cpu": "cpus"}
        return frozenset(names[c] for c in self._bases if c in names)

    def create(self, sandbox_id: str, resources: Resources) -> SandboxCgroup:
        group = SandboxCgroup(self.version, {c: b / sandbox_id for c, b in self._bases.items()})
        try:
            group.setup(resources)
        except BaseException:
            group.remove()
            raise
        return group

    def attach(self, sandbox_id: str) -> SandboxCgroup:
        return SandboxCgroup(self.version, {c: b / sandbox_id for c, b in self._bases.items()})


class SandboxCgroup:
    def __init__(self, version: int, dirs: dict[str, Path]) -> None:
        self.version = version
        self.dirs = dirs

    def setup(self, resources: Resources) -> None:
        for directory in self.dirs.values():
            directory.mkdir(exist_ok=True)
        memory = None if resources.memory_mb is None else resources.memory_mb * 1024 * 1024
        cpu_quota = None if resources.cpus is None else int(resources.cpus * 100_000)
        if self.version == 2:
            d = self.dirs["unified"]
            if memory is not None:
                (d / "memory.max").write_text(str(memory))
                with contextlib.suppress(OSError):  # no swap escape
                    (d / "memory.swap.max").write_text("0")
            if resources.pids is not None:
                (d / "pids.max").write_text(str(resources.pids))
            if cpu_quota is not None:
                (d / "cpu.max").write_text(f"{cpu_quota} 100000")
            return
        if memory is not None and "memory" in self.dirs:
            d = self.dirs["memory"]
            (d / "memory.limit_in_bytes").write_text(str(memory))
            with contextlib.suppress(OSError):  # only with swap accounting
                (d / "memory.memsw.limit_in_bytes").write_text(str(memory))
        if resources.pids is not None and "pids" in self.dirs:
            (self.dirs["pids"] / "pids.max").write_text(str(resources.pids))
        if cpu_quota is not None and "cpu" in self.dirs:
            (self.dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(cpu_quota))

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes its pid into to join this cgroup (all hierarchies)."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def oom_kills(self) -> int:
        """OOM kills so far in this cgroup (0 if the kernel does not count them)."""
        if self.version == 2:
            path, key = self.dirs["unified"] / "memory.events", "oom_kill"
        elif "memory" in self.dirs:
            path, key = self.dirs["memory"] / "memory.oom_control", "oom_kill"
        else:
            return 0
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    @property
    def can_freeze(self) -> bool:
        return self.version == 2 or "freezer" in self.dirs

    def freeze(self, frozen: bool, deadline: float) -> bool:
        """Freeze (or thaw) every process of the cgroup; True once the kernel reports it
        done, False where there is no freezer or it did not finish in time."""
        if self.version == 2:
            control, value = self.dirs["unified"] / "cgroup.freeze", "1" if frozen else "0"
            state, wanted = self.dirs["unified"] / "cgroup.events", f"frozen {int(frozen)}"
        elif "freezer" in self.dirs:
            control = state = self.dirs["freezer"] / "freezer.state"
            value = wanted = "FROZEN" if frozen else "THAWED"
        else:
            return False
        try:
            control.write_text(value)
        except OSError:
            return False
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                if wanted in state.read_text().splitlines():
                    return True
            time.sleep(0.002)
        return False

    def _pids(self) -> set[int]:
        pids: set[int] = set()
        for directory in self.dirs.values():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return pids

    def kill_all(
        self, deadline: float = 5.0, *, sparing: set[int] | frozenset[int] = frozenset()
    ) -> bool:
        """SIGKILL every process in the cgroup until none is left but ``sparing`` (the
        sandbox's executor, which a reset keeps: no other process may be left); True when
        none else is."""
        if self.version == 2 and not sparing:
            with contextlib.suppress(OSError):
                (self.dirs["unified"] / "cgroup.kill").write_text("1")
        end = time.monotonic() + deadline
        while True:
            pids = self._pids() - sparing
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > end:
                return False
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for directory in self.dirs.values():
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                    time.sleep(0.01)  # processes just killed are still being reaped
