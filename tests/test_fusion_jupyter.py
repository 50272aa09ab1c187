"""SandboxFusion's ``/run_jupyter`` on a REAL server (tests/_fusion_support.py), driven by
the real ``sandbox_fusion`` client (sync and async): the cells run in one kernel, and a
cell's and the run's timeouts.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import sandbox_fusion as sf
from sandbox_fusion import CommandRunStatus, RunStatus

from . import _fusion_support as fusion
from ._fusion_support import keyed
from ._support import Server

# The fusion family's fixtures (tests/_fusion_support.py), this module's by name.
anyio_backend = fusion.anyio_backend
fusion_dir = fusion.fusion_dir
server = fusion.server


def run_jupyter(server: Server, **request: Any) -> sf.RunJupyterResponse:
    """The real client's ``run_jupyter`` (one attempt: a failure shows, not a retry)."""
    response: sf.RunJupyterResponse = sf.run_jupyter(
        sf.RunJupyterRequest(**request), keyed(server), max_attempts=1, client_timeout=120
    )
    return response


def test_run_jupyter_runs_the_cells_in_one_kernel(server: Server) -> None:
    """SandboxFusion's own example cells (its RunJupyterRequest's), then more: state
    carries over, every cell runs after one that raised, files go in and come out."""
    cells = [
        "a = 123",
        "a",
        "print(a)",
        'import sys; sys.stderr.write("stderr message")',
        'raise RuntimeError("error message")',
        "open('out.txt', 'w').write(open('in.txt').read().upper()); a + 1",
        (
            "class Rich:\n    def _repr_html_(self): return '<b>x</b>'\n"
            "    def _repr_png_(self): return b'png-bytes'\n"
            "    def __repr__(self): return 'Rich()'\n"
            "display(Rich())\nRich()"
        ),
        "x = 1;",
    ]
    response = run_jupyter(
        server,
        cells=cells,
        files={"in.txt": base64.b64encode(b"hello").decode()},
        fetch_files=["out.txt", "missing.txt"],
    )
    assert response.status == RunStatus.Success, response.message
    assert response.driver is not None
    assert response.driver.status == CommandRunStatus.Finished
    assert response.driver.return_code == 0
    assert len(response.cells) == len(cells)
    assign, show, printed, stderr, raised, files, rich, quiet = response.cells
    assert (assign.stdout, assign.stderr, assign.display, assign.error) == ("", "", [], [])
    assert show.display == [{"text/plain": "123"}]
    assert printed.stdout == "123\n"
    assert printed.display == []
    assert stderr.stderr == "stderr message"
    assert stderr.display == [{"text/plain": "14"}]  # write()'s value, as Jupyter shows it
    (error,) = raised.error
    assert error["ename"] == "RuntimeError"
    assert error["evalue"] == "error message"
    assert isinstance(error["traceback"], list)
    assert any("RuntimeError" in line for line in error["traceback"])
    assert files.display == [{"text/plain": "124"}]
    png = base64.b64encode(b"png-bytes").decode()
    expected = {
        "text/plain": "Rich()",
        "text/html": "<b>x</b>",
        "image/png": png,
    }
    assert rich.display == [expected, expected]
    assert quiet.display == []
    assert response.files == {"out.txt": base64.b64encode(b"HELLO").decode()}


def test_run_jupyter_timeouts(server: Server) -> None:
    """A cell past cell_timeout is interrupted (KeyboardInterrupt, as a notebook's
    interrupt) and the next runs; past total_timeout the run is Failed, as SandboxFusion
    answers its killed driver."""
    response = run_jupyter(
        server,
        cells=["kept = 1", "import time\ntime.sleep(60)", "kept + 1"],
        cell_timeout=1,
        total_timeout=60,
    )
    assert response.status == RunStatus.Success, response.message
    slept = response.cells[1]
    assert [e["ename"] for e in slept.error] == ["KeyboardInterrupt"]
    assert response.cells[2].display == [{"text/plain": "2"}]
    response = run_jupyter(server, cells=["1", "import time\ntime.sleep(60)"], total_timeout=2)
    assert response.status == RunStatus.Failed
    assert response.driver is not None
    assert response.driver.status == CommandRunStatus.TimeLimitExceeded
    assert response.cells == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiohttp runs on asyncio only
async def test_run_jupyter_async_client(server: Server) -> None:
    request = sf.RunJupyterRequest(cells=["import os", "os.getcwd() != ''"])
    response = await sf.run_jupyter_async(request, keyed(server), max_attempts=1)
    assert response.status == RunStatus.Success, response.message
    assert response.cells[1].display == [{"text/plain": "True"}]
