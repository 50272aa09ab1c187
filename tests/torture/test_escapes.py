"""Escapes from the process backend, tried from inside with plain Python, on EVERY isolation
mechanism this machine supports (the mechanism is in each test's id).

The threat model (README, "The process backend's isolation"): the code inside is hostile.
Shared with the host on purpose: a read-only view of the system, and the kernel. Nothing
else: not other host files, not other sandboxes, not the launcher, not the host's
devices. Each attempt below worked against an earlier version of the backend.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import (
    ExecResult,
    Resources,
    Sandbox,
    SandboxDefaults,
    SandboxOOMKilled,
    Session,
)
from asyncsandbox._process import ProcessAttributes

from .._support import (
    PROCESS_MECHANISMS,
    eventually_async,
    mechanism_unavailable,
    new_process_root,
    process_options,
    processes_gone,
    processes_with,
    running,
    unique_marker,
    watch,
)
from . import _host
from ._report import REPORT

IS_ROOT = os.geteuid() == 0


@pytest.fixture(params=PROCESS_MECHANISMS)
def mechanism(request: pytest.FixtureRequest) -> str:
    reason = mechanism_unavailable(str(request.param))
    if reason:
        pytest.skip(reason)
    return str(request.param)


@pytest.fixture
def root() -> Iterator[Path]:
    path = new_process_root("torture-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def session(root: Path, mechanism: str, **defaults: Any) -> Session:
    return Session(
        "process",
        backend_options={"root": root, **process_options(mechanism)},
        defaults=SandboxDefaults(**defaults),
        sweep=False,
        report_to=[],
    )


@asynccontextmanager
async def sandbox(root: Path, mechanism: str, **defaults: Any) -> AsyncIterator[Sandbox]:
    async with session(root, mechanism, **defaults) as s, s.sandbox() as sb:
        yield sb


@pytest.fixture
def host_canary() -> Iterator[Path]:
    """Host files outside every sandbox's view that any local user may read (``secret``)
    or write into (``drop/``): what an escaped sandbox would reach first."""
    directory = Path("/var/tmp") / f"asyncsandbox-canary-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o755)
    (directory / "secret").write_text(SECRET)
    (directory / "secret").chmod(0o644)
    (directory / "drop").mkdir()
    (directory / "drop").chmod(0o1777)
    yield directory
    try:
        assert (directory / "secret").read_text() == SECRET
        assert list((directory / "drop").iterdir()) == [], "a sandbox wrote to the host"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


SECRET = "host-secret-" + uuid.uuid4().hex


@pytest.fixture
def owner_canary() -> Iterator[Path]:
    """A private file in the home of the user running the backend (a planted SSH key, say):
    an escaped sandbox of a non-root owner would run as that user."""
    path = Path.home() / f".asyncsandbox-canary-{uuid.uuid4().hex[:8]}"
    path.write_text(SECRET)
    path.chmod(0o600)
    yield path
    dropped = path.parent / "pwned"  # what the kit writes where it can
    try:
        assert path.read_text() == SECRET, "a sandbox rewrote a file in the owner's home"
        assert not dropped.exists(), "a sandbox wrote into the owner's home"
    finally:
        path.unlink()
        dropped.unlink(missing_ok=True)


# Runs inside the sandbox: tries every way out it knows, reports what worked as JSON.
KIT = r"""
import ctypes, json, os, signal, sys
plan = json.loads(sys.argv[1])
out = {}
if plan.get("chroot"):
    # The classic: chroot into a subdirectory while holding the old root open, walk up.
    try:
        os.makedirs("/tmp/.esc", exist_ok=True)
        fd = os.open("/", os.O_RDONLY)
        os.chroot("/tmp/.esc")
        os.fchdir(fd)
        for _ in range(64):
            os.chdir("..")
        os.chroot(".")
        out["chroot"] = "escaped"
    except OSError as e:
        out["chroot"] = "blocked: " + str(e)
def roots():
    yield ""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            yield "/proc/" + pid + "/root"
for path in plan.get("read", []):
    for r in roots():
        try:
            with open(r + path) as f:
                out["read " + path] = f.read()
            break
        except OSError:
            pass
