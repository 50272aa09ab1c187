"""``CodeAgent(executor=SandboxExecutor(sandbox))``: the agent's code, in a sandbox.

smolagents' remote executors share one protocol (``RemotePythonExecutor``): each code step
goes to :meth:`SandboxExecutor.run_code_raise_errors`, which answers a ``CodeOutput``
(``output``, ``logs``, ``is_final_answer``) or raises ``AgentError``; the base class sends
the tools as source code and the variables as JSON through the same method, and patches
``final_answer`` to raise a ``FinalAnswerException`` carrying the serialised answer,
recognised here by its name, as E2B's executor recognises it.

The code runs in the stateful interpreter of an asyncsandbox sandbox
(:meth:`asyncsandbox.sync.SyncSandbox.run_code`): variables, imports and tools persist from
one step to the next. smolagents is synchronous: the blocking facade (one event loop in a
background thread, driving the async API) carries each call.
"""

from __future__ import annotations

import ast
import contextlib
import io
from collections.abc import Iterator, Sequence
from typing import Any

import PIL.Image
from smolagents import AgentError, AgentLogger, LogLevel
from smolagents.local_python_executor import CodeOutput
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.serialization import SafeSerializer
from smolagents.tools import Tool, get_tools_definition_code

from asyncsandbox import ExecTimeout, Execution, InvalidArgument
from asyncsandbox.sync import SyncSandbox

__all__ = ("SandboxExecutor",)

# The main result's formats, in the order E2B's executor takes them (images first, as PIL
# images; then the richest text a notebook would show).
_IMAGE_FORMATS = ("jpeg", "png")
_TEXT_FORMATS = ("html", "javascript", "json", "latex", "markdown", "pdf", "svg", "text")


