"""A root's ``.trash/``: directories being deleted, and scratch directories.

A directory is renamed there before it is deleted (so that it disappears at once, whole),
and a probe works in a scratch directory made there (so that a crash leaves nothing
elsewhere). Every process whose backends share the root finishes the deletions a crash
interrupted when it starts (:func:`sweep`), and only those: whoever works on an entry
holds an exclusive ``flock`` on it from before it is in the trash to the end, so an entry
is free to take only once its owner is gone (the kernel drops a dead process's locks).
A removal in progress elsewhere, or a probe, is never swept from under its owner.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from . import _overlay
from ._layout import rmtree

TRASH = ".trash"


@contextlib.contextmanager
def moved(directory: Path, root: Path) -> Iterator[Path | None]:
    """Move ``directory`` into ``root``'s trash, ours until the block ends; yield where it
    went (``None``: it was not there, or another owner is removing it). The block deletes
    it; if it does not, the next :func:`sweep` after we are gone does."""
    try:
        fd = _locked(directory, wait=False)
    except (FileNotFoundError, BlockingIOError):
        yield None
        return
    try:
        target = root / TRASH / f"{directory.name}-{uuid.uuid4().hex[:6]}"
        try:
            directory.rename(target)
        except FileNotFoundError:  # removed meanwhile by another owner
            yield None
        else:
            yield target
    finally:
        os.close(fd)


@contextlib.contextmanager
def scratch(root: Path, prefix: str) -> Iterator[Path]:
    """A new directory in ``root``'s trash, ours while the block runs, deleted after it
    (or, if it cannot be yet, by a later :func:`sweep`)."""
    while True:
        path = root / TRASH / f"{prefix}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)  # (the trash too, if another owner deleted the root)
        # A sweep may take it before our lock does, and delete it: then, another.
        try:
            fd = _locked(path)
        except FileNotFoundError:
            continue
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield path
    finally:
        try:
            with contextlib.suppress(OSError):
                _delete(path)
        finally:
            os.close(fd)


def sweep(root: Path) -> None:
    """Delete what the trash holds that no live owner works on (a crash interrupted it)."""
    try:
        entries = list((root / TRASH).iterdir())
    except FileNotFoundError:  # another owner deleted the root meanwhile
        return
    for entry in entries:
        try:
            fd = _locked(entry, wait=False)
        except OSError:  # its owner is at work; or it is gone (or not a directory)
            continue
        try:
            with contextlib.suppress(OSError):  # (never delete what is still mounted)
                _delete(entry)
        finally:
            os.close(fd)


def _delete(path: Path) -> None:
    """Delete a tree of the trash, never through a mount (a layer under it is others')."""
    _overlay.unmount_under(path)
    rmtree(path)


def _locked(directory: Path, *, wait: bool = True) -> int:
    """A descriptor of ``directory`` holding its exclusive lock (``wait``: for as long as
    another holds it; else :class:`BlockingIOError`)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd
