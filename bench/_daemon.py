"""The Docker daemon seen from the harness: health checks, wedge recovery, leftovers.

Synchronous and stdlib-only on purpose: the orchestrator must keep working when the
daemon (or an async client library) does not, so every call here is a plain HTTP request
over the Unix socket with a socket timeout. A call that runs out of time raises
:class:`DaemonTimeout`; nothing here can hang.

Debian's Docker 20.10 wedges under bursts of lifecycle calls (moby/moby#46661): ``info``,
``inspect`` and ``rm`` stop answering while ``/_ping`` still does. So health means "``info``
answers within its deadline", and recovery means restarting ``dockerd`` and its
``containerd`` with the command line the running daemon was started with.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SOCKET = "/var/run/docker.sock"
API = "/v1.41"
INFO_DEADLINE = 20.0
CALL_DEADLINE = 60.0
RUN_LABEL = "asyncsandbox.bench"
"""Label (``asyncsandbox.bench=<run id>``) on every container a baseline creates."""
TAG_PREFIX = "bench-"
"""asyncsandbox sessions tag their sandboxes ``bench-<run id>`` (label
``asyncsandbox.tag.bench-<run id>``): the runtime's tags are its only way to label."""
STATE_DIR = Path("/var/tmp/asyncsandbox-bench")


class DaemonTimeout(TimeoutError):
    """The daemon did not answer within the deadline."""


class DaemonError(RuntimeError):
    """The daemon answered with an error status, or the socket failed."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def call(
    method: str,
    path: str,
    *,
    params: Mapping[str, Any] | None = None,
    deadline: float = CALL_DEADLINE,
    socket_path: str = SOCKET,
) -> Any:
    """One Engine API call, answered within ``deadline`` seconds or :class:`DaemonTimeout`.

    The deadline bounds the connect and every read (the answers used here are small, so
    that bounds the whole call)."""
    query = ""
    if params:
        query = "?" + urllib.parse.urlencode(
            {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in params.items()}
        )
    connection = _UnixConnection(socket_path, deadline)
    started = time.monotonic()
    try:
        connection.request(method, API + path + query)
        response = connection.getresponse()
        body = response.read()
    except TimeoutError as exc:
        raise DaemonTimeout(f"{method} {path}: no answer within {deadline:g}s") from exc
    except OSError as exc:
        raise DaemonError(f"{method} {path}: {exc}") from exc
    finally:
        connection.close()
    if time.monotonic() - started > deadline:
        raise DaemonTimeout(f"{method} {path}: answered after more than {deadline:g}s")
    if response.status >= 400:
        raise DaemonError(f"{method} {path}: {response.status} {body[:200]!r}")
    return json.loads(body) if body else None


def info(deadline: float = INFO_DEADLINE) -> dict[str, Any]:
    result: dict[str, Any] = call("GET", "/info", deadline=deadline)
    return result


def answers(deadline: float = INFO_DEADLINE) -> bool:
    """True when ``info`` answers in time (``/_ping`` would answer a wedged daemon too)."""
    try:
        info(deadline)
    except (DaemonTimeout, DaemonError):
        return False
    return True


def health(deadline: float = INFO_DEADLINE) -> str:
    """``"ok"``; ``"wedged"`` when ``info`` gets no answer in time (the socket accepts but
    the daemon does not answer: moby/moby#46661); ``"down"`` when nothing listens (the
    daemon is stopped or being restarted)."""
    try:
        info(deadline)
    except DaemonTimeout:
        return "wedged"
    except DaemonError:
        return "down"
    return "ok"


def version(deadline: float = 10.0) -> dict[str, Any]:
    result: dict[str, Any] = call("GET", "/version", deadline=deadline)
    return result


# -- processes ------------------------------------------------------------------------


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pids_named(name: str) -> list[int]:
    """Pids whose ``comm`` is exactly ``name`` (comm is cut at 15 characters)."""
    return sorted(
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _comm(int(entry)) == name[:15]
    )


def daemon_pids() -> dict[str, list[int]]:
    """The engine's processes: dockerd, its containerd, and the per-container shims."""
    dockerd = pids_named("dockerd")
    containerd = [
        pid
        for pid in pids_named("containerd")
        if "/var/run/docker/containerd" in " ".join(_cmdline(pid)) or _ppid(pid) in dockerd
    ]
    return {
        "dockerd": dockerd,
        "containerd": containerd,
        "shims": pids_named("containerd-shim-runc-v2"),
    }


def _ppid(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def rss_kib(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def daemon_rss_kib() -> dict[str, int]:
    """Resident memory (KiB) of dockerd, containerd and the sum of the shims."""
    return {name: rss_kib(pids) for name, pids in daemon_pids().items()}


def meminfo_kib(field: str = "MemAvailable") -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def dockerd_command() -> list[str] | None:
    """The running dockerd's command line (from ``/proc/<pid>/cmdline``)."""
    pids = pids_named("dockerd")
    return _cmdline(pids[0]) if pids else None


def restart(command: list[str], *, log: Path, ready_within: float = 120.0) -> float:
    """Kill dockerd and its containerd (SIGKILL, by pid: a wedged daemon does not stop on
    SIGTERM), relaunch ``command`` detached, wait for ``info`` to answer. Returns the
    seconds it took; raises :class:`DaemonTimeout` if the daemon does not come back.

    The container shims are left alone: the relaunched daemon reattaches or reaps them,
    and the caller removes the containers by label afterwards."""
    started = time.monotonic()
    pids = daemon_pids()
    for pid in pids["dockerd"] + pids["containerd"]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if not any(_comm(pid) for pid in pids["dockerd"] + pids["containerd"]):
            break
        time.sleep(0.1)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n--- bench: relaunching {' '.join(command)} at {time.ctime()}\n".encode())
        out.flush()
        subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd="/",
            start_new_session=True,  # not in our process group: it outlives the bench
        )
    while time.monotonic() - started < ready_within:
        if answers(5.0):
            return time.monotonic() - started
        time.sleep(1.0)
    raise DaemonTimeout(f"the relaunched daemon did not answer `info` within {ready_within:g}s")


# -- containers of a run --------------------------------------------------------------


def run_selectors(run_id: str) -> list[str]:
    """Label filters that find every container of the run (each is a separate query:
    Docker ANDs the labels of one query)."""
    return [f"{RUN_LABEL}={run_id}", f"asyncsandbox.tag.{TAG_PREFIX}{run_id}"]


def containers_of(run_id: str, deadline: float = CALL_DEADLINE) -> list[str]:
    """Ids of the run's containers (any state)."""
    ids: set[str] = set()
    for selector in run_selectors(run_id):
        found = call(
            "GET",
            "/containers/json",
            params={"all": "1", "filters": {"label": [selector]}},
            deadline=deadline,
        )
        ids.update(c["Id"] for c in found)
    return sorted(ids)


def remove_containers(ids: list[str], *, width: int = 4) -> list[str]:
    """Force-remove containers, ``width`` at a time (gently: a burst can wedge 20.10).
    Returns the ids that could not be removed."""

    def remove(container_id: str) -> str | None:
        try:
            call("DELETE", f"/containers/{container_id}", params={"force": "1", "v": "1"})
        except DaemonError as exc:
            if "No such container" in str(exc) or "already in progress" in str(exc):
                return None
            return container_id
        except DaemonTimeout:
            return container_id
        return None

    with ThreadPoolExecutor(width) as pool:
        return [cid for cid in pool.map(remove, ids) if cid is not None]
