"""Choosing the process backend's isolation mechanism: what each mode may use on this
machine, probed once per process in a throwaway sandbox, or a clear error saying what is
missing and how to get it."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from .._errors import BackendUnavailable
from .._log import get_logger
from . import _layout, _seccomp
from ._gvisor import GVisor
from ._isolation import (
    Bubblewrap,
    IsolationUnavailable,
    Mechanism,
    Mode,
    Native,
    Resident,
    Unisolated,
)
from ._layout import HostIds, Layout, rmtree


def userns_problem() -> str | None:
    """Why this machine does not let unprivileged users create user namespaces, if so."""
    checks = (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=1"),
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces=15000"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            (
                "kernel.apparmor_restrict_unprivileged_userns=0 (or install bubblewrap, which "
                "Ubuntu's AppArmor policy allows)"
            ),
        ),
    )
    for path, bad, fix in checks:
        try:
            if Path(path).read_text().strip() == bad:
                return f"user namespaces are disabled ({path} is {bad}; set {fix})"
        except OSError:
            continue
    return None


def candidates(mode: Mode, *, seccomp: bool) -> list[Mechanism | IsolationUnavailable]:
    """The mechanisms ``mode`` may use, best first, or why each cannot be used."""
    if mode == "none":
        return [Unisolated(seccomp=False)]
    found: list[Mechanism | IsolationUnavailable] = []
    if seccomp:
        try:
            _seccomp.program()
        except _seccomp.SeccompUnavailable as exc:
            return [IsolationUnavailable(f"seccomp: {exc}")]
    if mode in ("auto", "bwrap"):
        exe = shutil.which("bwrap")
        if exe is None:
            found.append(
                IsolationUnavailable(
                    "bwrap: bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
                )
            )
        else:
            found.append(Bubblewrap(seccomp=seccomp, executable=exe))
    if mode in ("auto", "native"):
        found.append(Native(seccomp=seccomp))
    if mode == "gvisor":  # only when asked for: it costs a second kernel per sandbox
        found.append(GVisor.find(seccomp=seccomp))
    return found


def scratch_layout(parent: Path, etc: Path, host_ids: HostIds | None) -> Layout:
    layout = Layout(
        parent / f".probe-{uuid.uuid4().hex[:8]}", None, "/workspace", "none", etc, host_ids
    )
    _layout.prepare(layout)
    return layout


SELECTED: dict[tuple[Mode, bool], Mechanism] = {}
"""The mechanism each (mode, seccomp) resolved to: probed once per process."""


def select(mode: Mode, seccomp: bool, scratch: Path, etc: Path, ids: HostIds | None) -> Mechanism:
    """The mechanism ``mode`` resolves to on this machine (probed in a throwaway sandbox
    under ``scratch``, once per process); raise :class:`BackendUnavailable` saying what
    is missing and how to get it."""
    key = (mode, seccomp)
    if key in SELECTED:
        return SELECTED[key]
    problems: list[str] = []
    for candidate in candidates(mode, seccomp=seccomp):
        if isinstance(candidate, IsolationUnavailable):
            problems.append(str(candidate))
            continue
        layout = scratch_layout(scratch, etc, ids)
        try:
            problem = candidate.probe(layout)
        finally:
            rmtree(layout.root)
        if problem is None:
            SELECTED[key] = candidate
            return candidate
        problems.append(problem)
    if mode in ("auto", "native") and (why := userns_problem()):
        problems.append(why)
    if mode == "gvisor":
        # Asked for by name: nothing weaker is offered in its place.
        raise BackendUnavailable(
            "the process backend cannot run gVisor sandboxes on this machine ("
            + "; ".join(problems)
            + ")",
            retryable=False,
        )
    hints = [
        "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)",
        "or allow unprivileged user namespaces",
    ]
    if any(p.startswith("seccomp") for p in problems):
        hints.append(
            "or pass backend_options={'seccomp': False} to run without the seccomp filter "
            "(weaker isolation)"
        )
    hints.append(
        "or pass backend_options={'isolation': 'none'} to run commands on the host without "
        "any isolation (unsafe for untrusted code)"
    )
    raise BackendUnavailable(
        "the process backend cannot isolate sandboxes on this machine ("
        + "; ".join(problems)
        + "). To fix it: "
        + ", ".join(hints)
        + ".",
        retryable=False,
    )


def select_resident(
    chosen: Mechanism, seccomp: bool, scratch: Path, etc: Path, ids: HostIds | None
) -> Resident | None:
    """The mechanism that starts resident executors (the fast path), if any runs here:
    ``chosen`` itself when it can (the native launcher, gVisor), else the native launcher."""
    if isinstance(chosen, Resident):
        return chosen
    try:
        native = select("native", seccomp, scratch, etc, ids)
    except BackendUnavailable as exc:
        get_logger().debug("process.fast_path.unavailable", reason=str(exc))
        return None
    assert isinstance(native, Native)
    return native
