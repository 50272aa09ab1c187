"""What ``/run_code`` gives a program, on a REAL server (tests/_fusion_support.py): its
output is its own (nothing written after it ended), its files go in and are fetched out,
and verl's ``memory_limit_MB`` is its sandbox's memory limit.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
import requests
from sandbox_fusion import RunCodeRequest, RunStatus

from . import _fusion_support as fusion
from ._fusion_support import COMPILE, keyed, run
from ._support import Server

# The fusion family's fixtures (tests/_fusion_support.py), this module's by name.
fusion_dir = fusion.fusion_dir
server = fusion.server
endpoint = fusion.endpoint


LEAVES_AN_ANSWER = """\
import os, sys
a, b = map(int, sys.stdin.read().split())
parent = os.getpid()
if os.fork() == 0:
    while os.getppid() == parent:  # the moment the program has exited
        pass
    os.write(1, b"%d\\n" % (a + b))
    os._exit(0)
os._exit(0)
"""


@pytest.mark.usefixtures("endpoint")
def test_the_output_is_the_programs_own() -> None:
    """A program that exits at once, leaving a process that prints the answer the moment
    it is gone (a reward hack against a verl-style `stdout == expected` reward): nothing
    written after the program ended is its output. Failed on the old /run_code (an exec)
    in about half the requests."""
    for n in range(12):
        answer = run(RunCodeRequest(code=LEAVES_AN_ANSWER, language="python", stdin=f"{n} 1\n"))
        assert answer.status == RunStatus.Success, answer
        assert answer.run_result is not None
        assert answer.run_result.stdout == "", (n, answer.run_result)


@pytest.mark.usefixtures("endpoint")
@pytest.mark.parametrize("language", ["python", "cpp"])
def test_files_in_and_fetch_files_out(language: str) -> None:
    data = bytes(range(256)) * 3  # not UTF-8
    code = {
        "python": (
            "import helper\n"
            "data = open('in/data.bin', 'rb').read()\n"
            "open('out.bin', 'wb').write(data[::-1])\n"
            "print(helper.VALUE, len(data))\n"
        ),
        "cpp": (
            '#include <fstream>\n#include <iostream>\n#include <iterator>\n#include "helper.h"\n'
            'int main() { std::ifstream in("in/data.bin", std::ios::binary);\n'
            "  std::string d((std::istreambuf_iterator<char>(in)), {});\n"
            '  std::ofstream out("out.bin", std::ios::binary);\n'
            "  out << std::string(d.rbegin(), d.rend());\n"
            '  std::cout << VALUE << " " << d.size() << std::endl; }\n'
        ),
    }[language]
    helper = {"python": b"VALUE = 'seven'\n", "cpp": b'#define VALUE "seven"\n'}[language]
    response = run(
        RunCodeRequest(
            code=code,
            language=language,
            files={
                "in/data.bin": base64.b64encode(data).decode(),
                "helper.py" if language == "python" else "helper.h": base64.b64encode(
                    helper
                ).decode(),
            },
            fetch_files=["out.bin", "missing.txt", "in/data.bin"],
            compile_timeout=COMPILE,
        )
    )
    assert response.status == RunStatus.Success, response
    assert response.run_result is not None
    assert response.run_result.stdout == f"seven {len(data)}\n"
    assert set(response.files) == {"out.bin", "in/data.bin"}  # the missing one left out
    assert base64.b64decode(response.files["out.bin"]) == data[::-1]
    assert base64.b64decode(response.files["in/data.bin"]) == data


@pytest.mark.skipif(os.geteuid() != 0, reason="memory limits need cgroups, which need root")
def test_memory_limit(server: Server) -> None:
    """verl sends memory_limit_MB (the client's model lacks it): the sandbox's limit."""
    hog = "x = bytearray({mb} * 1024 * 1024)\nprint(len(x) // (1024 * 1024))\n"

    def post(limit: int, mb: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "code": hog.format(mb=mb),
            "language": "python",
            "memory_limit_MB": limit,
        }
        response = requests.post(f"{keyed(server)}/run_code", json=payload, timeout=120)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    over = post(64, 300)
    assert over["status"] == "Failed", over
    assert over["run_result"]["status"] == "Finished"
    assert over["run_result"]["return_code"] == 137  # OOM-killed, as on Docker
    under = post(512, 300)  # the same program fits a larger limit
    assert under["status"] == "Success", under
    assert under["run_result"]["stdout"] == "300\n"
