"""The process backend's isolation mechanisms (bubblewrap, the native launcher, its
resident executor, gVisor): each one on this machine conforms, how one is chosen (and what
is missing when none can be), and the weaker modes, asked for by name and warned about."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from asyncsandbox import BackendUnavailable, InvalidArgument, SandboxDefaults, Session
from asyncsandbox._process import ProcessBackend, _backend as process_backend, _seccomp, _select
from asyncsandbox.testing import CHECKS, Check

from . import _process_support as process
from ._process_support import IS_ROOT, session
from ._support import (
    PROCESS_MECHANISMS,
    default_process_mechanism,
    mechanism_unavailable,
    process_launch_failure,
    process_options,
)

# The process family's fixture (tests/_process_support.py), this module's by name.
anyio_backend = process.anyio_backend


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_pseudo_terminal_opens(mechanism: str, process_root: Path) -> None:
    """The sandbox's own /dev/pts gives terminals to its user (interactive programs, E2B's
    PTY sessions): its /dev/ptmx opens. (The native launcher's devpts had ptmxmode 000:
    openpty failed with EACCES.)"""
    if problem := mechanism_unavailable(mechanism):
        pytest.skip(problem)
    program = "import os; master, slave = os.openpty(); print(os.ttyname(slave))"
    async with session(process_root, backend_options=process_options(mechanism)) as s:
        result = await s.run(["python3", "-c", program], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"/dev/pts/")


# The mechanism is independent of the async library: asyncio suffices here. gVisor, and
# the mechanism ProcessBackend() runs here, run the suite in test_conformance.py (on
# asyncio, and on trio in the slow suite): not twice.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("mechanism", [m for m in PROCESS_MECHANISMS if m != "gvisor"])
async def test_every_mechanism_conforms(mechanism: str, check: Check, process_root: Path) -> None:
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    if mechanism == default_process_mechanism():
        pytest.skip("the default mechanism: test_conformance.py runs the suite on it")
    await check.run(
        lambda: ProcessBackend(root=process_root, **process_options(mechanism)),
        launch_failure=process_launch_failure,
    )


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_default_mechanism_is_the_one_left_to_test_conformance(
    process_root: Path,
) -> None:
    """test_every_mechanism_conforms leaves the default mechanism to test_conformance.py,
    which runs the suite on ``ProcessBackend()``: they are the same here."""
    mechanism = default_process_mechanism()
    if mechanism is None:
        pytest.skip("ProcessBackend() here is bubblewrap with the native executor: no entry")
    options = process_options(mechanism)
    backends = ProcessBackend(root=process_root), ProcessBackend(root=process_root, **options)
    seen = []
    for backend in backends:
        async with Session(backend) as s, s.sandbox() as sb:
            assert sb.id is not None
            seen.append((backend.capabilities, type(backend._handles[sb.id]._path).__name__))
    assert seen[0] == seen[1]


@pytest.fixture
def no_mechanism_cached() -> Iterator[None]:
    """The mechanism is chosen once per process: forget it around a test that changes
    what the machine seems to offer."""
    saved = dict(_select.SELECTED)
    _select.SELECTED.clear()
    yield
    _select.SELECTED.clear()
    _select.SELECTED.update(saved)


async def test_refuses_with_what_is_missing(
    process_root: Path, monkeypatch: pytest.MonkeyPatch, no_mechanism_cached: None
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(BackendUnavailable, match=r"apt-get install bubblewrap"):
        async with session(process_root, backend_options={"isolation": "bwrap"}):
            pass
    # Without bubblewrap, "auto" falls back to the native launcher: same guarantees.
    async with session(process_root, backend_options={"isolation": "auto"}) as s:
        assert s.backend.capabilities.isolation.startswith("native")
        assert "seccomp" in s.backend.capabilities.isolation
    _select.SELECTED.clear()

    def no_libseccomp() -> bytes:
        raise _seccomp.SeccompUnavailable(
            "libseccomp cannot be loaded (apt-get install libseccomp2)"
        )

    monkeypatch.setattr(_seccomp, "program", no_libseccomp)
    with pytest.raises(BackendUnavailable, match=r"libseccomp2.*'seccomp': False"):
        async with session(process_root):
            pass


@pytest.mark.skipif(not IS_ROOT, reason="as root, sandboxes run as other users")
async def test_a_root_other_users_cannot_reach_is_refused_by_name(
    process_root: Path, no_mechanism_cached: None
) -> None:
    """As root, sandboxes run as other users, who must be able to pass every directory
    above the root (pytest's ``tmp_path`` and ``tempfile.mkdtemp()`` are 0700): the refusal
    names the directory in the way and what to do, not bubblewrap's "Permission denied"
    followed by "install bubblewrap"."""
    private = process_root / "private"
    private.mkdir(mode=0o700, parents=True)
    with pytest.raises(BackendUnavailable) as refused:
        async with session(private / "root"):
            pass
    message = str(refused.value)
    assert f"{private} (mode 0700)" in message, message
    assert f"chmod o+x {private}" in message, message
    assert "install bubblewrap" not in message, message
    private.chmod(0o711)  # passable: the same root works
    async with session(private / "root") as s:
        assert (await s.run(["true"])).returncode == 0


async def test_weaker_modes_are_asked_for_by_name_and_warned_about(
    process_root: Path, monkeypatch: pytest.MonkeyPatch, no_mechanism_cached: None
) -> None:
    monkeypatch.setattr(process_backend, "_WARNED", set())
    options = {"isolation": "native", "seccomp": False}
    with capture_logs() as logs:
        for _ in range(2):  # warned once per process, not per session
            async with session(process_root, backend_options=options) as s, s.sandbox() as sb:
                status = await sb.exec(["grep", "Seccomp:", "/proc/self/status"])
                assert status.stdout.split() == [b"Seccomp:", b"0"]
                assert "seccomp" not in s.backend.capabilities.isolation
    assert [e["event"] for e in logs].count("process.isolation.weaker") == 1
    # Unisolated: only by name, warned about, and never with network='none' (it cannot be).
    with capture_logs() as logs:
        async with session(process_root, backend_options={"isolation": "none"}) as s:
            with pytest.raises(InvalidArgument, match="network='none'"):
                await s.sandbox().start()
    assert [e["event"] for e in logs].count("process.isolation.none") == 1
    unisolated = SandboxDefaults(network="host")
    async with (
        session(process_root, backend_options={"isolation": "none"}, defaults=unisolated) as s,
        s.sandbox() as sb,
    ):
        assert s.backend.capabilities.isolation.startswith("none")
        assert (await sb.exec(["sh", "-c", "echo unisolated"])).stdout == b"unisolated\n"
        await sb.write_file("f.txt", b"data")
        assert (await sb.exec(["cat", "f.txt"])).stdout == b"data"


def test_bad_isolation_options_are_clear_errors(
    process_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidArgument, match="isolation must be one of auto, bwrap, native"):
        ProcessBackend(root=process_root, isolation="unshare")  # type: ignore[arg-type]
    monkeypatch.setenv("ASYNCSANDBOX_PROCESS_ISOLATION", "chroot")
    with pytest.raises(InvalidArgument, match=r"\$ASYNCSANDBOX_PROCESS_ISOLATION must be"):
        ProcessBackend(root=process_root)
    monkeypatch.delenv("ASYNCSANDBOX_PROCESS_ISOLATION")
    with pytest.raises(InvalidArgument, match="seccomp must be a bool"):
        ProcessBackend(root=process_root, seccomp="no")  # type: ignore[arg-type]
    if IS_ROOT:
        with pytest.raises(InvalidArgument, match="uid_range must be"):
            ProcessBackend(root=process_root, uid_range=(0, 10))
