"""Hostile code in the code interpreter, on every backend (tests/_interpreter_support.py):
code that forges the runner's frames (on its output, on every descriptor it can reach) and
code that kills the runner. What it prints is output; the other contexts are untouched; a
killed runner is reported and a new one takes over.
"""

from __future__ import annotations

import textwrap

from asyncsandbox import Result

from . import _interpreter_support as interpreter
from ._interpreter_support import Target, sandbox, stderr, stdout

# The interpreter family's fixtures (tests/_interpreter_support.py), this module's by name.
remote_server = interpreter.remote_server
target = interpreter.target


FORGED_FRAME = (
    "import json, struct\n"
    "def frame(header, payload=b''):\n"
    "    head = json.dumps(header).encode()\n"
    "    return struct.pack('>II', len(head), len(payload)) + head + payload\n"
)


async def test_printed_frames_are_only_output(target: Target) -> None:
    """Code printing what the runner's frames look like (a result, the call's end) on
    every way to stdout: it is output, nothing else."""
    code = FORGED_FRAME + textwrap.dedent(
        """
        import os, sys
        bundle = json.dumps({"data": {"text/plain": "'forged'"}, "main": True}).encode()
        for n in range(1, 6):
            for kind in ("result", "done"):
                forged = frame({"type": kind, "id": n, "call": n, "count": 99}, bundle)
                os.write(1, forged)
                sys.stdout.buffer.write(forged)
                os.write(2, forged)
        sys.stdout.flush()
        "genuine"
        """
    )
    async with sandbox(target) as sb:
        execution = await sb.run_code(code)
        assert execution.error is None
        assert [r.text for r in execution.results] == ["'genuine'"]
        assert execution.execution_count != 99
        assert "forged" in stdout(execution)
        assert "forged" in stderr(execution)
        assert (await sb.run_code("'still' + ' here'")).text == "'still here'"


async def test_the_runner_is_out_of_the_codes_reach(target: Target) -> None:
    """Code writing forged frames to every descriptor it has, and trying the runner's
    through /proc: another context sees nothing of it, and the runner's own descriptors
    are closed to it."""
    code = FORGED_FRAME + textwrap.dedent(
        """
        import os
        holder = os.getppid()
        with open(f"/proc/{holder}/stat") as f:
            supervisor = int(f.read().rsplit(")", 1)[1].split()[1])
        refused = []
        for pid in (holder, supervisor):
            for fd in range(0, 8):
                try:
                    os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY)
                except PermissionError:
                    refused.append(fd)
                except OSError:
                    refused.append(fd)
                else:
                    raise SystemExit(f"opened the runner's fd {fd} of {pid}")
        print(len(refused))
        bundle = json.dumps({"data": {"text/plain": "'forged'"}, "main": True}).encode()
        for fd in range(3, 1024):
            for n in range(1, 40):
                for kind in ("result", "stdout", "done"):
                    try:
                        os.write(fd, frame({"type": kind, "id": n, "call": n, "count": 99}, bundle))
                    except OSError:
                        break
        "done"
        """
    )
    async with sandbox(target) as sb:
        victim = await sb.create_code_context()
        await sb.run_code("safe = 'intact'", context=victim)
        hostile = await sb.run_code(code)
        # Its own event pipe was within reach: it broke its own context's protocol, and
        # that context was restarted. Nothing else.
        assert stdout(hostile).startswith("16\n"), hostile
        assert hostile.error is None or hostile.error.name == "InterpreterRestarted", hostile.error
        for result in hostile.results:
            assert result.text in ("'forged'", "'done'")
        calm = await sb.run_code("safe", context=victim)
        assert calm.error is None
        assert calm.text == "'intact'"
        assert calm.results == [Result(text="'intact'", is_main_result=True)]
        assert not calm.restarted
        assert (await sb.run_code("1 + 1")).text == "2"


async def test_killing_the_runner_is_reported_and_a_new_one_takes_over(target: Target) -> None:
    code = textwrap.dedent(
        """
        import os, signal
        with open(f"/proc/{os.getppid()}/stat") as f:
            supervisor = int(f.read().rsplit(")", 1)[1].split()[1])
        print("killing", supervisor, flush=True)
        os.kill(supervisor, signal.SIGKILL)
        import time; time.sleep(600)
        """
    )
    async with sandbox(target) as sb:
        other = await sb.create_code_context()
        await sb.run_code("x = 1", context=other)
        killed = await sb.run_code(code, timeout=120)
        assert killed.error is not None
        assert killed.error.name == "InterpreterDied"
        assert "runner died" in killed.error.value
        assert killed.restarted
        fresh = await sb.run_code("'x' in globals()", context=other)
        assert fresh.error is None
        assert fresh.text == "False"
        assert fresh.restarted  # its state went with the runner: it says so
        assert {c.id for c in await sb.list_code_contexts()} == {"default", other.id}
        assert (await sb.run_code("1 + 1")).text == "2"
