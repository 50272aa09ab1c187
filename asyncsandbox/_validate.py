"""Argument checks shared by the public API. Each raises InvalidArgument naming the argument."""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import InvalidArgument

MAX_TAGS = 64
MAX_TAG_LENGTH = 128
MAX_PATH_LENGTH = 4096


def seconds(name: str, value: object, *, allow_none: bool = True) -> float | None:
    """A duration in seconds: a finite number >= 0, or None for 'no limit'."""
    if value is None:
        if allow_none:
            return None
        raise InvalidArgument(f"{name} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name} must be a number of seconds or None, not {value!r}")
    if math.isnan(value) or value < 0:
        raise InvalidArgument(f"{name} must be >= 0 and not NaN, got {value!r}")
    if math.isinf(value):
        raise InvalidArgument(f"{name} must be finite; use None for no limit")
    return float(value)


def positive_int(name: str, value: object) -> int:
    """A count >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be an integer >= 1, got {value!r}")
    return value


def optional_positive_int(name: str, value: object) -> int | None:
    """A count >= 1, or None."""
    return None if value is None else positive_int(name, value)


def absolute_path(name: str, value: object) -> str:
    """An absolute sandbox path, normalised."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidArgument(f"{name} must be an absolute path, got {value!r}")
    return sandbox_path(name, value, workdir="/")


def optional_text(name: str, value: object) -> str | None:
    """A non-empty string without NUL bytes, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must be a non-empty str or None, got {value!r}")
    return no_nul(name, value)


def no_nul(name: str, value: str) -> str:
    if "\x00" in value:
        raise InvalidArgument(f"{name} must not contain NUL bytes: {value!r}")
    return value


def argv(value: object) -> tuple[str, ...]:
    """A command as a non-empty sequence of strings (never a bare string)."""
    if isinstance(value, str | bytes):
        raise InvalidArgument(
            "argv must be a sequence of strings, not a single string; "
            f"for a shell command use ['sh', '-c', {value!r}]"
        )
    if not isinstance(value, Sequence) or not value:
        raise InvalidArgument(f"argv must be a non-empty sequence of strings, got {value!r}")
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise InvalidArgument(f"argv[{i}] must be a str, got {type(arg).__name__}: {arg!r}")
        no_nul(f"argv[{i}]", arg)
    return tuple(value)


def env(name: str, value: object) -> dict[str, str]:
    """Environment variables: str keys without '=' or NUL, str values without NUL."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name} must be a mapping of str to str, got {value!r}")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise InvalidArgument(f"{name}: invalid variable name {key!r}")
        if not isinstance(val, str):
            raise InvalidArgument(f"{name}[{key!r}] must be a str, got {type(val).__name__}")
        no_nul(f"{name}[{key!r}]", val)
        out[key] = val
    return out


def tags(value: object) -> tuple[str, ...]:
    """Tags: a sequence of short printable strings (never a bare string)."""
    if isinstance(value, str | bytes):
        raise InvalidArgument(f"tags must be a sequence of strings, not a single string: {value!r}")
    if not isinstance(value, Sequence | set | frozenset):
        raise InvalidArgument(f"tags must be a sequence of strings, got {value!r}")
    out: dict[str, None] = {}  # ordered and O(1) membership: a huge tag set fails fast
    for tag in value:
        if not isinstance(tag, str) or not tag:
            raise InvalidArgument(f"each tag must be a non-empty str, got {tag!r}")
        if len(tag) > MAX_TAG_LENGTH:
            raise InvalidArgument(f"tag longer than {MAX_TAG_LENGTH} characters: {tag[:40]!r}...")
        if not tag.isprintable() or any(c in tag for c in "\n\r\t\x00,="):
            raise InvalidArgument(f"tag has a forbidden character (control, ',' or '='): {tag!r}")
        out[tag] = None
        if len(out) > MAX_TAGS:
            raise InvalidArgument(f"at most {MAX_TAGS} tags per sandbox, got {len(value)}")
    return tuple(out)


def sandbox_path(name: str, value: object, *, workdir: str) -> str:
    """A path inside the sandbox, made absolute against ``workdir`` and normalised."""
    if isinstance(value, bytes) or not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str path inside the sandbox, got {value!r}")
    if not value:
        raise InvalidArgument(f"{name} must not be empty")
    no_nul(name, value)
    if len(value) > MAX_PATH_LENGTH:
        raise InvalidArgument(f"{name} is longer than {MAX_PATH_LENGTH} characters")
    path = posixpath.normpath(posixpath.join(workdir, value))
    # normpath keeps a leading '//' (POSIX allows it to mean something else); we don't.
    return "/" + path.lstrip("/")


def permission_mode(name: str, value: object) -> int:
    """File permission bits, such as 0o644."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o7777:
        raise InvalidArgument(f"{name} must be a permission number such as 0o644, got {value!r}")
    return value


def identifier(name: str, value: object) -> str:
    """A non-empty printable id."""
    if not isinstance(value, str) or not value or not value.isprintable():
        raise InvalidArgument(f"invalid {name} {value!r}")
    return value


def stdin(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidArgument(f"stdin must be bytes, str or None, got {type(value).__name__}")


def choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise InvalidArgument(
            f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
        )
    return str(value)
