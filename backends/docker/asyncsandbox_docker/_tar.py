"""Tar streams for the archive endpoints: one-file archives, and ownership rewriting.

Docker extracts archives as root and keeps each member's uid/gid, so files uploaded from a
host where they belong to root would be read-only for the sandbox user. ``owned_by``
rewrites the owner of every member in a tar stream as it passes through, in constant
memory: ustar header fields are patched (checksum recomputed) and owner records are
dropped from PAX headers.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import AsyncIterable, AsyncIterator

BLOCK = 512
_ZERO = bytes(BLOCK)
_OWNER_KEYS = (b"uid", b"gid", b"uname", b"gname")


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _size(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256 for sizes over 8 GiB
        return int.from_bytes(field[1:], "big")
    digits = field.strip(b"\0 ")
    return int(digits, 8) if digits else 0


def _checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def _reown(header: bytes, uid: int, gid: int) -> bytes:
    block = bytearray(header)
    block[108:116] = _octal(uid, 8)
    block[116:124] = _octal(gid, 8)
    block[265:297] = bytes(32)  # uname: let the numeric ids rule
    block[297:329] = bytes(32)  # gname
    _checksum(block)
    return bytes(block)


def _strip_owner_records(data: bytes) -> bytes:
    records, rest = [], data
    while rest:
        length_text, _, _ = rest.partition(b" ")
        length = int(length_text)
        record, rest = rest[:length], rest[length:]
        key = record.partition(b" ")[2].partition(b"=")[0]
        if key not in _OWNER_KEYS:
            records.append(record)
    return b"".join(records)


async def owned_by(chunks: AsyncIterable[bytes], uid: int, gid: int) -> AsyncIterator[bytes]:
    """``chunks`` (an uncompressed tar stream) with every member owned by ``uid:gid``."""
    buffer = bytearray()
    passthrough = 0  # bytes of member data (padding included) still to copy unchanged
    async for chunk in chunks:
        buffer += chunk
        out = bytearray()
        while True:
            if passthrough:
                n = min(passthrough, len(buffer))
                out += buffer[:n]
                del buffer[:n]
                passthrough -= n
                if passthrough:
                    break
            if len(buffer) < BLOCK:
                break
            header = bytes(buffer[:BLOCK])
            if header == _ZERO:
                out += header
                del buffer[:BLOCK]
                continue
            size = _size(header[124:136])
            padded = -(-size // BLOCK) * BLOCK
            if header[156:157] in (b"x", b"g"):  # PAX header: rewrite its records in place
                if len(buffer) < BLOCK + padded:
                    break  # wait for the whole (small) record block
                records = _strip_owner_records(bytes(buffer[BLOCK : BLOCK + size]))
                block = bytearray(_reown(header, uid, gid))
                block[124:136] = _octal(len(records), 12)
                _checksum(block)
                out += block + records + bytes(-len(records) % BLOCK)
                del buffer[: BLOCK + padded]
                continue
            out += _reown(header, uid, gid)
            del buffer[:BLOCK]
            passthrough = padded
        if out:
            yield bytes(out)
    if buffer:
        yield bytes(buffer)


async def single_file(
    name: str, data: bytes, *, mode: int, uid: int, gid: int
) -> AsyncIterator[bytes]:
    """A tar stream holding one regular file, without copying ``data``."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid, info.mtime = (
        len(data),
        mode,
        uid,
        gid,
        int(time.time()),
    )
    yield info.tobuf(tarfile.PAX_FORMAT)
    for offset in range(0, len(data), 1 << 20):
        yield data[offset : offset + (1 << 20)]
    yield bytes(-len(data) % BLOCK) + bytes(2 * BLOCK)  # padding, then the end-of-archive


def directories(names: list[str], *, uid: int, gid: int) -> bytes:
    """A tar holding empty directories (parents before children)."""
    entries = []
    for name in names:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
        info.mtime = int(time.time())
        entries.append((info, b""))
    return _archive(entries)


def _archive(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


class _Blocks:
    """Reads exact byte counts from a chunk stream."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = bytearray()

    async def read(self, n: int, into: bytearray | None = None) -> bytes:
        out = into if into is not None else bytearray()
        target = len(out) + n
        while len(out) < target:
            if not self._buffer:
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    raise tarfile.ReadError("unexpected end of archive")
                self._buffer += chunk
            take = min(target - len(out), len(self._buffer))
            out += self._buffer[:take]
            del self._buffer[:take]
        return bytes(out) if into is None else b""


async def read_single(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes | None:
    """The content of the first member of a tar stream if it is a regular file of at most
    ``max_bytes``, reading no more than that (None: not a regular file; a longer file
    raises OverflowError). Memory holds the content once, never the archive."""
    blocks = _Blocks(chunks)
    size_override: int | None = None
    while True:
        header = await blocks.read(BLOCK)
        if header == _ZERO:
            return None
        kind = header[156:157]
        size = _size(header[124:136])
        padded = -(-size // BLOCK) * BLOCK
        if kind in (b"x", b"g", b"L", b"K"):  # PAX records, GNU long names: metadata
            data = await blocks.read(padded)
            if kind == b"x":
                for record in data[:size].split(b"\n"):
                    key, _, value = record.partition(b" ")[2].partition(b"=")
                    if key == b"size":
                        size_override = int(value)
            continue
        if kind not in (b"0", b"\0", b"7"):
            return None
        if size_override is not None:
            size = size_override
        if size > max_bytes:
            raise OverflowError(size)
        content = bytearray()
        await blocks.read(size, into=content)
        return bytes(content)
