"""Hostile inputs to our API, on every backend: each gets a clear error (InvalidArgument or
SandboxFileError) and nothing on the host outside the sandbox is read or written (the
``canary`` fixture fails the test if its directory changes; its secret must never come
back)."""

from __future__ import annotations

import io
import math
import os
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from asyncsandbox import InvalidArgument, Sandbox, SandboxError, SandboxFileError, Session
from asyncsandbox._archive import unpack

from .._support import CANARY_SECRET, Target
from . import _host
from ._report import REPORT


async def expect_error(
    name: str,
    target: str,
    call: Callable[[], Awaitable[Any]],
    kind: type[SandboxError] | tuple[type[SandboxError], ...] = InvalidArgument,
) -> None:
    """``call`` raises ``kind`` with a message (never anything else, never success)."""
    try:
        await call()
    except kind as exc:
        error: SandboxError = exc
    except Exception as exc:
        raise AssertionError(f"{name}: {type(exc).__name__}: {exc}, expected {kind}") from exc
    else:
        raise AssertionError(f"{name}: accepted, expected {kind}")
    assert str(error), f"{name}: an error without a message"
    REPORT.input(name, target, type(error).__name__)


def invalid_calls(sb: Sandbox, s: Session) -> dict[str, Callable[[], Awaitable[Any]]]:
    nan, inf = math.nan, math.inf
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        # argv
        "argv_str": lambda: sb.exec("ls -la"),  # type: ignore[arg-type]
        "argv_bytes": lambda: sb.exec(b"ls"),  # type: ignore[arg-type]
        "argv_empty": lambda: sb.exec([]),
        "argv_none": lambda: sb.exec(None),  # type: ignore[arg-type]
        "argv_int_item": lambda: sb.exec(["echo", 1]),  # type: ignore[list-item]
        "argv_bytes_item": lambda: sb.exec([b"echo"]),  # type: ignore[list-item]
        "argv_nul": lambda: sb.exec(["echo", "a\x00b"]),
        "argv_dict": lambda: sb.exec({"echo": "x"}),  # type: ignore[arg-type]
        # env
        "env_list": lambda: sb.exec(["true"], env=["A=1"]),  # type: ignore[arg-type]
        "env_int_value": lambda: sb.exec(["true"], env={"A": 1}),  # type: ignore[dict-item]
        "env_int_key": lambda: sb.exec(["true"], env={1: "a"}),  # type: ignore[dict-item]
        "env_empty_key": lambda: sb.exec(["true"], env={"": "a"}),
        "env_equals_key": lambda: sb.exec(["true"], env={"A=B": "a"}),
        "env_nul_key": lambda: sb.exec(["true"], env={"A\x00": "a"}),
        "env_nul_value": lambda: sb.exec(["true"], env={"A": "a\x00b"}),
        # cwd
        "cwd_int": lambda: sb.exec(["true"], cwd=5),  # type: ignore[arg-type]
        "cwd_bytes": lambda: sb.exec(["true"], cwd=b"/tmp"),  # type: ignore[arg-type]
        "cwd_empty": lambda: sb.exec(["true"], cwd=""),
        "cwd_nul": lambda: sb.exec(["true"], cwd="/tmp\x00/x"),
        "cwd_huge": lambda: sb.exec(["true"], cwd="a" * 5000),
        # stdin, output bounds
        "stdin_int": lambda: sb.exec(["cat"], stdin=5),  # type: ignore[arg-type]
        "stdin_list": lambda: sb.exec(["cat"], stdin=[b"x"]),  # type: ignore[arg-type]
        "max_output_zero": lambda: sb.exec(["true"], max_output_bytes=0),
        "max_output_negative": lambda: sb.exec(["true"], max_output_bytes=-1),
        "max_output_float": lambda: sb.exec(["true"], max_output_bytes=1.5),  # type: ignore[arg-type]
        # timeouts
        "timeout_negative": lambda: sb.exec(["true"], timeout=-1),
        "timeout_nan": lambda: sb.exec(["true"], timeout=nan),
        "timeout_inf": lambda: sb.exec(["true"], timeout=inf),
        "timeout_str": lambda: sb.exec(["true"], timeout="5"),  # type: ignore[arg-type]
        "timeout_bool": lambda: sb.exec(["true"], timeout=True),
        "stream_timeout_nan": lambda: _stream(sb, timeout=nan),
        "run_timeout_negative": lambda: s.run(["true"], timeout=-0.5),
        # paths
        "path_empty": lambda: sb.read_file(""),
        "path_nul": lambda: sb.read_file("a\x00b"),
        "path_bytes": lambda: sb.read_file(b"/etc/passwd"),  # type: ignore[arg-type]
        "path_int": lambda: sb.write_file(3, b"x"),  # type: ignore[arg-type]
        "path_huge": lambda: sb.write_file("a/" * 3000, b"x"),
        "write_data_int": lambda: sb.write_file("f", 5),  # type: ignore[arg-type]
        "write_data_list": lambda: sb.write_file("f", [b"x"]),  # type: ignore[arg-type]
        "write_mode_huge": lambda: sb.write_file("f", b"x", mode=0o77777),
        "write_mode_negative": lambda: sb.write_file("f", b"x", mode=-1),
        "read_max_zero": lambda: sb.read_file("f", max_bytes=0),
        "read_max_negative": lambda: sb.read_file("f", max_bytes=-(2**70)),
        "download_max_zero": lambda: sb.download("/tmp", "/nonexistent", max_bytes=0),
        "download_local_int": lambda: sb.download("/tmp", 5),  # type: ignore[arg-type]
        "upload_missing": lambda: sb.upload("/nonexistent-asyncsandbox", "x"),
        "upload_device": lambda: sb.upload("/dev/null", "x"),
        "upload_local_int": lambda: sb.upload(5, "x"),  # type: ignore[arg-type]
        # tags and options
        "tags_str": lambda: s.sandbox(tags="abc").start(),
        "tags_65": lambda: s.sandbox(tags=[f"t{i}" for i in range(65)]).start(),
        "tags_100k": lambda: s.sandbox(tags=[f"t{i}" for i in range(100_000)]).start(),
        "tag_too_long": lambda: s.sandbox(tags=["x" * 129]).start(),
        "tag_comma": lambda: s.sandbox(tags=["a,b"]).start(),
        "tag_equals": lambda: s.sandbox(tags=["a=b"]).start(),
        "tag_nul": lambda: s.sandbox(tags=["a\x00"]).start(),
        "tag_newline": lambda: s.sandbox(tags=["a\nb"]).start(),
        "tag_empty": lambda: s.sandbox(tags=[""]).start(),
        "list_tags_str": lambda: s.list(tags="abc"),
        "lifetime_nan": lambda: s.sandbox(max_lifetime=nan).start(),
        "lifetime_negative": lambda: s.sandbox(max_lifetime=-1).start(),
        "lifetime_zero": lambda: s.sandbox(max_lifetime=0).start(),
        "unknown_option": lambda: s.sandbox(privileged=True).start(),
        "network_bogus": lambda: s.sandbox(network="bridge").start(),
        "workdir_relative": lambda: s.sandbox(workdir="work").start(),
        "image_nul": lambda: s.sandbox(image="a\x00b").start(),
        "resources_dict": lambda: s.sandbox(resources={"memory_mb": 1}).start(),
        "env_default_nul": lambda: s.sandbox(env={"A": "\x00"}).start(),
    }
    return calls


