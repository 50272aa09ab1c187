"""Test helpers for code built on asyncsandbox, and for backend authors.

* :class:`FakeBackend`: an in-memory backend with scripted latency and failures.
* :func:`check_backend` and :data:`CHECKS`: the conformance suite every backend passes.
* :data:`PROBE` / :func:`probe`: the small program the suite runs inside sandboxes.
"""

from .._util import claim_public
from ._conformance import (
    CHECKS as CHECKS,
    Check as Check,
    Conformance as Conformance,
    LaunchFailure as LaunchFailure,
    check_backend as check_backend,
)
from ._fake import (
    FakeBackend as FakeBackend,
    FakeCommand as FakeCommand,
    FakeProcess as FakeProcess,
    FakeWorld as FakeWorld,
)
from ._probe import PROBE as PROBE, emitted as emitted, probe as probe

__all__ = (
    "FakeBackend",
    "FakeCommand",
    "FakeProcess",
    "FakeWorld",
    "check_backend",
    "CHECKS",
    "Check",
    "Conformance",
    "LaunchFailure",
    "PROBE",
    "probe",
    "emitted",
)

# Show public objects as `asyncsandbox.testing.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
