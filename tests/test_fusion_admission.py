"""What ``/run_code`` lets in, on a REAL server (tests/_fusion_support.py): the API key
(in the URL, as Bearer, as Basic; the real client's own error without it), clear errors
for requests that cannot run and for SandboxFusion's routes not offered, and the tenant's
quota of live sandboxes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import requests
import sandbox_fusion as sf
from sandbox_fusion import RunCodeRequest

from . import _fusion_support as fusion
from ._fusion_support import keyed, wait_until_started
from ._support import ALICE, Server, serving

# The fusion family's fixtures (tests/_fusion_support.py), this module's by name.
fusion_dir = fusion.fusion_dir
server = fusion.server


# -- auth, errors -------------------------------------------------------------------------


def test_auth(server: Server) -> None:
    payload = {"code": "print(1)", "language": "python"}
    no_key = requests.post(f"{server.url}/run_code", json=payload, timeout=60)
    assert no_key.status_code == 401
    assert no_key.json()["error"]["code"] == "unauthorized"
    for wrong in ("not-a-key-of-anyone-at-all", ALICE[:-1], ""):
        answer = requests.post(f"{keyed(server, wrong)}/run_code", json=payload, timeout=60)
        assert answer.status_code == 401, wrong
        bearer = requests.post(
            f"{server.url}/run_code",
            json=payload,
            headers={"Authorization": f"Bearer {wrong}"},
            timeout=60,
        )
        assert bearer.status_code == 401, wrong
    with pytest.raises(Exception, match="401"):  # the client's own error for it
        sf.run_code(RunCodeRequest(code="print(1)", language="python"), server.url, 1)
    bearer = requests.post(
        f"{server.url}/run_code",
        json=payload,
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=60,
    )
    assert bearer.status_code == 200
    assert bearer.json()["run_result"]["stdout"] == "1\n"
    basic = requests.post(f"{server.url}/run_code", json=payload, auth=("x", ALICE), timeout=60)
    assert basic.json()["run_result"]["stdout"] == "1\n"
    # The key in the URL also opens our own API (the same auth).
    info = requests.get(f"{keyed(server)}/v1/info", timeout=60)
    assert info.json()["tenant"] == "alice"


def test_requests_that_cannot_run_get_clear_errors(server: Server) -> None:
    url = f"{keyed(server)}/run_code"
    for language in ("cobol", "fortran"):
        answer = requests.post(url, json={"code": "", "language": language}, timeout=60)
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert "bash, c, c++, cpp, java, javascript, nodejs, perl, python" in message
    bodies: list[dict[str, Any]] = [
        {"language": "python"},  # no code
        {"code": "print(1)", "language": "python", "files": {"a": "%%% not base64"}},
        {"code": "print(1)", "language": "python", "run_timeout": -1},
        {"code": "print(1)", "language": "python", "files": {"../../etc/x": "eA=="}},
    ]
    for body in bodies:
        answer = requests.post(url, json=body, timeout=60)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.headers["content-type"] == "application/json"
    for path in ("/get_prompts", "/submit", "/get_prompt_by_id"):
        answer = requests.post(f"{keyed(server)}{path}", json={}, timeout=60)
        assert answer.status_code == 501, (path, answer.text)
        assert answer.json()["error"]["code"] == "not_supported"
        assert "/run_code" in answer.json()["error"]["message"]
    jupyter = f"{keyed(server)}/run_jupyter"
    jupyter_bodies: list[dict[str, Any]] = [
        {"cells": ["1"], "kernel": "ir"},
        {"cells": "1"},
        {"cells": ["1"], "total_timeout": 0},
        {"cells": ["1"], "files": {"a": "%%% not base64"}},
    ]
    for body in jupyter_bodies:
        answer = requests.post(jupyter, json=body, timeout=60)
        assert answer.status_code == 400, (body, answer.text)


# -- quotas ---------------------------------------------------------------------------------


def test_quotas_apply(fusion_dir: Path) -> None:
    """A /run_code request holds one of the tenant's max_live sandboxes while it runs."""
    with serving(fusion_dir / "quota", "--max-live-per-tenant", "1") as server:
        root = server.root
        assert root is not None
        url = f"{keyed(server)}/run_code"
        # Runs until the test lets it end (it creates ``release`` beside ``started``).
        held = "touch started; while [ ! -e release ]; do sleep 0.05; done; echo done"
        slow = {"code": held, "language": "bash"}
        answers: list[requests.Response] = []
        thread = threading.Thread(
            target=lambda: answers.append(requests.post(url, json=slow, timeout=60))
        )
        thread.start()
        try:
            wait_until_started(root)
            refused = requests.post(url, json={"code": "echo", "language": "bash"}, timeout=60)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "quota_exceeded"
        finally:
            for started in root.glob("*/fs/**/started"):
                (started.parent / "release").touch()
            thread.join(60)
        assert answers[0].json()["run_result"]["stdout"] == "done\n"
        again = requests.post(url, json={"code": "echo again", "language": "bash"}, timeout=60)
        assert again.json()["run_result"]["stdout"] == "again\n"  # the slot came back
