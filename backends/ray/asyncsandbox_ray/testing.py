"""A Ray cluster of processes on this machine, for tests and benchmarks of the Ray backend
(and for trying it without a cluster)::

    from asyncsandbox import Session
    from asyncsandbox_ray.testing import LocalCluster


    async def main() -> None:
        with LocalCluster() as cluster:  # starting nodes blocks: a test's setup, not a loop's
            cluster.start_node("head", {"sandbox": 1}, head=True)
            cluster.start_node("w1", {"sandbox": 1})
            options = cluster.backend_options(resources={"sandbox": 1})
            async with Session("ray", backend_options=options) as session:
                result = await session.run(["echo", "hello"])

Each node is a ``ray start --block`` of its own on a loopback address (127.0.0.2 by
default: Ray turns 127.0.0.1 into the machine's external address, 127.0.0.2 it keeps),
with one CPU and a small object store unless told otherwise. Leaving the block stops
every node and every process below it (Ray's workers, the backend's node agents among
them, run in sessions of their own) and removes the cluster's temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ("LocalCluster", "descendants")


class LocalCluster:
    """Ray nodes started as processes of this machine (see the module's docstring).

    :param ip: the address every node listens on.
    :param num_cpus: CPUs each node declares (``start_node`` may say otherwise).
    :param object_store_bytes: each node's object store.
    :param own_groups: start each node in a process group (and session) of its own, so
        that :meth:`kill_node` can kill one node whole. Otherwise the nodes stay in the
        caller's group, and die with it when something kills that group.
    :param start_deadline: seconds a node may take to start (a busy machine is slow).
    """

    def __init__(
        self,
        *,
        ip: str = "127.0.0.2",
        num_cpus: float = 1,
        object_store_bytes: int = 200_000_000,
        own_groups: bool = True,
        start_deadline: float = 180.0,
    ) -> None:
        self.ip = ip
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        self.own_groups = own_groups
        self.start_deadline = start_deadline
        # Short: Ray's socket paths live below it, and a socket path has ~100 bytes.
        self.temp_dir = Path("/tmp", f"asb-ray-{uuid.uuid4().hex[:8]}")
        self.temp_dir.mkdir()
        self.address = f"{ip}:{_free_port(ip)}"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        """Each node's ``ray start`` process, by node name."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log(self, name: str) -> Path:
        """Where node ``name``'s ``ray start`` writes."""
        return self.temp_dir / f"node-{name}.log"

    def start_node(
        self,
        name: str,
        resources: Mapping[str, float] | None = None,
        *,
        head: bool = False,
        num_cpus: float | None = None,
    ) -> None:
        """Start node ``name`` (the head first) with these custom ``resources``, and wait
        until it runs. Retried twice: two raylets starting on one machine can pick the
        same free port, and the loser exits ("Address already in use")."""
        for attempt in range(3):
            if self._try_start(name, resources or {}, head=head, num_cpus=num_cpus):
                return
            if attempt == 2:
                said = self.log(name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ray node {name} did not start: {said}")

    def _try_start(
        self, name: str, resources: Mapping[str, float], *, head: bool, num_cpus: float | None
    ) -> bool:
        ray = str(Path(sys.executable).with_name("ray"))
        cpus = self.num_cpus if num_cpus is None else num_cpus
        args = [
            ray,
            "start",
            "--block",
            f"--node-ip-address={self.ip}",
            f"--num-cpus={cpus:g}",
            f"--object-store-memory={self.object_store_bytes}",
            "--disable-usage-stats",
            f"--resources={json.dumps(dict(resources))}",
        ]
        if head:
            args += [
                "--head",
                f"--port={self.address.rsplit(':', 1)[1]}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp_dir}",
            ]
        else:
            args.append(f"--address={self.address}")
        # A busy machine registers a node slowly: longer than Ray's default 60 s.
        env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_raylet_start_wait_time_s": f"{self.start_deadline:g}",
        }
        path = self.log(name)
        with path.open("wb") as log:
            process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.own_groups,
                env=env,
            )
        self.processes[name] = process
        deadline = time.monotonic() + self.start_deadline
        while b"Ray runtime started" not in path.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                self.kill_node(name)
                return False
            time.sleep(0.2)
        return True

    def raylet(self, name: str) -> int:
        """The pid of node ``name``'s raylet (a child of its ``ray start``)."""
        for pid in descendants(self.processes[name].pid):
            with contextlib.suppress(OSError):
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                if argv0.endswith(b"/raylet"):
                    return pid
        raise LookupError(f"node {name} has no raylet")

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill node ``name``: its ``ray start`` (and its group, if its own), and every
        process below it, Ray's workers included. A signal other than SIGKILL is given
        10 s to work first."""
        process = self.processes.pop(name)
        below = descendants(process.pid)

        def send(signum: int) -> None:
            with contextlib.suppress(ProcessLookupError):
                if self.own_groups:
                    os.killpg(process.pid, signum)
                else:
                    os.kill(process.pid, signum)

        send(sig)
        if sig != signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        send(signal.SIGKILL)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        """Stop every node (workers first, then the head) and remove the temporary
        directory. Idempotent."""
        for name in [n for n in self.processes if n != "head"] + ["head"]:
            if name in self.processes:
                self.kill_node(name, signal.SIGTERM)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def backend_options(self, **more: Any) -> dict[str, Any]:
        """``backend_options`` for ``Session("ray", ...)`` that join this cluster."""
        return {"address": self.address, "init_options": {"_node_ip_address": self.ip}, **more}


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, theirs, ...), read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])