for directory in plan.get("write", []):
    for r in roots():
        try:
            with open(r + directory + "/pwned", "w") as f:
                f.write("pwned")
            out["wrote " + directory] = r or "/"
            break
        except OSError:
            pass
if plan.get("kill"):
    killed = []
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()] + plan.get("pids", []):
        if pid == os.getpid():
            continue
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                mine = plan["kill"].encode() in f.read()
        except OSError:
            mine = pid in plan.get("pids", [])
        if mine:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    out["killed"] = killed
def shellcode(pids):
    # x86-64: kill(pid, SIGKILL) for each victim, then exit(0).
    import struct
    code = b""
    for pid in pids:
        code += b"\xbf" + struct.pack("<I", pid) + b"\xbe\x09\0\0\0\xb8\x3e\0\0\0\x0f\x05"
    return code + b"\xb8\x3c\0\0\0\x31\xff\x0f\x05"
if plan.get("inject") and os.uname().machine == "x86_64":
    # Rewrite the code every process we can write to (a launcher in the host's PID
    # namespace, say) will run when its current system call returns: it kills the victims.
    injected = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        try:
            with open("/proc/%s/syscall" % pid) as f:
                fields = f.read().split()
            fd = os.open("/proc/%s/mem" % pid, os.O_RDWR)
        except OSError:
            continue
        try:
            if fields and fields[0].isdigit():
                os.pwrite(fd, shellcode(plan["pids"]), int(fields[-1], 16))
                injected.append(int(pid))
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)
    out["injected"] = injected
if plan.get("mem"):
    hits = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        try:
            with open("/proc/%s/maps" % pid) as f:
                maps = f.read().splitlines()
            fd = os.open("/proc/%s/mem" % pid, os.O_RDWR)
        except OSError:
            continue
        try:
            for line in maps:
                span, perms = line.split()[:2]
                if "w" in perms:
                    start = int(span.split("-")[0], 16)
                    os.pwrite(fd, os.pread(fd, 1, start), start)  # the same byte, back
                    hits.append(int(pid))
                    break
        except OSError:
            pass
        finally:
            os.close(fd)
    out["mem"] = hits
print(json.dumps(out))
"""


async def run_kit(sb: Sandbox, plan: dict[str, Any]) -> dict[str, Any]:
    result = await sb.exec(["python3", "-c", KIT, json.dumps(plan)], timeout=60)
    assert result.returncode == 0, result
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def record(name: str, mechanism: str, escaped: bool) -> None:
    REPORT.program(f"escape: {name}", f"process-{mechanism}", "ESCAPED" if escaped else "blocked")


# -- the host's files -----------------------------------------------------------------


async def test_chroot_escape_does_not_reach_the_host(
    mechanism: str, root: Path, host_canary: Path, owner_canary: Path
) -> None:
    async with sandbox(root, mechanism) as sb:
        found = await run_kit(
            sb,
            {
                "chroot": True,
                "read": [str(host_canary / "secret"), str(owner_canary)],
                "write": [str(host_canary / "drop"), str(owner_canary.parent)],
            },
        )
    escaped = any(key.startswith(("read", "wrote")) for key in found)
    record("chroot", mechanism, escaped)
    assert not escaped, found
    assert not found.get("chroot", "").startswith("escaped"), found


async def test_sandboxes_cannot_reach_each_other(mechanism: str, root: Path) -> None:
    """One episode must not read or rewrite another's files (that would change its reward)."""
    async with session(root, mechanism) as s, s.sandbox() as a, s.sandbox() as b:
        await b.write_file("answer.py", b"print('b')\n")
        await b.write_file("/tmp/secret", b"b's secret\n")
        b_fs = b.extra(ProcessAttributes.root) / "fs"
        found = await run_kit(
            a,
            {
                "chroot": True,
                "read": [str(b_fs / "work" / "answer.py"), str(b_fs / "tmp" / "secret")],
                "write": [str(b_fs / "work"), str(b_fs / "tmp")],
            },
        )
        untouched = await b.exec(["ls", "-A", "/tmp", "."])
    escaped = any(key.startswith(("read", "wrote")) for key in found)
    record("cross-sandbox files", mechanism, escaped)
    assert not escaped, found
    assert b"pwned" not in untouched.stdout


