"""Validation, on the fake backend: bad input is refused before anything happens (exec's
and the file calls' arguments, sandbox options and network modes, and backends unknown,
not installed, or not for this async library). Every async test runs on asyncio and
trio."""

from __future__ import annotations

import math
from typing import Any

import pytest

import asyncsandbox
from asyncsandbox import BackendNotFound, InvalidArgument, SandboxDefaults, Session
from asyncsandbox.testing import FakeBackend

from ._session_support import session


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"argv": "ls -la"}, "sh', '-c'"),
        ({"argv": []}, "non-empty"),
        ({"argv": ["echo", 3]}, "argv\\[1\\] must be a str"),
        ({"argv": ["echo", "a\x00b"]}, "NUL"),
        ({"timeout": -1}, ">= 0"),
        ({"timeout": math.nan}, "NaN"),
        ({"timeout": math.inf}, "finite"),
        ({"timeout": True}, "number of seconds"),
        ({"env": {"A": None}}, "must be a str"),
        ({"env": ["A=1"]}, "mapping"),
        ({"cwd": "a\x00"}, "NUL"),
        ({"stdin": 5}, "stdin must be"),
        ({"check": "yes"}, "check must be a bool"),
        ({"max_output_bytes": 0}, ">= 1"),
    ],
)
async def test_bad_exec_arguments_are_refused_before_starting(
    kwargs: dict[str, Any], message: str
) -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        sb = s.sandbox()
        args = {"argv": ["true"], **kwargs}
        with pytest.raises(InvalidArgument, match=message):
            await sb.exec(**args)
        assert sb.state == "new"
        # session.run too: it would make a sandbox (a container, a pod) only to refuse.
        with pytest.raises(InvalidArgument, match=message):
            await s.run(**args)
        assert fake.world.created == 0


async def test_bad_file_arguments() -> None:
    async with session() as s, s.sandbox() as sb:
        with pytest.raises(InvalidArgument):
            await sb.write_file("x", 123)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="permission number"):
            await sb.write_file("x", b"", mode=0o100000)
        with pytest.raises(InvalidArgument, match="longer than"):
            await sb.read_file("a" * 5000)
        with pytest.raises(InvalidArgument, match="does not exist"):
            await sb.upload("/no/such/local/path", "dest")
        with pytest.raises(InvalidArgument, match="max_bytes"):
            await sb.read_file("x", max_bytes=0)


async def test_unknown_sandbox_option_and_network() -> None:
    async with session() as s:
        with pytest.raises(InvalidArgument, match="unknown sandbox option"):
            s.sandbox(imgae="x")
    fake = FakeBackend()
    fake._caps = fake._caps.__class__(isolation="x", network_modes=frozenset({"none"}))
    async with session(fake) as s:
        with pytest.raises(InvalidArgument, match="network='host'"):
            await s.sandbox(network="host").start()


def test_unknown_and_missing_backends_say_what_to_do() -> None:
    with pytest.raises(BackendNotFound, match=r"unknown backend 'nope'.*process"):
        asyncsandbox._registry.resolve_backend("nope")
    with pytest.raises(InvalidArgument):
        Session(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="Limits"):
        Session(limits=SandboxDefaults())  # type: ignore[arg-type]


async def test_backend_that_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A built-in name whose distribution is missing says what to install."""
    builtin = dict(asyncsandbox._registry._BUILTIN)
    builtin["ghost"] = ("asyncsandbox_ghost:GhostBackend", "asyncsandbox[ghost]")
    monkeypatch.setattr(asyncsandbox._registry, "_BUILTIN", builtin)
    with pytest.raises(BackendNotFound, match=r"pip install 'asyncsandbox\[ghost\]'"):
        async with Session("ghost"):
            pass


async def test_backend_that_does_not_support_this_async_library(anyio_backend: str) -> None:
    fake = FakeBackend(async_libraries=frozenset({"curio"}))
    with pytest.raises(InvalidArgument, match=f"does not run on {anyio_backend}"):
        async with session(fake):
            pass