async def _stream(sb: Sandbox, **kwargs: Any) -> None:
    async with sb.exec_stream(["true"], **kwargs) as run:
        await run.wait()


async def test_invalid_arguments(target: Target, canary: Path) -> None:
    async with target.session() as s, s.sandbox() as sb:
        for name, call in invalid_calls(sb, s).items():
            # Refusing is cheap: no input may keep the event loop busy (a bound, not a
            # benchmark: 100,000 tags took 40 s of CPU before the check was made linear).
            started = time.monotonic()
            await expect_error(name, target.name, call)
            assert time.monotonic() - started < 5, f"{name}: refused only after a long time"
        # The sandbox took none of it to heart.
        assert (await sb.exec(["echo", "fine"], timeout=30)).stdout == b"fine\n"
        # The limits themselves: 64 tags are fine and findable; a zero timeout times out.
        tags = [f"t{i}" for i in range(63)]
        async with s.sandbox(tags=tags) as tagged:
            found = await s.list(tags=[target.tag, *tags])
            assert [info.id for info in found] == [tagged.id]
        REPORT.input("tags_64", target.name, "accepted")
        with pytest.raises(TimeoutError):
            await sb.exec(["sleep", "5"], timeout=0)
        REPORT.input("timeout_zero", target.name, "ExecTimeout")
    assert target.leftovers() == []


