"""The code interpreter (``Sandbox.run_code``): the result types (``_models``), the runner
shipped into the sandbox (``_runner``) and the host side that drives it (``_engine``,
imported by the runtime where it is needed)."""

from ._models import (
    CodeContext as CodeContext,
    CodeEvent as CodeEvent,
    CodeRequest as CodeRequest,
    Execution as Execution,
    ExecutionError as ExecutionError,
    Logs as Logs,
    OutputMessage as OutputMessage,
    Result as Result,
)

__all__ = (
    "CodeContext",
    "CodeEvent",
    "CodeRequest",
    "Execution",
    "ExecutionError",
    "Logs",
    "OutputMessage",
    "Result",
)
