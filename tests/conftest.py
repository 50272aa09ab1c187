"""Fixtures every test module may use. Helpers shared between modules live in
tests/_support/."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._support import ALICE, Server, docker_test_image, new_process_root, require_docker, serving

# An unprivileged user has no cgroups, so the process backend refuses the default limits
# (memory_mb, pids) of every sandbox: as such a user, the tests run as one who chose
# best-effort limits (warned of, not enforced). The refusal itself is tested where a test
# asks for enforced limits by name (tests/test_process_limits.py).
if os.geteuid() != 0:
    os.environ.setdefault("ASYNCSANDBOX_PROCESS_LIMITS", "best-effort")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# Modules whose tests drive real sandboxes (processes and namespaces, Docker, a server) on
# both loops. The fake backend proves every semantic of the runtime on asyncio and trio in
# the default run (tests/test_session_*.py, tests/test_conformance.py's fake backend), and
# the conformance suite proves each real backend's own on both loops; so these modules'
# other trio runs would repeat their asyncio runs on the same real components, through the
# same anyio code: they are not run (issue 28: "where the fake backend proves a semantic on
# asyncio and trio, real-backend tests need not run twice"). The trio runs kept are in the
# slow suite (`uv run pytest -m slow`, run once in CI): the conformance suite's (each
# backend's `test_conformance*`, wherever it is) and the code interpreter's, which the fake
# backend cannot run (its interrupts and cancellations are the loop's). By module name, and
# every module whose name starts so (a module split by subject keeps its family's name:
# test_remote_files.py is test_remote's), or by module::class.
REAL_TRIO_RUNS = (
    "test_conformance",  # but its fake backend's trio runs stay in the default run
    "test_e2b_backend",
    "test_gvisor",
    "test_hostile_programs",
    "test_inspect",
    "test_interpreter",
    "test_judge_integrity",
    "test_pydantic_ai::TestProcessBackend",  # pydantic-ai's suite (its error tests stay)
    "test_remote",
)
TRIO_RUNS_KEPT = ("test_conformance", "test_interpreter")  # as module or test names


def _real_trio_run(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    cls = getattr(item, "cls", None)
    return (
        callspec is not None
        and callspec.params.get("anyio_backend") == "trio"
        and f"{item.path.stem}::{cls.__name__ if cls else ''}".startswith(REAL_TRIO_RUNS)
        and "fake" not in callspec.id.split("-")
    )


def _kept(item: pytest.Item) -> bool:
    name = getattr(item, "originalname", item.name)
    return item.path.stem.startswith(TRIO_RUNS_KEPT) or name.startswith(TRIO_RUNS_KEPT)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real_trio = [item for item in items if _real_trio_run(item)]
    repeated = {item for item in real_trio if not _kept(item)}
    if repeated:
        config.hook.pytest_deselected(items=[item for item in items if item in repeated])
        items[:] = [item for item in items if item not in repeated]
    for item in real_trio:
        if item not in repeated:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def process_root() -> Iterator[Path]:
    """A private sandbox root for one test (pytest's tmp_path is not reachable by the
    unprivileged sandbox user, so it lives next to the default root)."""
    root = new_process_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def module_process_root() -> Iterator[Path]:
    """A private sandbox root shared by one test module's tests (for class- and
    module-scoped sandboxes and servers)."""
    root = new_process_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def docker_engine() -> None:
    """Skip without a Docker engine (fail with ``ASYNCSANDBOX_REQUIRE_DOCKER=1``)."""
    require_docker()


# -- E2B's API on a real server (tests/test_e2b_api.py, tests/test_e2b_interpreter.py) ------


@pytest.fixture(
    scope="module",
    params=["process", pytest.param("docker", marks=pytest.mark.docker)],
)
def e2b_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A real ``asyncsandbox serve``, one per module, on each backend it serves E2B's API
    on (Docker: skipped without an engine, like ``docker_engine``)."""
    directory = tmp_path_factory.mktemp("e2b") / "main"
    if request.param == "docker":
        require_docker()
        started = Server(
            directory,
            "--backend-option",
            f"default_image={docker_test_image()}",
            backend="docker",
        )
        try:
            yield started
        finally:
            started.stop()
        return
    with serving(directory) as started:
        yield started


@pytest.fixture
def e2b_env(e2b_server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """E2B's SDKs pointed at :func:`e2b_server` as a user points them (tenant alice)."""
    monkeypatch.setenv("E2B_API_URL", e2b_server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", e2b_server.url)
    monkeypatch.setenv("E2B_API_KEY", ALICE)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    return e2b_server.url
