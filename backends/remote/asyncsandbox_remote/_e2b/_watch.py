"""Directory watchers (envd's ``WatchDir`` stream, and ``CreateWatcher`` /
``GetWatcherEvents`` / ``RemoveWatcher`` for clients that poll), by polling: the
watcher lists the directory (one ``find`` in the sandbox) every :data:`INTERVAL`
seconds, and once more when a polling client asks for its events, and reports what
changed as inotify would: a new file is ``CREATE`` then ``WRITE``, a new directory
``CREATE``, a file whose size or time changed ``WRITE``, a vanished entry ``REMOVE``.
Changes that cancel out within one interval are not seen, and a rename is a ``REMOVE``
and a ``CREATE``.

A file written through envd's ``/files`` is reported at once, with the events envd's
upload raises (it creates the file, gives it to the user, writes it): ``CREATE``,
``CHMOD``, ``WRITE`` for a new file (and ``CREATE``, ``CHMOD`` for each directory it
made), ``CHMOD``, ``WRITE`` for one replaced; the next listing takes it in silently. The
watchers that cover the file do not list while it is written (:meth:`Watchers.writing`),
so a listing cannot report half of an upload before the upload's own events.
"""

from __future__ import annotations

import posixpath
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from anyio.abc import TaskGroup
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb

from ._fs import Entry, Filesystem

__all__ = ("INTERVAL", "Watcher", "Watchers")

INTERVAL = 0.25
MAX_WATCHERS = 32
MAX_PENDING = 10_000
RECURSIVE_DEPTH = 64
EventType = filesystem_pb.EventType


