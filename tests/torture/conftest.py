"""Fixtures of the torture suite: one ``target`` per backend, a host canary, the report.

Every test in this directory is marked ``torture`` (``pytest -m torture`` runs only them,
``-m 'not torture'`` skips them). A target is a backend plus a way to see, from the host,
what its sandboxes left behind; each test gets a unique tag so that what it finds is its
own (the Docker daemon is shared).
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncsandbox._process import ProcessBackend
from asyncsandbox.abc import Backend

from .._support import (
    ALICE,
    CANARY_SECRET,
    Server,
    Target,
    docker_backend,
    new_process_root,
    require_docker,
)
from . import _host
from ._report import REPORT, SEED_ENV

HERE = Path(__file__).resolve().parent
TARGETS = ("process", "docker", "remote")


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; kept here so that the marker exists whenever this
    # directory is collected.
    if not any(m.startswith("torture:") for m in config.getini("markers")):
        config.addinivalue_line("markers", "torture: the reliability and security torture suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.torture)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if HERE in Path(str(item.fspath)).parents and (
        report.when == "call" or report.outcome != "passed"
    ):
        wasxfail = getattr(report, "wasxfail", None)
        outcome = "xfailed" if wasxfail is not None else report.outcome
        reason = str(wasxfail or "")
        if not reason and report.outcome != "passed":
            reason = str(report.longrepr)[-300:]
        REPORT.outcome(item.nodeid, outcome, reason)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not REPORT.empty:
        REPORT.write()


# -- basics -----------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    """asyncio unless a test asks for trio too (Docker is asyncio-only; the process
    backend's trio path is tortured by the cancellation storm and the conformance suite)."""
    return "asyncio"


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get(SEED_ENV) or random.randrange(2**32))
    REPORT.seeds.add(seed)
    return random.Random(seed)


@pytest.fixture
def canary() -> Iterator[Path]:
    """A directory on the host, outside every sandbox and every sandbox's view (/root is
    hidden from the process backend, absent in containers), holding a secret file. Tests
    assert that its snapshot never changes and that the secret never shows up."""
    directory = Path("/root") / f"asyncsandbox-canary-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o700)
    (directory / "canary").write_text(CANARY_SECRET)
    before = _host.snapshot(directory)
    yield directory
    after = _host.snapshot(directory)
    shutil.rmtree(directory, ignore_errors=True)
    assert after == before, "a file on the host outside the sandbox was touched"


# -- targets ------------------------------------------------------------------------------


def process_target(tag: str) -> Iterator[Target]:
    root = new_process_root("torture-")

    def leftovers() -> list[str]:
        if not root.exists():
            return []
        return [str(p) for p in root.iterdir() if not p.name.startswith(".")]

    yield Target("process", tag, lambda: ProcessBackend(root=root), leftovers, {"root": root})
    shutil.rmtree(root, ignore_errors=True)


def docker_target(tag: str) -> Iterator[Target]:
    require_docker()
    label = f"asyncsandbox.tag.{tag}"
    yield Target("docker", tag, docker_backend, lambda: _host.containers(label))
    _host.remove_containers(label)


@pytest.fixture(scope="session")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ``asyncsandbox serve`` (process backend) on loopback for the whole run."""
    root = new_process_root("torture-")
    server = Server(tmp_path_factory.mktemp("torture-remote"), root=root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def remote_target(tag: str, server: Any) -> Iterator[Target]:
    def make() -> Backend:
        from asyncsandbox_remote import RemoteBackend

        backend: Backend = RemoteBackend(server.url, ALICE)
        return backend

    yield Target("remote", tag, make, server.sandbox_dirs, {"server": server})


def make_target(name: str, request: pytest.FixtureRequest) -> Iterator[Target]:
    tag = "torture-" + uuid.uuid4().hex[:10]
    if name == "process":
        yield from process_target(tag)
    elif name == "docker":
        yield from docker_target(tag)
    else:
        yield from remote_target(tag, request.getfixturevalue("remote_server"))


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """Every backend: process, docker (skipped without an engine), remote (loopback)."""
    yield from make_target(str(request.param), request)


@pytest.fixture(params=("process", "docker"))
def local_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The backends whose sandboxes we can reach from the host directly."""
    yield from make_target(str(request.param), request)


@pytest.fixture
def process_target_fixture() -> Iterator[Target]:
    yield from process_target("torture-" + uuid.uuid4().hex[:10])


@pytest.fixture
def docker_target_fixture() -> Iterator[Target]:
    yield from docker_target("torture-" + uuid.uuid4().hex[:10])