async def test_commands_of_other_sandboxes_cannot_be_signalled(mechanism: str, root: Path) -> None:
    """A sandbox kills whatever it can find carrying the victims' marker, and every host
    pid of theirs, also through any process whose code it can rewrite: the victims
    (another sandbox of its session, and one in a session of every mechanism) keep
    running."""
    marker = unique_marker()
    ended: list[str] = []

    async def victim(s: Session, name: str, ready: anyio.Event) -> None:
        async with s.sandbox() as sb:
            ready.set()
            result = await sb.exec(["sleep", marker])
            ended.append(f"{name}: {result.returncode}")

    async def other_session(other: str, ready: anyio.Event) -> None:
        async with session(root, other) as s:
            await victim(s, other, ready)

    async with session(root, mechanism) as s, anyio.create_task_group() as tg:
        names = [m for m in PROCESS_MECHANISMS if not mechanism_unavailable(m)]
        for name in [*names, "same session"]:
            ready = anyio.Event()
            if name == "same session":
                tg.start_soon(victim, s, name, ready)
            else:
                tg.start_soon(other_session, name, ready)
            await ready.wait()
        # A gVisor sandbox's processes are gVisor's, not host processes: not counted.
        visible = len([n for n in names if n != "gvisor"]) + (mechanism != "gvisor")
        await eventually_async(
            lambda: running("sleep", marker) >= visible,
            within=30,
            what="the victims run",
        )
        host_pids = [int(line.split(":")[0]) for line in processes_with(marker)]
        async with s.sandbox() as attacker:
            plan = {"chroot": True, "kill": marker, "pids": host_pids, "inject": True}
            found = await run_kit(attacker, plan)
        # Code the kit injected runs when its process's current system call returns: a
        # second for any to strike (a proof by absence, so it waits).
        await anyio.sleep(1)
        tg.cancel_scope.cancel()
    escaped = bool(ended)
    record("signal other sandboxes", mechanism, escaped)
    assert not escaped, (ended, found)


# -- the launcher and the namespace's init ---------------------------------------------


async def test_launcher_memory_is_out_of_reach(mechanism: str, root: Path) -> None:
    """No process outside the command's own tree (the launcher, the namespace's init)
    can be written to through /proc/PID/mem, escaped or not."""
    async with sandbox(root, mechanism) as sb:
        found = await run_kit(sb, {"chroot": True, "mem": True})
    escaped = bool(found["mem"])
    record("/proc/PID/mem", mechanism, escaped)
    assert not escaped, found


PTRACE_INIT = r"""
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
subprocess.Popen(["sleep", "%s"], start_new_session=True)  # left behind on purpose
rc = libc.ptrace(PTRACE_SEIZE, 1, None, None)
print("attached" if rc == 0 else "refused: " + os.strerror(ctypes.get_errno()))
"""


async def test_ptrace_of_init_is_refused_and_exec_returns(mechanism: str, root: Path) -> None:
    """Attaching to the namespace's init, then exiting, must not hang the exec nor let
    the command's background processes live on."""
    marker = unique_marker()
    async with sandbox(root, mechanism) as sb:
        started = time.monotonic()
        result = await sb.exec(["python3", "-c", PTRACE_INIT % marker], timeout=20)
        elapsed = time.monotonic() - started
        left = await processes_gone(marker, within=5)
    _host.kill_processes(marker)
    escaped = b"attached" in result.stdout or elapsed > 10 or bool(left)
    record("ptrace init", mechanism, escaped)
    assert result.stdout.startswith(b"refused"), result
    assert elapsed < 10
    assert left == []


# -- devices, privileges, namespaces ---------------------------------------------------