def host_paths(canary: Path) -> list[str]:
    secret = str(canary / "canary")
    return [
        secret,
        "../" * 12 + secret.lstrip("/"),
        "/workspace/../../../../" + secret.lstrip("/"),
        "./" + "../" * 30 + secret.lstrip("/"),
        "//" + secret.lstrip("/"),
        "/proc/1/root" + secret,
        "/proc/self/root" + secret,
        "/proc/self/cwd/" + "../" * 12 + secret.lstrip("/"),
    ]


async def test_path_traversal(target: Target, canary: Path) -> None:
    """Paths that climb out of the workdir stay in the sandbox: reading one finds no host
    file, writing one writes (if anything) the sandbox's own file system."""
    async with target.session() as s, s.sandbox() as sb:
        for i, path in enumerate(host_paths(canary)):
            try:
                data = await sb.read_file(path)
            except SandboxFileError as exc:
                REPORT.input(f"read_traversal_{i}", target.name, f"SandboxFileError {exc.reason}")
            else:
                raise AssertionError(f"read {path!r} returned {data[:80]!r}")
            try:
                await sb.write_file(path, b"pwned")
            except SandboxFileError as exc:
                REPORT.input(f"write_traversal_{i}", target.name, f"SandboxFileError {exc.reason}")
            else:
                REPORT.input(f"write_traversal_{i}", target.name, "written inside the sandbox")
        # Exec-side: the command cannot see the host file either.
        peek = await sb.exec(["cat", str(canary / "canary")], timeout=30)
        assert CANARY_SECRET.encode() not in peek.stdout
    assert target.leftovers() == []


SYMLINKS = """
set -e
mkdir -p links/dir
ln -s {secret} links/abs
ln -s / links/slash
ln -s {climb} links/climb
ln -s . links/self
ln -s self/.. links/up
ln -s {dir} links/hostdir
"""


