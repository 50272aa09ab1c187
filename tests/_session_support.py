"""What the runtime's test modules on the fake backend (tests/test_session_*.py) share:
their session, on a new fake backend unless given one, and without the sweep a session
runs when it starts (the test of that sweep opens its own)."""

from __future__ import annotations

from typing import Any

from asyncsandbox import Session
from asyncsandbox.testing import FakeBackend


def session(backend: FakeBackend | None = None, **kwargs: Any) -> Session:
    kwargs.setdefault("sweep", False)
    return Session(backend or FakeBackend(), **kwargs)
