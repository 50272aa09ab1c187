"""Bounded output capture: the first and last bytes of a stream, in constant memory."""

from __future__ import annotations


class BoundedBuffer:
    """Keeps at most ``limit`` bytes of a stream: its head and its tail.

    The head (the first half of the limit) is kept because errors often announce
    themselves early; the tail (the rest) because results and tracebacks come last.
    Memory never exceeds ``limit`` plus one incoming chunk, however much is written.
    """

    __slots__ = ("_head", "_head_limit", "_tail", "_tail_limit", "size")

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.size = 0
        """Bytes written in total."""

    def write(self, data: bytes) -> None:
        self.size += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self._tail_limit:
            self._tail[:] = data[len(data) - self._tail_limit :]
        else:
            self._tail += data
            excess = len(self._tail) - self._tail_limit
            if excess > 0:
                del self._tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.size > len(self._head) + len(self._tail)

    def getvalue(self) -> bytes:
        return bytes(self._head) + bytes(self._tail)
