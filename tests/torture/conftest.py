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
    gvisor_unavailable,
    new_process_root,
    require_docker,
    require_runsc_runtime,
)
from . import _host
from ._report import REPORT, SEED_ENV

HERE = Path(__file__).resolve().parent
TARGETS = ("process", "docker", "remote")
GVISOR_TARGETS = ("process-gvisor", "docker-runsc")
"""The process backend's gvisor mechanism and Docker with runsc: the hostile programs run
on them too (CI: issue 30); the rest of the torture suite runs on ``TARGETS``."""
TARGETS_OR_GVISOR = (
    *((name, "asyncio") for name in (*TARGETS, *GVISOR_TARGETS)),
    ("process-gvisor", "trio"),
)
"""``target_or_gvisor``'s runs (target, event loop): every target on asyncio, and the
gvisor mechanism on trio too (issue 30 asks for gVisor on both loops). Docker with runsc
stays on asyncio: the Docker backend refuses trio (aiodocker is asyncio-only)."""


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; kept here so that the marker exists whenever this
    # directory is collected.
    if not any(m.startswith("torture:") for m in config.getini("markers")):
        config.addinivalue_line("markers", "torture: the reliability and security torture suite")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target_or_gvisor" in metafunc.fixturenames:
        # The target and the loop together (a fixture's params would make every pair).
        metafunc.parametrize(
            ("target_or_gvisor_name", "anyio_backend"),
            TARGETS_OR_GVISOR,
            ids=[
                name if loop == "asyncio" else f"{name}-{loop}" for name, loop in TARGETS_OR_GVISOR
            ],
        )


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
    backend's trio path is tortured by the cancellation storm and the conformance suite,
    and the gvisor mechanism's by the hostile programs: :data:`TARGETS_OR_GVISOR`)."""
    return "asyncio"


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get(SEED_ENV) or random.randrange(2**32))
    REPORT.seeds.add(seed)
    return random.Random(seed)


@pytest.fixture
def canary() -> Iterator[Path]:
    """A directory on the host, outside every sandbox and every sandbox's view (/root, or
    an unprivileged user's home, is hidden from the process backend, absent in
    containers), holding a secret file. Tests assert that its snapshot never changes and
    that the secret never shows up."""
    home = Path("/root") if os.geteuid() == 0 else Path.home()
    directory = home / f"asyncsandbox-canary-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o700)
    (directory / "canary").write_text(CANARY_SECRET)
    before = _host.snapshot(directory)
    yield directory
    after = _host.snapshot(directory)
    shutil.rmtree(directory, ignore_errors=True)
    assert after == before, "a file on the host outside the sandbox was touched"


# -- targets ------------------------------------------------------------------------------


def process_target(tag: str, *, gvisor: bool = False) -> Iterator[Target]:
    if gvisor and (reason := gvisor_unavailable()):
        pytest.skip(reason)
    options: dict[str, Any] = {"isolation": "gvisor", "fast_path": True} if gvisor else {}
    root = new_process_root("torture-")

    def leftovers() -> list[str]:
        if not root.exists():
            return []
        return [str(p) for p in root.iterdir() if not p.name.startswith(".")]

    yield Target(
        "process-gvisor" if gvisor else "process",
        tag,
        lambda: ProcessBackend(root=root, **options),
        leftovers,
        {"root": root, "options": options},
        gvisor=gvisor,
    )
    shutil.rmtree(root, ignore_errors=True)


def docker_target(tag: str, *, runsc: bool = False) -> Iterator[Target]:
    if runsc:
        require_runsc_runtime()
    else:
        require_docker()
    label = f"asyncsandbox.tag.{tag}"
    options = {"runtime": "runsc"} if runsc else {}
    yield Target(
        "docker-runsc" if runsc else "docker",
        tag,
        lambda: docker_backend(**options),
        lambda: _host.containers(label),
        gvisor=runsc,
    )
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
    if name in ("process", "process-gvisor"):
        yield from process_target(tag, gvisor=name == "process-gvisor")
    elif name in ("docker", "docker-runsc"):
        yield from docker_target(tag, runsc=name == "docker-runsc")
    else:
        yield from remote_target(tag, request.getfixturevalue("remote_server"))


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """Every backend: process, docker (skipped without an engine), remote (loopback)."""
    yield from make_target(str(request.param), request)


@pytest.fixture
def target_or_gvisor(
    target_or_gvisor_name: str, request: pytest.FixtureRequest
) -> Iterator[Target]:
    """``target``, and gVisor: the process backend's gvisor mechanism (on asyncio and
    trio), Docker with runsc (each skipped where it does not run); see
    :data:`TARGETS_OR_GVISOR`."""
    yield from make_target(target_or_gvisor_name, request)


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
