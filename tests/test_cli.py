"""The asyncsandbox command line, run as a user would run it."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from asyncsandbox import Resources
from asyncsandbox.abc import SandboxHandle, SandboxSpec
from asyncsandbox.demo import run_demo
from asyncsandbox.testing import FakeBackend, FakeProcess


def cli(
    *args: str,
    root: Path,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    env = without_ray({**(env or os.environ), "ASYNCSANDBOX_PROCESS_ROOT": str(root)})
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "asyncsandbox", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )


def without_ray(env: dict[str, str]) -> dict[str, str]:
    """``env`` with no Ray cluster to join: `backends` enters the Ray backend, which joins
    the machine's running cluster, if any. CI's slow suite runs one meanwhile: joining it
    from a directory of every distribution uploaded the directory to it, and joining it
    while it was busy or stopping kept `backends` waiting past the test's 120 s."""
    env = {key: value for key, value in env.items() if key != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="no-ray-")
    return env


def test_version_names_the_core_and_each_installed_plugin(process_root: Path) -> None:
    from importlib.metadata import version

    import asyncsandbox

    done = cli("--version", root=process_root)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0] == f"asyncsandbox {asyncsandbox.__version__}"
    assert asyncsandbox.__version__ == version("asyncsandbox")  # the built metadata agrees
    assert f"asyncsandbox-docker {version('asyncsandbox-docker')}" in lines[1:]
    assert f"asyncsandbox-remote {version('asyncsandbox-remote')}" in lines[1:]


def test_demo_runs_the_main_job(process_root: Path) -> None:
    # With 10 s per program, not the default 3 s: this runs beside the other tests, and on
    # a loaded 2-core machine CI saw python3 take over 3 s to report a syntax error. The
    # default itself is CI's (the README's first command, run before the suites).
    done = cli("demo", "--timeout", "10", root=process_root)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "Problem 3 (syntax-error): reward=0.0 [FAIL] OK" in out
    assert "Problem 5 (infinite-loop): reward=0.0 [TIMEOUT] OK" in out
    assert "Total reward: 3.0/6" in out
    assert "6 started, 6 removed" in out
    # Results are printed as they complete: the program killed at its 10 s timeout last, the
    # others (a few seconds at most) before it. (Which of those is first depends on how
    # busy the machine is: CI once saw delayed-error's 2.5 s beat a syntax error's.)
    progress = [line for line in out.splitlines() if line.strip().startswith("[")]
    assert len(progress) == 6
    assert "infinite-loop" in progress[-1]


class _NoLimits(FakeBackend):
    """A backend that enforces no limit and was not asked for best-effort ones (the process
    backend of a user without root); it keeps what each sandbox asked for."""

    def __init__(self) -> None:
        super().__init__(commands={"python3": _exit_zero})
        self._caps = msgspec.structs.replace(self._caps, best_effort_limits=False)
        self.asked: list[Resources] = []

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        self.asked.append(spec.resources)
        return await super().create(spec)


async def _exit_zero(process: FakeProcess) -> int:
    return 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_demo_asks_only_for_limits_the_backend_enforces() -> None:
    """As a user without root (no cgroups), the demo ran none of its programs: every
    sandbox asked for the default memory and process limits and was refused. It now asks
    for no limit the backend cannot enforce here, and says so."""
    backend = _NoLimits()
    out = io.StringIO()
    await run_demo(backend, out=out)
    text = out.getvalue()
    assert "cannot enforce memory_mb, pids here" in text, text
    assert "6 started, 6 removed" in text, text
    assert len(backend.asked) == 6
    assert all(r.memory_mb is None and r.pids is None for r in backend.asked)


def test_exec_passes_status_output_and_stdin(process_root: Path) -> None:
    done = cli(
        "exec",
        "--stdin",
        "--",
        "sh",
        "-c",
        "cat; echo err >&2; exit 3",
        root=process_root,
        stdin=b"in\n",
    )
    assert done.returncode == 3
    assert done.stdout == b"in\n"
    # (Without root, the warning that best-effort limits are not enforced comes first.)
    assert done.stderr == b"err\n" or (os.geteuid() != 0 and done.stderr.endswith(b"\nerr\n"))
    timed = cli("exec", "--timeout", "0.5", "--", "sleep", "30", root=process_root)
    assert timed.returncode == 137
    assert b"timed out" in timed.stderr