class Watcher:
    """One watched directory; its events go to :attr:`events` (bounded)."""

    def __init__(
        self, fs: Filesystem, path: str, *, recursive: bool, include_entry: bool = False
    ) -> None:
        self.id = secrets.token_hex(8)
        self.path = path
        self._fs = fs
        self._depth = RECURSIVE_DEPTH if recursive else 1
        self._seen: dict[str, Entry] = {}
        self.events: list[filesystem_pb.FilesystemEvent] = []
        self.changed = anyio.Event()
        self.scope = anyio.CancelScope()
        self.failed: ConnectError | None = None
        self.lock = anyio.Lock()
        """Held by a listing, and by an upload of a file this watcher covers."""
        self._recursive = recursive
        self.include_entry = include_entry
        """Events carry the entry they are about (envd 0.6.3), where it still exists."""
        self._quiet: set[str] = set()
        """Paths reported by :meth:`wrote`, which the next listing takes in silently."""

    async def prime(self) -> None:
        """Take the first listing (raises NOT_FOUND, or INVALID_ARGUMENT for a file)."""
        self._seen = {e.path: e for e in await self._fs.entries(self.path, self._depth)}

    def _emit(self, kind: int, path: str, entry: Entry | None = None) -> None:
        if len(self.events) >= MAX_PENDING:
            del self.events[: MAX_PENDING // 2]  # a client that never reads loses the oldest
        name = posixpath.relpath(path, self.path)
        event = filesystem_pb.FilesystemEvent(name=name, type=kind)  # type: ignore[arg-type]
        if entry is not None and self.include_entry:
            event.entry = entry.info()
        self.events.append(event)
        self.changed.set()

    async def run(self) -> None:
        with self.scope:
            while self.failed is None:
                await anyio.sleep(INTERVAL)
                await self.scan()

    async def scan(self) -> None:
        """List the directory now and report what changed since the last listing."""
        async with self.lock:
            if self.failed is not None:
                return
            try:
                now = {e.path: e for e in await self._fs.entries(self.path, self._depth)}
            except ConnectError as exc:
                self.failed = exc  # the directory is gone (or the sandbox)
                self.changed.set()
                return
            for path, entry in now.items():
                if path in self._quiet:
                    continue
                before = self._seen.get(path)
                if before is None:
                    self._emit(EventType.CREATE, path, entry)
                    if entry.kind == "f" and entry.size > 0:
                        self._emit(EventType.WRITE, path, entry)
                elif before.key != entry.key and entry.kind != "d":
                    self._emit(EventType.WRITE, path, entry)
            for path in self._seen.keys() - now.keys() - self._quiet:
                self._emit(EventType.REMOVE, path)
            self._quiet -= now.keys()
            self._seen = now

    def _covers(self, path: str) -> bool:
        parent = posixpath.dirname(path)
        if self._recursive:
            return parent == self.path or parent.startswith(self.path.rstrip("/") + "/")
        return parent == self.path

    def covers(self, path: str) -> bool:
        """Whether a change of ``path`` is this watcher's to report."""
        return self.failed is None and self._covers(path)

    def wrote(self, path: str, *, empty: bool, entry: Entry | None) -> None:
        """``path`` was written through envd's upload: report the events envd's raises
        (see the module docstring)."""
        if not self.covers(path):
            return
        known = self._seen.keys() | self._quiet
        made = []
        parent = posixpath.dirname(path)
        while parent != self.path and parent not in known and self._covers(parent):
            made.append(parent)
            parent = posixpath.dirname(parent)
        for directory in reversed(made):
            self._emit(EventType.CREATE, directory)
            self._emit(EventType.CHMOD, directory)
        if path not in known:
            self._emit(EventType.CREATE, path, entry)
            self._emit(EventType.CHMOD, path, entry)
            if not empty:
                self._emit(EventType.WRITE, path, entry)
        else:
            self._emit(EventType.CHMOD, path, entry)
            self._emit(EventType.WRITE, path, entry)
        self._quiet.update(made)
        self._quiet.add(path)

    def take(self) -> list[filesystem_pb.FilesystemEvent]:
        events, self.events = self.events, []
        self.changed = anyio.Event()
        if not events and self.failed is not None:
            raise self.failed
        return events


class Watchers:
    """The watchers of one sandbox."""

    def __init__(self, fs: Filesystem, task_group: Callable[[], TaskGroup]) -> None:
        self._fs = fs
        self._task_group = task_group
        self._watchers: dict[str, Watcher] = {}

    async def create(self, path: str, *, recursive: bool, include_entry: bool = False) -> Watcher:
        if len(self._watchers) >= MAX_WATCHERS:
            raise ConnectError(
                Code.RESOURCE_EXHAUSTED, f"the sandbox has {MAX_WATCHERS} watchers already"
            )
        watcher = Watcher(self._fs, path, recursive=recursive, include_entry=include_entry)
        await watcher.prime()
        self._watchers[watcher.id] = watcher
        self._task_group().start_soon(watcher.run)
        return watcher

    def get(self, watcher_id: str) -> Watcher:
        watcher = self._watchers.get(watcher_id)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {watcher_id[:64]!r} not found")
        return watcher

    def remove(self, watcher_id: str) -> None:
        watcher = self._watchers.pop(watcher_id, None)
        if watcher is not None:
            watcher.scope.cancel()

    @asynccontextmanager
    async def writing(self, path: str, *, empty: bool) -> AsyncIterator[None]:
        """Write ``path`` through envd's upload in the body: the watchers that cover it
        do not list meanwhile, and report the upload's events after it (see
        :meth:`Watcher.wrote`; its entry is described once if a watcher wants it)."""
        watchers = [w for w in self._watchers.values() if w.covers(path)]
        async with AsyncExitStack() as held:
            for watcher in watchers:
                await held.enter_async_context(watcher.lock)
            yield
            entry = None
            if any(w.include_entry for w in watchers):
                found = await self._fs.entries(path, 0)
                entry = found[0] if found else None
            for watcher in watchers:
                watcher.wrote(path, empty=empty, entry=entry)

    def close(self) -> None:
        for watcher_id in list(self._watchers):
            self.remove(watcher_id)
