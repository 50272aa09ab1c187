"""Every distribution is packaged completely, and works installed from its wheel alone.

The metadata checks read each ``pyproject.toml``. The slow tests build every distribution
(``uv build --all-packages``: wheels and sdists), look inside the wheels for what they need
at run time, install the wheels, and only them, into a fresh virtual environment (their
dependencies come from the lock's versions), and run what a user runs, from a directory
outside the repository: the demo, ``asyncsandbox backends``, a Docker exec, ``asyncsandbox
serve`` with the remote client, and judgements.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import asyncsandbox

from ._support import docker_test_image

ROOT = Path(__file__).resolve().parent.parent
# The workspace's members (pyproject.toml's [tool.uv.workspace]) and the root.
DISTRIBUTIONS = [
    ROOT,
    *sorted(p.parent for p in ROOT.glob("backends/*/pyproject.toml")),
    *sorted(p.parent for p in ROOT.glob("integrations/*/pyproject.toml")),
]
SHARED_URLS = ("Homepage", "Source", "Issues", "Changelog")


def _project(directory: Path) -> dict[str, object]:
    with (directory / "pyproject.toml").open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
    return project


def _name(directory: Path) -> str:
    return str(_project(directory)["name"])


def test_every_workspace_member_is_a_distribution_checked_here() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        members = tomllib.load(file)["tool"]["uv"]["workspace"]["members"]
    listed = {p.parent for pattern in members for p in ROOT.glob(f"{pattern}/pyproject.toml")}
    assert listed == set(DISTRIBUTIONS[1:])


@pytest.mark.parametrize("directory", DISTRIBUTIONS, ids=_name)
def test_metadata_is_complete(directory: Path) -> None:
    project = _project(directory)
    for key in ("name", "description", "readme", "requires-python", "license", "authors"):
        assert project.get(key), key
    readme = directory / str(project["readme"])
    assert len(readme.read_text().splitlines()) >= 10, f"{readme}: too short to describe it"
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (directory / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert project["requires-python"] == ">=3.11"
    classifiers = project["classifiers"]
    assert isinstance(classifiers, list)
    for needed in (
        "Programming Language :: Python :: 3.11",
        "Operating System :: POSIX :: Linux",
        "Typing :: Typed",
    ):
        assert needed in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert project.get("keywords")
    urls = project["urls"]
    assert isinstance(urls, dict)
    assert set(urls) >= {*SHARED_URLS, "Documentation"}
    core_urls = _project(ROOT)["urls"]
    assert isinstance(core_urls, dict)
    assert {k: urls[k] for k in SHARED_URLS} == {k: core_urls[k] for k in SHARED_URLS}


@pytest.mark.parametrize("directory", DISTRIBUTIONS, ids=_name)
def test_distributions_are_released_together(directory: Path) -> None:
    """One version for all (the core's, in asyncsandbox/_version.py), and every requirement
    of one of ours pins it."""
    project = _project(directory)
    if directory == ROOT:
        assert project["dynamic"] == ["version"]
    else:
        assert project["version"] == asyncsandbox.__version__
    requirements = list(project.get("dependencies", []))  # type: ignore[call-overload]
    for extra in dict(project.get("optional-dependencies", {})).values():  # type: ignore[call-overload]
        requirements += extra
    ours = [r for r in requirements if re.match(r"asyncsandbox(-[a-z-]+)?(\[|=|$)", r)]
    for requirement in ours:
        assert requirement.endswith(f"=={asyncsandbox.__version__}"), requirement


@pytest.mark.parametrize("directory", DISTRIBUTIONS, ids=_name)
def test_packages_are_typed(directory: Path) -> None:
    with (directory / "pyproject.toml").open("rb") as file:
        packages = tomllib.load(file)["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for package in packages:
        assert (directory / package / "py.typed").is_file(), package


# -- built and installed -------------------------------------------------------------------

# What each wheel must carry beyond its Python modules' imports: files shipped into
# sandboxes or run by path, and the entry points that make a plugin found.
NEEDED_FILES = {
    "asyncsandbox": [
        "asyncsandbox/py.typed",
        "asyncsandbox/_process/_launcher.py",  # the native launcher, run as a program
        "asyncsandbox/_process/_resident.py",  # the resident executor, run with it
        "asyncsandbox/_process/_executor.py",
        "asyncsandbox/_judge/_runner.py",  # the judge's runner, shipped into sandboxes
        "asyncsandbox/_barrier.py",  # the exit barrier, shipped with it
        "asyncsandbox/_judge/_guard.py",  # its guard, likewise
        "asyncsandbox/_judge/_program.py",  # what each case's fork becomes, likewise
        "asyncsandbox/_interpreter/_runner.py",  # the code interpreter's, shipped likewise
        "asyncsandbox/_interpreter/_common.py",  # its modules, with it
        "asyncsandbox/_interpreter/_charts.py",
        "asyncsandbox/_interpreter/_hooks.py",
        "asyncsandbox/_interpreter/_kernel.py",
    ],
    "asyncsandbox_docker": [
        "asyncsandbox_docker/py.typed",
        "asyncsandbox_docker/_agent.py",  # the shepherd of every command in a container
        "asyncsandbox_docker/_agent_executor.py",  # the executor inside each container
    ],
}
NEEDED_ENTRY_POINTS = {
    "asyncsandbox": ["[console_scripts]\nasyncsandbox = asyncsandbox._cli:main"],
    "asyncsandbox_docker": ["[asyncsandbox.backends]\ndocker = asyncsandbox_docker:DockerBackend"],
    "asyncsandbox_e2b": ["[asyncsandbox.backends]\ne2b = asyncsandbox_e2b:E2bBackend"],
    "asyncsandbox_remote": [
        "[asyncsandbox.backends]\nremote = asyncsandbox_remote:RemoteBackend",
        "[asyncsandbox.commands]\nserve = asyncsandbox_remote.server:main",
    ],
    "asyncsandbox_ray": ["[asyncsandbox.backends]\nray = asyncsandbox_ray:RayBackend"],
    "asyncsandbox_inspect": ["[inspect_ai]\nasyncsandbox = asyncsandbox_inspect"],
    "asyncsandbox_mcp": ["[asyncsandbox.commands]\nmcp = asyncsandbox_mcp:main"],
}


@dataclass
class Installed:
    """A fresh virtual environment holding the built wheels and their dependencies."""

    venv: Path
    wheels: list[Path]
    workdir: Path  # outside the repository

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT")
        }
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **extra}

    def run(
        self, *argv: str, root: Path, timeout: float = 180, **env: str
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv,
            cwd=self.workdir,
            env=self.env(ASYNCSANDBOX_PROCESS_ROOT=str(root), **env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def cli(self) -> str:
        return str(self.venv / "bin" / "asyncsandbox")


def _uv(*args: str, cwd: Path) -> str:
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build and install (pip install uv)"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        [uv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("packaging")
    dist = base / "dist"
    _uv("build", "--all-packages", "--out-dir", str(dist), cwd=ROOT)
    wheels = sorted(dist.glob("*.whl"))
    # Pin the dependencies to the lock's versions (what the tests ran with, and what uv's
    # cache holds); the distributions themselves come from the wheels only.
    constraints = base / "constraints.txt"
    _uv(
        "export",
        "--frozen",
        "--all-packages",
        "--all-extras",
        "--no-dev",
        "--no-hashes",
        "--no-emit-workspace",
        "--output-file",
        str(constraints),
        cwd=ROOT,
    )
    venv = base / "venv"
    _uv("venv", "--python", sys.executable, str(venv), cwd=base)
    _uv(
        "pip",
        "install",
        "--python",
        str(venv / "bin" / "python"),
        "--constraints",
        str(constraints),
        *map(str, wheels),
        cwd=base,
    )
    workdir = base / "elsewhere"
    workdir.mkdir()
    return Installed(venv=venv, wheels=wheels, workdir=workdir)


@pytest.mark.slow
def test_every_distribution_builds_a_wheel_and_an_sdist(installed: Installed) -> None:
    names = {_name(d).replace("-", "_") for d in DISTRIBUTIONS}
    built = {w.name.split("-")[0] for w in installed.wheels}
    assert built == names
    sdists = {s.name.rsplit("-", 1)[0] for s in installed.wheels[0].parent.glob("*.tar.gz")}
    assert sdists == names


@pytest.mark.slow
def test_wheels_carry_what_they_need(installed: Installed) -> None:
    for wheel in installed.wheels:
        name = wheel.name.split("-")[0]
        with zipfile.ZipFile(wheel) as archive:
            files = set(archive.namelist())
            info = f"{wheel.name.split('-py3')[0]}.dist-info"
            metadata = archive.read(f"{info}/METADATA").decode()
            entry_points = (
                archive.read(f"{info}/entry_points.txt").decode()
                if f"{info}/entry_points.txt" in files
                else ""
            )
        for needed in NEEDED_FILES.get(name, [f"{name}/py.typed"]):
            assert needed in files, f"{wheel.name} lacks {needed}"
        assert f"{info}/licenses/LICENSE" in files
        for group in NEEDED_ENTRY_POINTS.get(name, []):
            assert group in entry_points, f"{wheel.name}: {group!r} not in\n{entry_points}"
        assert "License-Expression: MIT" in metadata
        assert "Classifier: Programming Language :: Python :: 3.11" in metadata
        assert "Project-URL: Source, " in metadata
        assert "Description-Content-Type: text/markdown" in metadata
        # No tests, benchmarks or caches in a wheel.
        assert not [f for f in files if "__pycache__" in f or f.startswith(("tests/", "bench/"))]


@pytest.mark.slow
def test_installed_from_the_wheels_alone(installed: Installed, process_root: Path) -> None:
    """What runs is the installed copy, not the source tree; the version is the built one."""
    done = installed.run(
        installed.python,
        "-c",
        "import json, asyncsandbox, asyncsandbox_docker, asyncsandbox_remote, asyncsandbox_ray,"
        " asyncsandbox_inspect as i; print(json.dumps([asyncsandbox.__file__, i.__file__]))",
        root=process_root,
    )
    for path in json.loads(done.stdout):
        assert Path(path).is_relative_to(installed.venv), path
        assert not Path(path).is_relative_to(ROOT), path
    version = installed.run(installed.cli, "--version", root=process_root).stdout
    assert version.splitlines()[0] == f"asyncsandbox {asyncsandbox.__version__}"
    for plugin in (
        "asyncsandbox-ray",
        "asyncsandbox-e2b",
        "asyncsandbox-mcp",
        "asyncsandbox-pydantic-ai",
    ):
        assert f"{plugin} {asyncsandbox.__version__}" in version.splitlines()


@pytest.mark.slow
def test_installed_demo_and_backends(installed: Installed, process_root: Path) -> None:
    demo = installed.run(installed.cli, "demo", root=process_root).stdout
    assert "Problem 5 (infinite-loop): reward=0.0 [TIMEOUT] OK" in demo
    assert "Total reward: 3.0/6" in demo
    backends = installed.run(installed.cli, "backends", root=process_root).stdout
    for name in ("process", "docker", "remote", "ray", "e2b"):
        assert re.search(rf"^\s*{name}\b", backends, flags=re.MULTILINE), backends


# A command, a judgement and the code interpreter: what ships into sandboxes, exercised.
JUDGE = """
import json, sys

import anyio

import asyncsandbox
from asyncsandbox.judge import Program, TestCase


async def main(backend: str, options: str) -> None:
    async with asyncsandbox.Session(backend, backend_options=json.loads(options)) as session:
        ran = await session.run(["python3", "-c", "print(6 * 7)"], timeout=60)
        judged = await session.judge(
            Program(source="a, b = map(int, input().split())\\nprint(a + b)\\n", language="python"),
            [TestCase(stdin="1 2\\n", expected="3\\n"), TestCase(stdin="2 2\\n", expected="5\\n")],
            time_limit=10,
        )
        async with session.sandbox() as sandbox:
            await sandbox.run_code("x = 6")
            interpreted = await sandbox.run_code("x * 7")
    print(json.dumps({
        "stdout": ran.stdout_text,
        "verdicts": [case.verdict.value for case in judged.cases],
        "score": judged.score,
        "interpreted": interpreted.text,
    }))


anyio.run(main, *sys.argv[1:])
"""


def _judge(installed: Installed, backend: str, options: dict[str, str], root: Path) -> None:
    script = installed.workdir / "judge.py"
    script.write_text(JUDGE)
    done = installed.run(installed.python, str(script), backend, json.dumps(options), root=root)
    assert json.loads(done.stdout) == {
        "stdout": "42\n",
        "verdicts": ["accepted", "wrong_answer"],
        "score": 0.5,
        "interpreted": "42",
    }


@pytest.mark.slow
def test_installed_judge_on_the_process_backend(installed: Installed, process_root: Path) -> None:
    _judge(installed, "process", {}, process_root)


@pytest.mark.slow
def test_installed_docker_exec(
    installed: Installed, process_root: Path, docker_engine: None
) -> None:
    done = installed.run(
        installed.cli,
        "exec",
        "--backend",
        "docker",
        "--image",
        docker_test_image(),
        "--timeout",
        "60",
        "--",
        "python3",
        "-c",
        "print(6 * 7)",
        root=process_root,
    )
    assert done.stdout == "42\n"


@pytest.fixture
def installed_server(installed: Installed, process_root: Path) -> Iterator[tuple[str, str]]:
    """``asyncsandbox serve`` of the installed wheels on a free loopback port: (url, key)."""
    key = "wheel-" + os.urandom(16).hex()
    log = installed.workdir / "serve.log"
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            [installed.cli, "serve", "--listen", "127.0.0.1:0", "--print-url"],
            cwd=installed.workdir,
            env=installed.env(
                ASYNCSANDBOX_PROCESS_ROOT=str(process_root),
                ASYNCSANDBOX_API_KEYS=f"wheels:{key}",
            ),
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        assert server.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(server.stdout, selectors.EVENT_READ)
            ready = selector.select(120)
        url = server.stdout.readline().decode().strip() if ready else ""
        assert url.startswith("http://127.0.0.1:"), log.read_text()
        yield url, key
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            assert server.wait(60) == 0, log.read_text()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            if server.stdout is not None:
                server.stdout.close()


@pytest.mark.slow
def test_installed_server_and_remote_client(
    installed: Installed, installed_server: tuple[str, str], process_root: Path
) -> None:
    """The remote client of the wheels runs a command and a judgement (judged on the
    server, in one request) on the server of the wheels."""
    url, key = installed_server
    _judge(installed, "remote", {"base_url": url, "api_key": key}, process_root)
