"""What the SandboxFusion test modules (tests/test_fusion_*.py) share: a REAL
``asyncsandbox serve`` (process backend, on loopback) as a fixture, the real
``sandbox_fusion`` client pointed at it, and the programs they send.

Neither that client nor verl's raw ``requests.post`` can send a header: the API key travels
in the URL (``http://user:KEY@host:port``, sent as HTTP Basic), as :func:`keyed` puts it.

The fixtures are a test module's once it binds them by name (``server = fusion.server``):
pytest looks a fixture up from the test that requests it, so a module binds those its tests
request and those they request in turn (``fusion_dir``, the servers' directory). A
module-scoped one starts once per module that binds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sandbox_fusion as sf
from sandbox_fusion import RunCodeRequest, RunCodeResponse

from ._support import ALICE, Server, eventually, serving

# -- the programs ---------------------------------------------------------------------------

# Each reads a name on stdin and prints a greeting and a sum computed by the program.
OK = {
    "python": "name = input()\nprint(f'hello {name}', sum(range(10)))\n",
    "bash": 'read name\ns=0; for i in $(seq 0 9); do s=$((s+i)); done\necho "hello $name $s"\n',
    "cpp": (
        "#include <iostream>\n#include <string>\nint main() { std::string name; "
        "std::cin >> name; int s = 0; for (int i = 0; i < 10; i++) s += i; "
        'std::cout << "hello " << name << " " << s << std::endl; }\n'
    ),
    "nodejs": (
        "const name = require('fs').readFileSync(0, 'utf8').trim();\n"
        "let s = 0; for (let i = 0; i < 10; i++) s += i;\nconsole.log(`hello ${name} ${s}`);\n"
    ),
    "perl": 'my $n = <STDIN>; chomp $n; my $s = 0; $s += $_ for 0..9; print "hello $n $s\\n";\n',
}
# Each prints something, then fails: an exception, or a non-zero exit.
FAIL = {
    "python": "print('before')\nraise ValueError('boom')\n",
    "bash": "echo before\necho boom >&2\nexit 3\n",
    "cpp": (
        "#include <cstdio>\n#include <cstdlib>\n"
        'int main() { puts("before"); fflush(stdout); fprintf(stderr, "boom\\n"); exit(3); }\n'
    ),
    "nodejs": "console.log('before');\nthrow new Error('boom');\n",
    "perl": 'print "before\\n"; die "boom\\n";\n',
}
FOREVER = {  # each prints a line, then waits for ever without spending CPU
    "python": "import time\nprint('start', flush=True)\nwhile True:\n    time.sleep(60)\n",
    "bash": "echo start\nwhile true; do sleep 60; done\n",
    "cpp": (
        "#include <cstdio>\n#include <unistd.h>\n"
        'int main() { puts("start"); fflush(stdout); for (;;) pause(); }\n'
    ),
    "nodejs": "console.log('start');\nsetInterval(() => {}, 60000);\n",
    "perl": '$| = 1; print "start\\n"; sleep 60 while 1;\n',
}


# -- the server ---------------------------------------------------------------------------


# A real server, clients on asyncio: the remote client on trio is proven by the conformance
# run on both loops in tests/test_remote_client.py; the fusion endpoint is the server's.
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fusion_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fusion")


@pytest.fixture(scope="module")
def server(fusion_dir: Path) -> Iterator[Server]:
    with serving(fusion_dir / "main") as started:
        yield started


def keyed(server: Server, key: str = ALICE) -> str:
    """The server's URL with the key in its userinfo, as a SandboxFusion user sets it."""
    scheme, _, rest = server.url.partition("://")
    return f"{scheme}://fusion:{key}@{rest}"


@pytest.fixture
def endpoint(server: Server) -> Iterator[str]:
    """The fusion client pointed at the server (its module-level setting), key in the URL."""
    url = keyed(server)
    sf.set_sandbox_endpoint(url)
    try:
        yield url
    finally:
        sf.set_sandbox_endpoint("")


COMPILE = 60
"""The compile timeout of the tests' C++ programs: under CI's load, g++ took longer than
SandboxFusion's default of 10 s."""


def run(request: RunCodeRequest) -> RunCodeResponse:
    """The real client's ``run_code`` (one attempt: a failure shows, not a retry)."""
    response: RunCodeResponse = sf.run_code(request, max_attempts=1, client_timeout=120)
    return response


def wait_until_started(root: Path | None, marker: str = "started") -> str:
    """Wait until a program in a sandbox under ``root`` wrote its ``marker`` file; the
    sandbox's id. (Other sandboxes may be there: ended requests' ones, reset, ready.)"""
    assert root is not None
    eventually(lambda: any(root.glob(f"*/fs/**/{marker}")), within=30)
    return next(root.glob(f"*/fs/**/{marker}")).relative_to(root).parts[0]