def test_ls_rm_and_gc(process_root: Path) -> None:
    script = (
        "import os, anyio, asyncsandbox\n"
        "async def main():\n"
        "    async with asyncsandbox.Session(sweep=False) as s:\n"
        "        for tag in ('cli-a', 'cli-a', 'cli-b'):\n"
        "            await s.sandbox(tags=[tag]).start()\n"
        "        os._exit(0)  # an owner gone without removing them: they are left behind\n"
        "anyio.run(main)\n"
    )
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(process_root)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    listed = json.loads(cli("ls", "--json", root=process_root).stdout)
    assert sorted(tag for info in listed for tag in info["tags"]) == ["cli-a", "cli-a", "cli-b"]
    # Their owner has exited: they are not running, whatever the backend says.
    assert {info["status"] for info in listed} == {"dead"}
    table = cli("ls", root=process_root).stdout.decode()
    assert "running" not in table
    assert table.count("(owner process is gone: `asyncsandbox gc` removes it)") == 3
    assert cli("ls", "--status", "running", root=process_root).stdout == b"no sandboxes\n"
    assert cli("ls", "--tag", "cli-a", root=process_root).stdout.decode().count("cli-a") == 2
    removed = cli("rm", "--tag", "cli-a", root=process_root)
    assert removed.returncode == 0
    assert removed.stdout.decode().count("removed ") == 2
    missing = cli("rm", "p-000000000000", root=process_root)
    assert missing.returncode == 1
    assert b"not found: p-000000000000" in missing.stderr
    refused = cli("rm", root=process_root)
    assert refused.returncode != 0
    # The owner process has exited: gc finds the last one.
    dry = cli("gc", "--dry-run", root=process_root)
    assert b"would remove" in dry.stdout
    assert b"owner process is gone" in dry.stdout
    assert b"removed" in cli("gc", root=process_root).stdout
    assert cli("ls", root=process_root).stdout == b"no sandboxes\n"


def test_errors_are_reported_not_raised(process_root: Path) -> None:
    done = cli("ls", "--backend", "nope", root=process_root)
    assert done.returncode == 2
    assert b"BackendNotFound" in done.stderr
    assert b"Traceback" not in done.stderr


# -- Docker unavailable -----------------------------------------------------------------------
#
# Where aiodocker looks for the daemon when DOCKER_HOST is not set.
DOCKER_SOCKETS = ("/run/docker.sock", "/var/run/docker.sock")


def without_docker(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a user with no Docker configuration (a fresh HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), **extra}