async def test_symlink_escapes(target: Target, canary: Path, tmp_path: Path) -> None:
    """Symlinks made inside the sandbox toward host paths, used by read/write/download;
    symlinks made on the host, used by upload. Nothing crosses."""
    secret = str(canary / "canary")
    climb = "../" * 12 + secret.lstrip("/")
    async with target.session() as s, s.sandbox() as sb:
        made = await sb.exec(
            ["sh", "-c", SYMLINKS.format(secret=secret, climb=climb, dir=canary)], timeout=30
        )
        assert made.returncode == 0, made.stderr
        # read and write through every link (and through directory links)
        through = [
            "links/abs",
            "links/climb",
            "links/slash" + secret,
            "links/hostdir/canary",
            "links/up/links/abs",
            "links/self/../" * 6 + secret.lstrip("/"),
        ]
        for i, path in enumerate(through):
            try:
                data = await sb.read_file(path)
            except SandboxFileError as exc:
                REPORT.input(f"read_symlink_{i}", target.name, f"SandboxFileError {exc.reason}")
            else:
                assert CANARY_SECRET.encode() not in data, f"read the host's secret via {path}"
                REPORT.input(f"read_symlink_{i}", target.name, "sandbox file")
            try:
                await sb.write_file(path, b"pwned")
            except SandboxFileError as exc:
                REPORT.input(f"write_symlink_{i}", target.name, f"SandboxFileError {exc.reason}")
            else:
                REPORT.input(f"write_symlink_{i}", target.name, "written inside the sandbox")
        # download: the tree comes out without any link that leads outside it
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "keep").write_text("keep")
        before = _host.snapshot(tmp_path)
        dest = tmp_path / "outside" / "dest"
        try:
            await sb.download("links", dest)
        except SandboxFileError as exc:
            REPORT.input("download_symlinks", target.name, f"SandboxFileError {exc.reason}")
        else:
            REPORT.input("download_symlinks", target.name, "downloaded")
        assert _host.escaping_links(dest) == [] if dest.exists() else True
        after = _host.snapshot(tmp_path)
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert all(k == "outside" or k.startswith("outside/dest") for k in changed), changed
        for i, path in enumerate(["links/abs", "links/hostdir", "links/slash"]):
            single = tmp_path / f"single-{i}"
            try:
                await sb.download(path, single)
            except SandboxFileError as exc:
                REPORT.input(f"download_link_{i}", target.name, f"SandboxFileError {exc.reason}")
            else:
                REPORT.input(f"download_link_{i}", target.name, "downloaded")
            assert not single.exists() or (
                not single.is_symlink() and CANARY_SECRET not in _read_all(single)
            )
        # upload: links on the host are copied as links, never followed
        local = tmp_path / "up"
        local.mkdir()
        (local / "to_secret").symlink_to(secret)
        (local / "to_dir").symlink_to(canary)
        (local / "plain.txt").write_text("plain")
        await sb.upload(local, "uploaded")
        listing = await sb.exec(["sh", "-c", "cat uploaded/plain.txt; ls -l uploaded"], timeout=30)
        assert listing.stdout.startswith(b"plain")
        for link in ("uploaded/to_secret", "uploaded/to_dir/canary"):
            try:
                data = await sb.read_file(link)
            except SandboxFileError as exc:
                REPORT.input(f"upload_{link}", target.name, f"SandboxFileError {exc.reason}")
            else:
                assert CANARY_SECRET.encode() not in data
        REPORT.input("upload_symlinks", target.name, "copied as links")
        await expect_error(
            "upload_top_symlink", target.name, lambda: sb.upload(local / "to_secret", "x")
        )
        # upload to a climbing destination lands inside the sandbox, or is refused
        try:
            await sb.upload(local / "plain.txt", "../" * 12 + str(canary).lstrip("/") + "/canary")
        except SandboxFileError as exc:
            REPORT.input("upload_traversal", target.name, f"SandboxFileError {exc.reason}")
        else:
            REPORT.input("upload_traversal", target.name, "inside the sandbox")
    assert target.leftovers() == []