async def test_host_dev_shm_is_not_shared(mechanism: str, root: Path) -> None:
    name = f"asyncsandbox-{uuid.uuid4().hex[:8]}"
    host_file = Path("/dev/shm") / name
    host_file.write_text(SECRET)
    try:
        async with sandbox(root, mechanism) as sb:
            seen = await sb.exec(["sh", "-c", f"cat /dev/shm/{name}; ls -A /dev/shm"])
            listing = await sb.exec(["ls", "-A", "/dev"])
            wrote = await sb.exec(["sh", "-c", f"echo x > /dev/shm/{name}-in"])
        leaked = anyio.Path("/dev/shm", name + "-in")
        escaped = SECRET.encode() in seen.stdout or await leaked.exists()
        await leaked.unlink(missing_ok=True)
    finally:
        host_file.unlink()
    record("host /dev/shm", mechanism, escaped)
    assert not escaped, seen
    assert wrote.returncode == 0, wrote  # a private /dev/shm exists and is writable
    devices = set(listing.stdout.decode().split())
    allowed = {"null", "zero", "full", "random", "urandom", "tty", "shm", "pts", "ptmx"}
    allowed |= {"fd", "stdin", "stdout", "stderr", "core"}  # symlinks into /proc
    assert devices <= allowed, devices - allowed


# gVisor's /proc/self/status has no CapAmb nor NoNewPrivs line: those are asked of prctl
# there (PR_CAP_AMBIENT_IS_SET for every capability, PR_GET_NO_NEW_PRIVS).
STATUS = (
    "import os, ctypes; s = open('/proc/self/status').read().splitlines();"
    "libc = ctypes.CDLL(None);"
    "amb = sum(1 << c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1);"
    "s += [] if any(l.startswith('CapAmb') for l in s) else ['CapAmb:\\t%016x' % amb];"
    "s += [] if any(l.startswith('NoNewPrivs') for l in s) else "
    "['NoNewPrivs:\\t%d' % libc.prctl(39, 0, 0, 0, 0)];"
    "print(os.getuid(), os.getgid(), *[l for l in s if l.startswith(('Cap', 'NoNewPrivs', 'Seccomp:'))], sep='\\n')"
)


async def test_commands_hold_no_privileges(mechanism: str, root: Path) -> None:
    async with sandbox(root, mechanism) as sb:
        result = await sb.exec(["python3", "-c", STATUS])
    lines = result.stdout.decode().splitlines()
    fields = dict(line.split(":\t") for line in lines[2:])
    escaped = lines[0] == "0" or any(int(fields[c], 16) for c in fields if c.startswith("Cap"))
    record("privileges", mechanism, escaped)
    assert lines[:2] == ["1000", "1000"], lines
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2"  # a filter is loaded


REMOUNT = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND = 32, 4096
results = []
for target in (b"/etc", b"/usr", b"/"):
    rc = libc.mount(None, target, None, MS_REMOUNT | MS_BIND, None)
    results.append("remounted" if rc == 0 else os.strerror(ctypes.get_errno()))
rc = libc.mount(b"tmpfs", b"/etc", b"tmpfs", 0, None)
results.append("mounted" if rc == 0 else os.strerror(ctypes.get_errno()))
try:
    open("/etc/pwned", "w").write("x")
    results.append("wrote /etc")
except OSError as e:
    results.append(e.strerror)
print(*results, sep="\n")
"""


async def test_system_view_cannot_be_remounted_writable(mechanism: str, root: Path) -> None:
    async with sandbox(root, mechanism) as sb:
        result = await sb.exec(["python3", "-c", REMOUNT])
    out = result.stdout.decode().splitlines()
    escaped = any(line in ("remounted", "mounted", "wrote /etc") for line in out)
    record("remount", mechanism, escaped)
    assert not escaped, out


NESTED = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
rc = libc.unshare(CLONE_NEWUSER)
print("created" if rc == 0 else os.strerror(ctypes.get_errno()))
"""


async def test_no_nested_user_namespaces(mechanism: str, root: Path) -> None:
    """A user namespace inside would give back every capability (and the kernel attack
    surface that comes with them)."""
    async with sandbox(root, mechanism) as sb:
        direct = await sb.exec(["python3", "-c", NESTED])
        tool = await sb.exec(["unshare", "--user", "--map-root-user", "id", "-u"])
    escaped = direct.stdout == b"created\n" or tool.returncode == 0
    record("nested user namespace", mechanism, escaped)
    assert direct.stdout == b"Operation not permitted\n", direct
    assert tool.returncode != 0, tool