def hide_docker_sockets() -> list[str]:
    """A command prefix that runs its command with every Docker socket of this host hidden
    (bind-mounted over with /dev/null in a private mount namespace), or [] when there is
    none to hide. The shared daemon itself is left alone."""
    present = [path for path in DOCKER_SOCKETS if Path(path).is_socket()]
    if not present:
        return []
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("a Docker socket exists and util-linux `unshare` is missing to hide it")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    mounts = "".join(f"mount --bind /dev/null {path} && " for path in present)
    probe = subprocess.run(
        [unshare, *user, "--mount", "--propagation", "private", "sh", "-c", f"{mounts}true"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot hide the Docker socket in a mount namespace: {probe.stderr!r}")
    script = f'{mounts}exec "$@"'
    return [unshare, *user, "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def assert_docker_unavailable(done: subprocess.CompletedProcess[bytes], *needles: str) -> None:
    output = done.stdout.decode() + done.stderr.decode()
    assert b"Traceback" not in done.stderr, output
    for needle in needles:
        assert needle in output, output


def test_no_docker_socket_is_reported_not_raised(process_root: Path, tmp_path: Path) -> None:
    """No DOCKER_HOST and no socket where the Docker client looks: every entry point that
    opens the Docker backend says Docker is unavailable and why (aiodocker failed an
    assert here)."""
    env = without_docker(tmp_path)
    wrapper = hide_docker_sockets()
    # Without the Ray backend: `backends` would join any Ray cluster running here (found
    # by its processes: CI's slow suite runs one), and did not answer within 120 s.
    listing = python_with(
        site_without(tmp_path), "backends", root=process_root, env=env, wrapper=wrapper
    )
    assert listing.returncode == 0
    assert_docker_unavailable(
        listing, "docker   unavailable: no Docker engine to connect to", "DOCKER_HOST is not set"
    )
    assert "process " in listing.stdout.decode()  # the other backends are still listed
    for command in (["gc"], ["ls"], ["exec", "--", "true"]):
        args = [command[0], "--backend", "docker", *command[1:]]
        done = cli(*args, root=process_root, env=env, wrapper=wrapper)
        assert done.returncode == 2
        assert_docker_unavailable(
            done, "asyncsandbox: BackendUnavailable: no Docker engine to connect to"
        )


def test_an_unreachable_docker_host_is_reported_not_raised(
    process_root: Path, tmp_path: Path
) -> None:
    """DOCKER_HOST names a socket nobody listens on; it wins over a docker context, as it
    does for the docker CLI (aiodocker would read the context first)."""
    env = without_docker(tmp_path, DOCKER_HOST="unix:///nonexistent/docker.sock")
    docker_dir = Path(env["HOME"]) / ".docker"
    docker_dir.mkdir()
    (docker_dir / "config.json").write_text(json.dumps({"currentContext": "elsewhere"}))
    listing = python_with(site_without(tmp_path), "backends", root=process_root, env=env)
    assert listing.returncode == 0
    assert_docker_unavailable(
        listing,
        "docker   unavailable: cannot connect to the Docker daemon",
        "/nonexistent/docker.sock",
        "Start the Docker daemon",
    )
    done = cli("gc", "--backend", "docker", root=process_root, env=env)
    assert done.returncode == 2
    assert_docker_unavailable(done, "BackendUnavailable: cannot connect to the Docker daemon")


def test_serve_reports_an_unavailable_backend(process_root: Path, tmp_path: Path) -> None:
    """``asyncsandbox serve --backend docker`` with no engine: one line saying why, exit 2,
    no URL announced (uvicorn logged a traceback and exited 1 with an exception group)."""
    keys = tmp_path / "keys.txt"
    keys.write_text("alice:" + "k" * 32 + "\n")
    env = without_docker(tmp_path, DOCKER_HOST="unix:///nonexistent/docker.sock")
    done = cli(
        "serve",
        "--backend",
        "docker",
        "--listen",
        "127.0.0.1:0",
        "--print-url",
        "--keys",
        str(keys),
        root=process_root,
        env=env,
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert done.stderr.decode().startswith(
        "asyncsandbox serve: BackendUnavailable: cannot connect to the Docker daemon"
    ), done.stderr.decode()
    assert len(done.stderr.decode().splitlines()) == 1, done.stderr.decode()


# -- commands that plugins add ------------------------------------------------------------------


def site_packages() -> Path:
    """Where this interpreter's distributions are installed (the workspace's venv)."""
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def python_with(
    site: Path,
    *args: str,
    root: Path,
    env: dict[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    """``python -m asyncsandbox ARGS`` seeing only the distributions installed in ``site``
    (``-S``: not this venv's; ``site.addsitedir`` reads the editable installs' .pth files)."""
    bootstrap = (
        "import site, sys; site.addsitedir(sys.argv.pop(1)); "
        "from asyncsandbox._cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = without_ray({**(env or os.environ), "ASYNCSANDBOX_PROCESS_ROOT": str(root)})
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [*wrapper, sys.executable, "-S", "-c", bootstrap, str(site), *args],
        capture_output=True,
        timeout=60,
        env=env,
        cwd=site,
        check=False,
    )


def site_without(tmp_path: Path, *hidden: str) -> Path:
    """A site directory with every distribution of this venv but those named ``hidden``
    (their metadata and their editable install's .pth file left out): an installation
    made without them."""
    site = tmp_path / "site-packages"
    site.mkdir()
    # Never the Ray backend: `backends` would join any Ray cluster running here (CI's slow
    # suite runs one; Ray finds it by its processes) and did not answer within 60 s.
    hidden = (*hidden, "asyncsandbox_ray")
    for entry in site_packages().iterdir():
        if not any(
            entry.name.startswith(h) or entry.name == f"_editable_impl_{h}.pth" for h in hidden
        ):
            (site / entry.name).symlink_to(entry)
    return site


def test_serve_without_the_remote_plugin_says_what_to_install(
    process_root: Path, tmp_path: Path
) -> None:
    """The core never imports the server: ``serve`` comes from the remote distribution's
    entry point; where that distribution is not installed, the command says what to install
    (and ``--help`` still lists it)."""
    site = site_without(tmp_path, "asyncsandbox_remote")
    probe = python_with(site, "backends", root=process_root)
    assert probe.returncode == 0, probe.stderr.decode()  # the core works without the plugin
    done = python_with(site, "serve", "--listen", "127.0.0.1:0", root=process_root)
    assert done.returncode == 2
    assert done.stderr == (
        b"asyncsandbox serve needs the remote backend: pip install 'asyncsandbox[remote]'\n"
    )
    listed = python_with(site, "--help", root=process_root).stdout.decode()
    assert "serve sandboxes over HTTP to remote clients" in listed
    # With the distribution installed (this venv), the same command line reaches the server.
    usage = python_with(site_packages(), "serve", "--help", root=process_root)
    assert usage.returncode == 0, usage.stderr.decode()
    assert usage.stdout.decode().startswith("usage: asyncsandbox serve")


def test_mcp_without_its_plugin_says_what_to_install(process_root: Path, tmp_path: Path) -> None:
    """``asyncsandbox mcp`` comes from the asyncsandbox-mcp distribution's entry point, as
    ``serve`` does from the remote backend's."""
    site = site_without(tmp_path, "asyncsandbox_mcp")
    done = python_with(site, "mcp", root=process_root)
    assert done.returncode == 2
    assert (
        done.stderr == b"asyncsandbox mcp needs the MCP server: pip install 'asyncsandbox[mcp]'\n"
    )
    listed = python_with(site, "--help", root=process_root).stdout.decode()
    assert "an MCP server: a sandbox per MCP session" in listed
    usage = python_with(site_packages(), "mcp", "--help", root=process_root)
    assert usage.returncode == 0, usage.stderr.decode()
    assert usage.stdout.decode().startswith("usage: asyncsandbox mcp")


PLUGIN = """
import json, sys

def main(argv, *, verbosity):
    print(json.dumps({"argv": list(argv), "verbosity": verbosity}))
    return 7

def ls(argv, *, verbosity):
    print("a plugin took a built-in command")
    return 1
"""


def test_a_plugin_adds_a_command(process_root: Path, tmp_path: Path) -> None:
    """A distribution registers a command under the entry-point group
    ``asyncsandbox.commands``: the command line lists it, runs it with the arguments that
    follow its name and the verbosity, and exits with its status. Built-in names stay
    built in."""
    site = site_without(tmp_path, "asyncsandbox_remote")
    (site / "hello_plugin.py").write_text(PLUGIN)
    info = site / "hello_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[asyncsandbox.commands]\nhello = hello_plugin:main\nls = hello_plugin:ls\n"
    )
    done = python_with(site, "-vv", "hello", "one", "--two", "3", root=process_root)
    assert done.returncode == 7, done.stderr.decode()
    assert json.loads(done.stdout) == {"argv": ["one", "--two", "3"], "verbosity": 2}
    listed = python_with(site, "--help", root=process_root).stdout.decode()
    assert "added by hello-plugin" in listed
    builtin = python_with(site, "ls", root=process_root)
    assert builtin.returncode == 0, builtin.stderr.decode()
    assert builtin.stdout == b"no sandboxes\n"


def test_backends_says_whether_gvisor_runs_here(process_root: Path, tmp_path: Path) -> None:
    """The process backend's gvisor mechanism is listed with what it gives, or why it does
    not run here (naming the package to install where runsc is missing)."""
    listing = python_with(site_without(tmp_path), "backends", root=process_root)
    assert listing.returncode == 0, listing.stderr
    line = next(
        (l for l in listing.stdout.decode().splitlines() if l.strip().startswith("gvisor ")),
        None,
    )
    assert line is not None, listing.stdout.decode()
    if shutil.which("runsc") is None:
        expected = ["unavailable", "apt-get install runsc"]
    elif os.geteuid() == 0:
        expected = ["available: gVisor", "user-space kernel"]
    else:
        expected = ["unavailable", "needs root"]
    assert all(text in line for text in expected), line


def test_backends_lists_a_backend_that_does_not_answer_as_unavailable(
    process_root: Path,
) -> None:
    """A backend that cannot say what it can do within `--timeout` (here a Ray cluster
    address where something listens and never answers: ray.init waits for minutes) is
    listed as unavailable, and the others are still listed."""
    pytest.importorskip("asyncsandbox_ray")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host, port = silent.getsockname()
        env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(process_root)}
        env["RAY_ADDRESS"] = f"{host}:{port}"
        listing = subprocess.run(
            [sys.executable, "-m", "asyncsandbox", "backends", "--timeout", "2"],
            capture_output=True,
            timeout=100,
            env=env,
            check=False,
        )
    assert listing.returncode == 0, listing.stderr.decode()
    lines = listing.stdout.decode().splitlines()
    [ray] = [line for line in lines if line.startswith("ray ")]
    assert "unavailable: no answer within 2 s" in ray
    assert any(line.startswith("process ") for line in lines)