async def test_special_files(target: Target, tmp_path: Path) -> None:
    """FIFOs the program left where the caller reads or writes, and devices that never end:
    a FIFO's open blocks until a peer shows up, /dev/zero never reaches EOF. Every file
    operation answers at once (refused, or the FIFO replaced by the file), never a hang."""
    async with target.session() as s, s.sandbox() as sb:
        made = await sb.exec(["sh", "-c", "mkdir -p d && mkfifo pipe d/pipe"], timeout=30)
        assert made.returncode == 0, made.stderr
        with anyio.fail_after(30):
            for name, path in [
                ("read_fifo", "pipe"),
                ("read_dev_zero", "/dev/zero"),
                ("read_dev_urandom", "/dev/urandom"),
            ]:
                await expect_error(name, target.name, partial(sb.read_file, path), SandboxFileError)
            await sb.write_file("pipe", b"data")
            assert await sb.read_file("pipe") == b"data"
            REPORT.input("write_over_fifo", target.name, "replaced by the file")
            upload = tmp_path / "upload.txt"
            upload.write_text("uploaded")
            await sb.upload(upload, "d/pipe")
            assert await sb.read_file("d/pipe") == b"uploaded"
            REPORT.input("upload_over_fifo", target.name, "replaced by the file")
            await sb.exec(["mkfifo", "d/pipe2"], timeout=30)
            dest = tmp_path / "dest"
            await expect_error(
                "download_fifo_tree", target.name, lambda: sb.download("d", dest), SandboxFileError
            )
    assert await anyio.to_thread.run_sync(_fifos, tmp_path) == []
    assert target.leftovers() == []


def _fifos(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_fifo()]


