"""A process sandbox's isolation on this machine: what it sees of the host and of other
sandboxes (no network, a hidden and read-only host, a host user of its own), the system it
runs (the host's, or a root filesystem), and what its commands start with (no signal
disposition, capability or privilege of their launcher's)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import anyio
import pytest

from asyncsandbox import SandboxDefaults
from asyncsandbox._process import ProcessAttributes
from asyncsandbox._process._layout import etc_snapshot

from . import _process_support as process
from ._process_support import IS_ROOT, session
from ._support import PROCESS_MECHANISMS, mechanism_unavailable, process_options

# The process family's fixture (tests/_process_support.py), this module's by name.
anyio_backend = process.anyio_backend


# -- what a sandbox sees ------------------------------------------------------------------


async def test_no_network_by_default(process_root: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
        async with session(process_root) as s:
            isolated = await s.run(["python3", "-c", code])
            assert isolated.returncode != 0
            assert b"ConnectionRefused" in isolated.stderr
            shared = await s.run(["python3", "-c", code], network="host")
            assert shared.stdout == b"connected\n", shared.stderr


async def test_host_is_hidden_and_read_only(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as sb:
        assert (await sb.exec(["ls", "/root"])).returncode != 0  # not in the view at all
        assert (await sb.exec(["sh", "-c", "echo x > /usr/owned"])).returncode != 0
        # Root-only host files stay out of the sandbox's /etc (they could not be read
        # through the view either: the sandbox runs as an unprivileged host user).
        shadow = await sb.exec(["cat", "/etc/shadow"])
        assert shadow.returncode != 0
        assert b"No such file" in shadow.stderr
        ident = await sb.exec(["sh", "-c", "id -u; hostname; echo $HOME"])
        assert ident.stdout == b"1000\nsandbox\n/home/sandbox\n"
        ps = await sb.exec(
            [
                "python3",
                "-c",
                "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            ]
        )
        assert max(eval(ps.stdout)) < 10  # its own PID namespace


async def test_sandboxes_do_not_see_each_other(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as a, s.sandbox() as b:
        await a.write_file("/tmp/secret", b"a's")
        await a.write_file("mine.txt", b"a's")
        assert (await b.exec(["ls", "/tmp/secret", "mine.txt"])).returncode != 0
        root_a = a.extra(ProcessAttributes.root)
        assert (root_a / "fs" / "work" / "mine.txt").read_bytes() == b"a's"


async def test_home_and_tmp_persist_across_commands(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as sb:
        await sb.exec(
            ["sh", "-c", "echo 1 > ~/.rc && echo 2 > /tmp/t && mkdir -p pkg && echo 3 > pkg/m"]
        )
        again = await sb.exec(["sh", "-c", "cat ~/.rc /tmp/t pkg/m"])
        assert again.stdout == b"1\n2\n3\n"


async def test_custom_workdir(process_root: Path) -> None:
    async with (
        session(process_root, defaults=SandboxDefaults(workdir="/testbed")) as s,
        s.sandbox() as sb,
    ):
        assert (await sb.exec(["pwd"])).stdout == b"/testbed\n"
        await sb.write_file("f", b"x")
        assert await sb.read_file("/testbed/f") == b"x"
    async with session(process_root, defaults=SandboxDefaults(workdir="/usr/app")) as s:
        with pytest.raises(Exception, match="read-only system directory"):
            await s.sandbox().start()


@pytest.mark.skipif(not IS_ROOT, reason="one host uid per sandbox needs root")
async def test_each_live_sandbox_is_its_own_host_user(process_root: Path) -> None:
    async with session(process_root) as s, s.sandbox() as a, s.sandbox() as b:
        owners = {os.stat(sb.extra(ProcessAttributes.root) / "fs" / "work").st_uid for sb in (a, b)}
        assert len(owners) == 2
        assert all(uid >= 0x70000000 for uid in owners)
        await a.exec(["sh", "-c", "echo x > f"])
        host_file = a.extra(ProcessAttributes.root) / "fs" / "work" / "f"
        assert host_file.stat().st_uid in owners
        # The sandbox directories' content is private to their owner on the host.
        fs = a.extra(ProcessAttributes.root) / "fs"
        assert fs.stat().st_mode & 0o077 == 0
    from asyncsandbox._process._uids import REGISTRY

    assert not any((REGISTRY / str(uid)).exists() for uid in owners), (
        "uids stay claimed after their sandboxes were removed"
    )


# -- the system it runs: the host's, or a root filesystem ---------------------------------


async def test_python_is_python3_where_the_system_has_only_python3(process_root: Path) -> None:
    """The seeds run "python": in a sandbox of a system without it, it is python3 (as an
    image with python-is-python3), so a reward is never 0 for want of a name."""
    async with session(process_root) as s, s.sandbox() as sb:
        both = await sb.exec(["sh", "-c", "python -c 'import sys; print(sys.version_info[0])'"])
        assert both.stdout == b"3\n", both


ROOTFS = os.environ.get("ASYNCSANDBOX_TEST_ROOTFS")


@pytest.mark.skipif(
    not ROOTFS, reason="set ASYNCSANDBOX_TEST_ROOTFS to a root filesystem (CI does)"
)
async def test_root_filesystem_image(process_root: Path) -> None:
    assert ROOTFS is not None
    async with (
        session(process_root, defaults=SandboxDefaults(image=ROOTFS)) as s,
        s.sandbox() as sb,
    ):
        release = await sb.read_file("/etc/os-release")
        assert release == await anyio.Path(ROOTFS, "etc/os-release").read_bytes()
        assert (await sb.exec(["python3", "-c", "print(2 + 2)"])).stdout == b"4\n"
        assert (await sb.exec(["sh", "-c", "command -v bwrap"])).returncode != 0  # not the host
    async with session(process_root, defaults=SandboxDefaults(image="python:3.12")) as s:
        with pytest.raises(Exception, match="root filesystem directories"):
            await s.sandbox().start()


def test_the_etc_snapshot_keeps_the_hosts_symlinks_by_linking_them(tmp_path: Path) -> None:
    """A sandbox's /etc is a snapshot of the system's, taken once per backend: its symlinks
    that stay inside the sandbox's view keep their targets, as hard links of the system's
    own (a host's /etc has hundreds, in ``ssl/certs`` and ``alternatives``: linking them
    makes no inode); one leading out of the view becomes a copy of what it names."""
    source = tmp_path / "system"
    for directory in ("etc", "usr/lib", "usr/share/zoneinfo", "run"):
        (source / directory).mkdir(parents=True)
    (source / "usr/lib/os-release").write_text("ID=test\n")
    (source / "usr/share/zoneinfo/UTC").write_text("TZif\n")
    (source / "run/resolv.conf").write_text("nameserver 127.0.0.1\n")
    kept = {"os-release": "../usr/lib/os-release", "localtime": "/usr/share/zoneinfo/UTC"}
    for name, target in kept.items():
        (source / "etc" / name).symlink_to(target)
    (source / "etc/resolv.conf").symlink_to("/run/resolv.conf")

    snapshot = etc_snapshot(tmp_path / "snapshots", source)

    for name, target in kept.items():
        ours, theirs = snapshot / name, source / "etc" / name
        assert os.readlink(ours) == target
        assert os.lstat(ours).st_ino == os.lstat(theirs).st_ino  # the same symlink
    assert not (snapshot / "resolv.conf").is_symlink()
    assert (snapshot / "resolv.conf").read_text() == "nameserver 127.0.0.1\n"


# -- how its commands start ---------------------------------------------------------------


# What gVisor's /proc/self/status leaves out: the ambient capabilities (PR_CAP_AMBIENT_IS_SET
# for each) and no_new_privs (PR_GET_NO_NEW_PRIVS).
PRCTL_STATUS = (
    "import ctypes; libc = ctypes.CDLL(None); "
    "print(sum(1 << c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1), "
    "libc.prctl(39, 0, 0, 0, 0))"
)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_command_starts_clean(mechanism: str, process_root: Path) -> None:
    """The command starts as a shell's child would (no signal ignored, caught or blocked,
    a session of its own) and with nothing of its launcher's power (no capability,
    no_new_privs, the seccomp filter): whatever init holds or ignores itself (the Python
    it runs in ignores SIGPIPE and SIGXFSZ; it spawns the command after shedding its
    privileges; the caller may ignore SIGHUP, SIGINT, SIGQUIT), none of it reaches the
    command."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    options = process_options(mechanism)
    # As a trainer under nohup, or in the background of a script: these ignored here.
    inherited = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    saved = {signum: signal.signal(signum, signal.SIG_IGN) for signum in inherited}
    try:
        async with session(process_root, backend_options=options) as s, s.sandbox() as sb:
            status = await sb.exec(["cat", "/proc/self/status"])  # cat catches nothing
            session_leader = await sb.exec(
                ["python3", "-c", "import os; print(os.getsid(0) == os.getpid())"]
            )
            piped = await sb.exec(["sh", "-c", "(yes; echo yes: $? >&2) | head -n 1"])
            asked = await sb.exec(["python3", "-c", PRCTL_STATUS])
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    fields = dict(line.split(":", 1) for line in status.stdout.decode().splitlines())
    seen = {
        name: value.strip()
        for name, value in fields.items()
        if name.startswith(("Sig", "Cap", "NoNewPrivs", "Seccomp"))
    }
    if mechanism == "gvisor":
        # gVisor's status has no signal lines, nor CapAmb nor NoNewPrivs (asked of prctl):
        # the dispositions are shown by the SIGPIPE check below.
        ambient, no_new_privs = asked.stdout.decode().split()
        caps = {name: value for name, value in seen.items() if name.startswith("Cap")}
        assert caps == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd"), "0" * 16)
        assert (ambient, no_new_privs, seen["Seccomp"]) == ("0", "1", "2"), seen
        seen = {
            "SigIgn": "0",
            **dict.fromkeys(("SigCgt", "SigBlk", *caps, "CapAmb"), "0" * 16),
            "NoNewPrivs": "1",
            "Seccomp": "2",
        }
    seen.pop("SigQ", None)
    seen.pop("SigPnd", None)
    seen.pop("Seccomp_filters", None)
    # Nothing ignored but, where the command is spawned (native), the C library's two
    # reserved signals: every posix_spawn of glibc leaves them ignored.
    ignored = int(seen.pop("SigIgn"), 16)
    reserved = sum(1 << (n - 1) for n in set(range(1, signal.NSIG)) - signal.valid_signals())
    assert ignored & ~reserved == 0, seen
    assert seen == {
        "SigCgt": "0000000000000000",
        "SigBlk": "0000000000000000",
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }, status
    if mechanism != "bwrap":  # bubblewrap's session is its own (it has no terminal either)
        assert session_leader.stdout == b"True\n"
    # `yes` died of SIGPIPE (128 + 13), not of a write error it got with SIGPIPE ignored.
    assert (piped.stdout, piped.stderr) == (b"y\n", b"yes: 141\n"), piped