async def test_environment_is_not_in_any_argv(mechanism: str, root: Path) -> None:
    """Values of ``env=`` (API keys) never show in ``ps``: no process's command line
    carries them, while the command runs."""
    token = "token-" + uuid.uuid4().hex
    done: list[ExecResult] = []
    seen: list[str] = []
    async with sandbox(root, mechanism) as sb, anyio.create_task_group() as tg:
        # Every process's command line, looked at all the while the command runs.
        tg.start_soon(watch, lambda: seen.extend(processes_with(token)))
        command = ["sh", "-c", 'echo "$API_TOKEN"; sleep 3']
        done.append(await sb.exec(command, env={"API_TOKEN": token}))
        tg.cancel_scope.cancel()
    escaped = bool(seen)
    record("env in argv", mechanism, escaped)
    assert done[0].stdout == token.encode() + b"\n"  # the command got it
    assert not escaped, seen


SELF_SIGNALS = [
    (["sh", "-c", "kill -9 $$"], 137),
    (["sh", "-c", "kill -TERM $$"], 143),
    (["python3", "-c", "import os; os.kill(os.getpid(), 9)"], 137),
    (["python3", "-c", "import os; os.abort()"], 134),
    (["python3", "-c", "raise SystemExit(3)"], 3),
]


async def test_self_signals_give_128_plus_n(mechanism: str, root: Path) -> None:
    """A command that kills itself is not PID 1: it dies like anywhere else, so a reward
    function that checks ``returncode == 0`` never passes it."""
    async with sandbox(root, mechanism) as sb:
        got = [(await sb.exec(argv)).returncode for argv, _ in SELF_SIGNALS]
    wanted = [code for _, code in SELF_SIGNALS]
    record("self-signal exit codes", mechanism, got != wanted)
    assert got == wanted


@pytest.mark.skipif(not IS_ROOT, reason="cgroup limits need root")
async def test_oom_kill_exits_137(mechanism: str, root: Path) -> None:
    if mechanism == "gvisor":
        # memory_mb holds the whole gVisor sandbox (its kernel too): going over it ends the
        # sandbox, a typed infrastructure outcome, never a score (see _gvisor).
        async with sandbox(root, mechanism, resources=Resources(memory_mb=64)) as sb:
            with pytest.raises(SandboxOOMKilled):
                await sb.exec(["python3", "-c", "x = bytearray(512 << 20)"], timeout=60)
        record("oom exit status", mechanism, False)
        return
    async with sandbox(root, mechanism, resources=Resources(memory_mb=64)) as sb:
        hog = await sb.exec(["python3", "-c", "x = bytearray(512 << 20)"], timeout=60)
        after = await sb.exec(["echo", "ok"])
    record("oom exit status", mechanism, hog.returncode != 137)
    assert (hog.returncode, hog.oom_killed) == (137, True)
    assert after.stdout == b"ok\n"


@pytest.mark.skipif(not IS_ROOT, reason="a disk quota mounts a filesystem (root)")
async def test_disk_quota_stops_a_disk_fill(mechanism: str, root: Path) -> None:
    resources = Resources(disk_mb=32)  # type: ignore[call-arg,unused-ignore]
    before = _host.disk_used(root.parent)
    async with sandbox(root, mechanism, resources=resources) as sb:
        fill = await sb.exec(
            [
                "sh",
                "-c",
                (
                    "dd if=/dev/zero of=/tmp/fill bs=1M count=256 2>&1; "
                    "dd if=/dev/zero of=fill bs=1M count=256 2>&1"
                ),
            ],
            timeout=60,
        )
        df = await sb.exec(["sh", "-c", "du -sm /tmp/fill fill | cut -f1"])
        after = await sb.exec(["echo", "still usable"])
    grew = _host.disk_used(root.parent) - before
    record("disk fill with a quota", mechanism, b"No space left" not in fill.stdout)
    assert b"No space left on device" in fill.stdout, fill
    assert sum(int(x) for x in df.stdout.split()) <= 33, df  # both areas share the quota
    assert after.stdout == b"still usable\n"
    # Each dd writes 256 MiB: either one on the host's disk shows. (Not a tighter bound: CI
    # runs another suite on this disk at the same time.)
    assert grew < 128 << 20, f"the host's disk grew by {grew >> 20} MiB"