def blocks_used(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def _read_all(path: Path) -> str:
    if path.is_file():
        return path.read_text(errors="replace")
    return "".join(p.read_text(errors="replace") for p in path.rglob("*") if p.is_file())


@pytest.mark.slow  # a sparse 64 GiB file, 20,000 files, tar bombs
# 20,000 files made in the sandbox and 20,000 on the host: 0.3 ms each on this disk, 2.5 ms
# while another process writes and syncs, as CI's other suites do (the call took 17 s beside
# two CPU spinners, up to 72 s beside three and a dd writing with fsync, two thirds of it
# the download of the 20,000; 20 to 47 s in CI).
@pytest.mark.timeout(400)
async def test_absurd_sizes_and_tar_bombs(target: Target, tmp_path: Path) -> None:
    """A sparse 64 GiB file, 20,000 files, 32 MiB of stdin, a 48 MiB write: bounded reads
    refuse fast, bounded downloads stop at their bound, honest big transfers work."""
    _host.reset_peak_rss()
    before = _host.rss()
    async with target.session() as s, s.sandbox() as sb:
        made = await sb.exec(
            [
                "sh",
                "-c",
                (
                    "truncate -s 64G bomb/huge 2>/dev/null || (mkdir -p bomb && truncate -s 64G bomb/huge);"
                    "mkdir -p many && cd many && seq 1 20000 | xargs touch"
                ),
            ],
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
        with anyio.fail_after(30):
            await expect_error(
                "read_sparse_64g", target.name, lambda: sb.read_file("bomb/huge"), SandboxFileError
            )
            await expect_error(
                "read_sparse_64g_small_bound",
                target.name,
                lambda: sb.read_file("bomb/huge", max_bytes=10),
                SandboxFileError,
            )
        dest = tmp_path / "bomb"
        with anyio.fail_after(60):
            await expect_error(
                "download_sparse_64g",
                target.name,
                lambda: sb.download("bomb", dest, max_bytes=8 << 20),
                SandboxFileError,
            )
        on_disk = await anyio.to_thread.run_sync(blocks_used, tmp_path)
        assert on_disk < 64 << 20, f"a bounded download wrote {on_disk >> 20} MiB"
        await sb.download("many", tmp_path / "many")
        assert len(os.listdir(tmp_path / "many")) == 20000
        REPORT.input("download_20000_files", target.name, "downloaded")
        big = os.urandom(1 << 20) * 48
        await sb.write_file("big.bin", big)
        assert await sb.read_file("big.bin", max_bytes=len(big)) == big
        REPORT.input("write_48mib", target.name, "round trip")
        stdin = b"x" * (32 << 20)
        if target.name == "remote":  # the server bounds request bodies (16 MiB by default)
            await expect_error("stdin_32mib", target.name, lambda: sb.exec(["wc"], stdin=stdin))
        else:
            counted = await sb.exec(["wc", "-c"], stdin=stdin, timeout=120)
            assert counted.stdout.split() == [str(32 << 20).encode()]
            REPORT.input("stdin_32mib", target.name, "delivered")
    grew = _host.peak_rss() - before
    assert grew < 600 << 20, f"our memory grew by {grew >> 20} MiB"
    assert target.leftovers() == []


# -- crafted archives (what a hostile get_archive could send) -------------------------------


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> Any:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o644
    return info, (data if kind == tarfile.REGTYPE else None)


def _top() -> Any:
    info = tarfile.TarInfo("top")
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


def crafted(canary: Path) -> dict[str, bytes]:
    secret = str(canary / "canary")
    huge = tarfile.TarInfo("top/huge")
    huge.size = 1 << 40  # declares a TiB, sends a little
    top = _top()[0].tobuf(tarfile.PAX_FORMAT)
    return {
        "dotdot": _tar(_top(), _member("top/../../escaped", data=b"x")),
        "absolute": _tar(_top(), _member("top//" + secret.lstrip("/"), data=b"x")),
        "absolute_member": _tar(_top(), _member(secret, data=b"pwned")),
        "symlink_absolute": _tar(_top(), _member("top/l", tarfile.SYMTYPE, link=secret)),
        "symlink_climb": _tar(_top(), _member("top/l", tarfile.SYMTYPE, link="../../../..")),
        "symlink_then_write": _tar(
            _top(),
            _member("top/d", tarfile.SYMTYPE, link="."),
            _member("top/d/../../escaped", data=b"x"),
        ),
        "symlink_chain": _tar(
            _top(),
            _member("top/a", tarfile.SYMTYPE, link="."),
            _member("top/b", tarfile.SYMTYPE, link="a/.."),
        ),
        "symlink_chain_late": _tar(
            _top(),
            _member("top/b", tarfile.SYMTYPE, link="a/.."),
            _member("top/a", tarfile.SYMTYPE, link="."),
        ),
        "symlink_dir_write": _tar(
            _top(),
            _member("top/s", tarfile.SYMTYPE, link="sub"),
            _member("top/sub", tarfile.DIRTYPE),
            _member("top/s/f", data=b"x"),
        ),
        "hardlink_outside": _tar(_top(), _member("top/h", tarfile.LNKTYPE, link=secret)),
        "hardlink_climb": _tar(_top(), _member("top/h", tarfile.LNKTYPE, link="top/../../x")),
        "device": _tar(_top(), _member("top/dev", tarfile.CHRTYPE)),
        "fifo": _tar(_top(), _member("top/fifo", tarfile.FIFOTYPE)),
        "huge_declared": top + huge.tobuf(tarfile.PAX_FORMAT) + b"x" * (4 << 20),
        "truncated": _tar(_top(), _member("top/f", data=b"x" * 5000))[:1500],
        "garbage": os.urandom(4096),
    }


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 1000):
        yield data[i : i + 1000]


async def test_crafted_archives_are_refused(canary: Path, tmp_path: Path) -> None:
    """Downloads unpack a tar stream the sandbox (or a compromised backend) controls: every
    trick is refused with SandboxFileError, nothing lands outside the destination, no link
    inside it leads out."""
    for name, data in crafted(canary).items():
        base = tmp_path / name
        base.mkdir()
        (base / "keep").write_text("keep")
        before = _host.snapshot(base)
        dest = base / "dest"
        try:
            await unpack(_chunks(data), dest, max_bytes=1 << 20, label=name)
        except SandboxFileError as exc:
            REPORT.input(f"archive_{name}", "archive", f"SandboxFileError {exc.reason}")
        else:
            REPORT.input(f"archive_{name}", "archive", "unpacked")
        after = _host.snapshot(base)
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert all(k == "." or k.startswith("dest") for k in changed), (name, changed)
        if dest.exists():
            assert _host.escaping_links(dest) == [], name
        assert not (tmp_path / "escaped").exists(), name
