"""The torture suite's targets (tests/torture): the backends under torture, how far past
its timeout a hostile command may end on each, the host canary's secret, and a program
that forks until a pids limit refuses."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncsandbox import (
    Limits,
    Resources,
    RetryPolicy,
    SandboxDefaults,
    Session,
    Timeouts,
)
from asyncsandbox.abc import Backend

# How far past its own timeout a hostile command may end (a loaded 2-core CI machine,
# Docker's API in between): "a small bound", never a hang.
BOUND = {
    "process": 5.0,
    "process-gvisor": 10.0,
    "docker": 10.0,
    "docker-runsc": 15.0,
    "remote": 10.0,
}

CANARY_SECRET = "canary-secret-" + uuid.uuid4().hex
"""What the torture suite's host canary holds: it must never show up in a sandbox."""


@dataclass
class Target:
    """One backend under torture (tests/torture/conftest.py makes them)."""

    name: str
    tag: str
    make_backend: Callable[[], Backend]
    leftovers: Callable[[], list[str]]
    """What the target's sandboxes left on the host (directories, containers)."""
    data: dict[str, Any] = field(default_factory=dict)
    gvisor: bool = False
    """The sandboxes run on gVisor's kernel: their processes are not the host's (the host
    sees runsc's few processes), so what runs in one is asked of its own ``/proc``."""

    @property
    def bound(self) -> float:
        return BOUND[self.name]

    def session(
        self,
        *,
        resources: Resources | None = None,
        limits: Limits | None = None,
        timeouts: Timeouts | None = None,
        backend: Backend | None = None,
        retries: RetryPolicy | None = None,
        **defaults: Any,
    ) -> Session:
        config = SandboxDefaults(tags=(self.tag,), resources=resources or Resources(), **defaults)
        return Session(
            backend or self.make_backend(),
            defaults=config,
            limits=limits,
            timeouts=timeouts,
            retries=retries,
            sweep=False,
            report_to=[],
        )


FORK_UNTIL_REFUSED = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(200):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('stopped', n < 200, e.errno)\n"
)
"""A Python program that forks sleeping children until a fork is refused (a pids limit),
then prints ``stopped True ERRNO``."""