class SandboxExecutor(RemotePythonExecutor):  # type: ignore[misc]  # smolagents is untyped
    """A smolagents ``CodeAgent`` executor running the agent's code in ``sandbox``::

        with SyncSession() as session:
            agent = CodeAgent(tools=[...], model=model, executor=SandboxExecutor(session.sandbox()))
            with agent:  # cleanup() on exit: the sandbox is removed
                agent.run("...")

    The executor owns the sandbox: it starts it (blocking) if it was not, and
    :meth:`cleanup` removes it. The code of each step runs in the sandbox's default code
    context.

    :param sandbox: where the code runs.
    :param additional_imports: packages the code needs: those the sandbox lacks are
        ``pip install``-ed first (which needs pip, a writable environment and the network);
        ``AgentError`` if that fails.
    :param logger: smolagents' logger (default: one at ``LogLevel.INFO``).
    :param allow_pickle: let the final answer and the variables travel as pickles when JSON
        cannot carry them (smolagents' own flag; unpickling runs code: trusted sandboxes
        only).
    :param timeout: seconds a step's code may run before it is interrupted (an error the
        model is told about; the variables stay); ``None``: no limit.
    :param setup_timeout: seconds each part of the executor's own setup may take (the
        interpreter's start with the first call, finding and installing packages, defining
        the tools and setting the variables, again after a restart); ``None``: no limit.
    :param max_output_bytes: output kept per stream, and for the results, of one step.
    """

    def __init__(
        self,
        sandbox: SyncSandbox,
        *,
        additional_imports: Sequence[str] = (),
        logger: AgentLogger | None = None,
        allow_pickle: bool = False,
        timeout: float | None = 60.0,
        setup_timeout: float | None = 300.0,
        max_output_bytes: int = 1024 * 1024,
    ) -> None:
        for name, value in (("timeout", timeout), ("setup_timeout", setup_timeout)):
            if value is not None and not value > 0:
                raise InvalidArgument(f"{name} must be > 0 or None, got {value!r}")
        super().__init__(
            list(additional_imports), logger or AgentLogger(LogLevel.INFO), allow_pickle
        )
        self.sandbox = sandbox
        """The sandbox the code runs in (removed by :meth:`cleanup`)."""
        self.timeout = timeout
        """Seconds a step's code may run (``None``: no limit)."""
        self.setup_timeout = setup_timeout
        """Seconds each part of the executor's own setup may take (``None``: no limit)."""
        self._setting_up = False  # calls run under setup_timeout meanwhile, else timeout
        self._max_output_bytes = max_output_bytes
        self._tools: dict[str, Tool] = {}
        self._variables: dict[str, Any] = {}
        try:
            sandbox.start().result()
            self._install(list(additional_imports), required=True)
        except BaseException:
            # The executor owns the sandbox, and no executor comes out of here to clean it
            # up: remove it (shielded, bounded by the session's Timeouts.remove) before the
            # error propagates; that error is the one to see, a failed removal is logged.
            removal = sandbox.stop().exception()
            if removal is not None:
                self.logger.log_error(f"removing the sandbox failed too: {removal!r}")
            raise
        self.installed_packages = list(additional_imports)

    @contextlib.contextmanager
    def _setup(self) -> Iterator[None]:
        """Calls made meanwhile are the executor's own: they run under
        :attr:`setup_timeout`."""
        before, self._setting_up = self._setting_up, True
        try:
            yield
        finally:
            self._setting_up = before

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run ``code`` in the sandbox's interpreter: its main result (an image as a
        ``PIL.Image``, else its richest text) and its stdout, or the final answer.

        Raises ``AgentError`` when the code raised (the variables stay), ran past
        :attr:`timeout` (:attr:`setup_timeout` for the executor's own code), or its
        interpreter died; an infrastructure failure (the sandbox
        is gone, the backend unreachable) is raised as asyncsandbox's
        :class:`~asyncsandbox.InfrastructureError` (the agent reports either to the model).
        """
        limit = self.setup_timeout if self._setting_up else self.timeout
        handle = self.sandbox.run_code(code, timeout=limit, max_output_bytes=self._max_output_bytes)
        try:
            execution = handle.result()
        except ExecTimeout as exc:
            partial = exc.execution or Execution()  # run_code's timeouts always carry it
            raise AgentError(
                f"{_stdout(partial)}\nExecuting code yielded an error:\nthe code ran past its "
                f"timeout of {limit:g} s and was interrupted\n{_error_text(partial)}"
                f"{self._after_restart(partial)}",
                self.logger,
            ) from exc
        logs = _stdout(execution)
        error = execution.error
        restart_note = self._after_restart(execution)
        if error is not None:
            if error.name == RemotePythonExecutor.FINAL_ANSWER_EXCEPTION:
                # The patched final_answer's encoding is SafeSerializer's ("safe:" JSON, or
                # "pickle:" only when allowed).
                answer = SafeSerializer.loads(error.value, allow_pickle=self.allow_pickle)
                return CodeOutput(output=answer, logs=logs, is_final_answer=True)
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{_error_text(execution)}{restart_note}",
                self.logger,
            )
        return CodeOutput(
            output=_main_result(execution), logs=logs + restart_note, is_final_answer=False
        )

    def send_tools(self, tools: dict[str, Tool]) -> None:
        """Define the tools in the sandbox's interpreter (smolagents' own code: their source,
        ``final_answer`` patched to raise the answer), installing their requirements first;
        kept to define them again if the interpreter is restarted."""
        with self._setup():
            super().send_tools(tools)
        self._tools = dict(tools)

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Set the variables in the sandbox's interpreter (as JSON, or pickles if
        allowed); kept to set them again if the interpreter is restarted."""
        with self._setup():
            super().send_variables(variables)
        self._variables = dict(variables)

    def _after_restart(self, execution: Execution) -> str:
        """If the call's interpreter is a new one (the code killed it, or it ignored an
        interrupt and was killed), define the tools and variables again: the agent goes on
        with them, as it would after a plain error. What the model should know, or ``""``."""
        if not execution.restarted:
            return ""
        with self._setup():
            if self._variables:
                super().send_variables(self._variables)
            if self._tools:
                self.run_code_raise_errors(get_tools_definition_code(self._tools))
        return (
            "\n(The interpreter was restarted: the variables and imports of earlier steps are "
            "gone; the tools are defined again.)"
        )

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """``pip install`` those of the packages the sandbox lacks; the packages.

        For the tools' requirements (``send_tools``), a failure is logged and the run goes on,
        as E2B's ``!pip install`` goes on: smolagents lists optional imports too (its
        patched ``final_answer`` names numpy and Pillow, imported only if there), and a
        missing one fails the step that needs it, told to the model.
        """
        self._install(additional_imports, required=False)
        return additional_imports

    def _install(self, packages: list[str], *, required: bool) -> None:
        if not packages:
            return
        missing = self._missing(packages)
        if not missing:
            return
        argv = ["python3", "-m", "pip", "install", "--quiet", *missing]
        result = self.sandbox.exec(argv, timeout=self.setup_timeout).result()
        if result.returncode == 0:
            self.logger.log(result.stdout_text)
            return
        message = (
            f"installing {' '.join(missing)} in the sandbox failed (pip exited with "
            f"{result.returncode}):\n{result.stdout_text}{result.stderr_text}"
        )
        if required:
            raise AgentError(message, self.logger)
        self.logger.log_error(message)

    def _missing(self, packages: list[str]) -> list[str]:
        """The packages that are neither an installed distribution nor an importable
        module of the sandbox's interpreter (smolagents names modules, pip distributions)."""
        code = (
            "import importlib.metadata as _m, importlib.util as _u\n"
            "def _present(name):\n"
            "    try:\n"
            "        _m.distribution(name)\n"
            "        return True\n"
            "    except _m.PackageNotFoundError:\n"
            "        return _u.find_spec(name) is not None\n"
            f"[_p for _p in {packages!r} if not _present(_p)]"
        )
        execution = self.sandbox.run_code(code, timeout=self.setup_timeout).result()
        if execution.error is not None or execution.text is None:
            return packages  # pip will say what is wrong
        missing: list[str] = ast.literal_eval(execution.text)
        return missing

    def cleanup(self) -> None:
        """Remove the sandbox (blocking; idempotent). ``CodeAgent.cleanup()`` and leaving
        ``with agent:`` call it."""
        self.logger.log("Removing the sandbox...", level=LogLevel.INFO)
        self.sandbox.stop().result()


def _stdout(execution: Execution) -> str:
    return "".join(execution.logs.stdout)


def _error_text(execution: Execution) -> str:
    error = execution.error
    if error is None:
        return ""
    return f"{error.name}\n{error.value}\n{error.traceback}"


def _main_result(execution: Execution) -> Any:
    for result in execution.results:
        if not result.is_main_result:
            continue
        for name in _IMAGE_FORMATS:
            data = getattr(result, name)
            if data is not None:
                return PIL.Image.open(io.BytesIO(data))
        for name in _TEXT_FORMATS:
            data = getattr(result, name)
            if data is not None:
                return data
    return None
