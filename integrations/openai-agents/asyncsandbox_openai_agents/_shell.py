"""``ShellTool(executor=SandboxShell(sandbox))``: the model's shell calls, in a sandbox.

The SDK hands the executor a ``ShellCommandRequest`` (its ``data.action``: ``commands``,
``timeout_ms``, ``max_output_length``) and takes back a ``ShellResult``: one
``ShellCommandOutput`` per command, each with its own outcome, in the SDK's terms:

* ``exit`` with the exit code: a non-zero exit is the command's result, not an error;
* ``timeout``: the command ran past ``timeout_ms`` (or the executor's default) and was
  killed with everything it started; its output so far is kept; the next commands run;
* an infrastructure failure (the sandbox died or was removed, the backend is unreachable)
  is raised, as the :class:`~asyncsandbox.InfrastructureError` it is: the SDK reports the
  call as ``failed`` with its message, apart from every command outcome above.

Each command runs as ``sh -c COMMAND`` in the sandbox's working directory; files persist
from one call to the next (the sandbox's), shell state (``cd``, variables) does not.
"""

from __future__ import annotations

from agents import ShellCallOutcome, ShellCommandOutput, ShellCommandRequest, ShellResult

from asyncsandbox import ExecResult, ExecTimeout, InvalidArgument, Sandbox

__all__ = ("SandboxShell",)


class SandboxShell:
    """The executor of an Agents SDK ``ShellTool``, running commands in ``sandbox``.

    :param sandbox: where commands run; started on first use if it was not. The executor
        never stops it.
    :param timeout: seconds a command may run when the call gives no ``timeout_ms``.
    :param max_output_bytes: output kept per stream and command (head and tail beyond it);
        the call's ``max_output_length`` is applied by the SDK on top.
    """

    def __init__(
        self, sandbox: Sandbox, *, timeout: float = 60.0, max_output_bytes: int = 1024 * 1024
    ) -> None:
        if not timeout > 0:
            raise InvalidArgument(f"timeout must be > 0, got {timeout!r}")
        self.sandbox = sandbox
        """The sandbox commands run in."""
        self.timeout = timeout
        """Seconds a command may run when the call says nothing."""
        self._max_output_bytes = max_output_bytes

    async def __call__(self, request: ShellCommandRequest) -> ShellResult:
        """Run the call's commands one after the other; their outputs and outcomes.

        Cancellation: the running command is killed before the cancellation propagates;
        the remaining commands do not run.
        """
        action = request.data.action
        timeout = self.timeout if action.timeout_ms is None else action.timeout_ms / 1000
        outputs = []
        for command in action.commands:
            try:
                result = await self.sandbox.exec(
                    ["sh", "-c", command],
                    timeout=timeout,
                    max_output_bytes=self._max_output_bytes,
                )
            except ExecTimeout as exc:
                outcome = ShellCallOutcome(type="timeout")
                outputs.append(_output(command, exc.result, outcome))
            else:
                outcome = ShellCallOutcome(type="exit", exit_code=result.returncode)
                outputs.append(_output(command, result, outcome))
        return ShellResult(output=outputs, max_output_length=action.max_output_length)


def _output(command: str, result: ExecResult, outcome: ShellCallOutcome) -> ShellCommandOutput:
    return ShellCommandOutput(
        stdout=result.stdout_text, stderr=result.stderr_text, outcome=outcome, command=command
    )
