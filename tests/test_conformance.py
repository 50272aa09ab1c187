"""The public conformance suite, run against every built-in backend on asyncio and trio."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from asyncsandbox._process import ProcessBackend
from asyncsandbox.abc import Backend
from asyncsandbox.testing import CHECKS, Check, FakeBackend, FakeWorld


def fake() -> Callable[[], Backend]:
    # One world per test, shared by every session of the check (as a daemon would be).
    return functools.partial(FakeBackend, world=FakeWorld())


def process() -> Callable[[], Backend]:
    return ProcessBackend


BACKENDS = {"fake": fake, "process": process}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_conformance(backend: str, check: Check) -> None:
    await check.run(BACKENDS[backend]())
